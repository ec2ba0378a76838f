// Scalar reference tier: the definition every SIMD tier is tested against.
// Block formats per formats.h; the quantized product scheme per internal.h.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "kernels/formats.h"
#include "kernels/internal.h"

namespace bonsai::kernels::detail {

int8_t round_to_i8(float v) {
  // NaN (from a NaN or infinite input) gives -128, as the SIMD tiers'
  // cvtps2dq "integer indefinite" saturates to; finite inputs give |v| <= 127.
  // (NaN activations are not bit-identical across tiers: the block's amax
  // may or may not see the NaN. They only must not be undefined behaviour.)
  if (!(v == v)) return -128;
  const float r = std::nearbyint(v);
  return static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -128.0f ? -128.0f : r));
}

void quantize_act_ref(const float* x, int64_t cols, int8_t* q, float* d) {
  for (int64_t b = 0; b < cols / kQ8_0Elems; ++b) {
    const float* xb = x + b * kQ8_0Elems;
    float amax = 0.0f;
    for (int j = 0; j < kQ8_0Elems; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int j = 0; j < kQ8_0Elems; ++j) {
      // Round to nearest even, as ggml's SIMD quantize_row_q8_0 (cvtps2dq).
      q[b * kQ8_0Elems + j] = round_to_i8(xb[j] * id);
    }
    d[b] = core::fp16_to_fp32(core::fp32_to_fp16(dd));
  }
}

void prepare_ref(Format /*f*/, const float* x, int64_t n, int64_t cols, QuantAct& a) {
  a.resize(n, cols);
  for (int64_t j = 0; j < n; ++j) {
    quantize_act_ref(x + j * cols, cols, a.q + j * cols, a.d + j * (cols / kQ8_0Elems));
  }
}

namespace {

inline float weight_f(Format f, const uint8_t* row, int64_t c) {
  switch (f) {
    case Format::kF32: {
      float v;
      std::memcpy(&v, row + 4 * c, 4);
      return v;
    }
    case Format::kF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      return core::fp16_to_fp32(h);
    }
    case Format::kBF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      return core::bf16_to_fp32(h);
    }
    default:
      return 0.0f;
  }
}

float dot_f32_ref(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
float dot_f16_f32_ref(const uint16_t* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += core::fp16_to_fp32(a[i]) * b[i];
  return s;
}
void axpy_f32_ref(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
void axpy_f16_ref(float alpha, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * core::fp16_to_fp32(x[i]);
}
void f32_to_f16_ref(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = core::fp32_to_fp16(src[i]);
}

}  // namespace

float reduce_lanes16(const float* acc) {
  float a8[8], a4[4];
  for (int i = 0; i < 8; ++i) a8[i] = acc[i] + acc[i + 8];
  for (int i = 0; i < 4; ++i) a4[i] = a8[i] + a8[i + 4];
  const float a20 = a4[0] + a4[2], a21 = a4[1] + a4[3];
  return a20 + a21;
}

int64_t chunk_elems(Format f) { return format_def(f).chunk_elems; }

void rows_ref(const MatrixView& w, const float* x, const QuantAct* a, int64_t n, float* y, int64_t r0, int64_t r1) {
  const Format f = w.format;
  const int64_t cols = w.cols;
  if (!is_quantized(f)) {
    for (int64_t r = r0; r < r1; ++r) {
      const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride;
      for (int64_t j = 0; j < n; ++j) {
        const float* xj = x + j * cols;
        float s = 0.0f;
        for (int64_t c = 0; c < cols; ++c) s += weight_f(f, row, c) * xj[c];
        y[j * w.rows + r] = s;
      }
    }
    return;
  }
  // The canonical lane order (internal.h, "Canonical order"): chunk c of
  // W consecutive weights adds its exact integer sum into fp32 lane
  // c mod 16; the 16 lanes are summed by reduce_lanes16.
  const FormatDef& def = format_def(f);
  const int64_t be = def.block_elems;
  const int64_t W = def.chunk_elems;
  const int64_t chunks_per_block = be / W;
  const int64_t nb = cols / be;
  int8_t wi[kMaxBlockElems];
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride;
    for (int64_t j = 0; j < n; ++j) {
      const int8_t* qj = a->q + j * cols;
      const float* dj = a->d + j * (cols / kQ8_0Elems);
      float acc[16] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const float dw = def.decode_block(row + static_cast<size_t>(b) * def.block_bytes, wi);
        for (int64_t k = 0; k < chunks_per_block; ++k) {
          const int64_t c = b * chunks_per_block + k;  // chunk index in the row
          int32_t isum = 0;
          for (int64_t e = 0; e < W; ++e) isum += static_cast<int32_t>(wi[k * W + e]) * qj[c * W + e];
          const float dx = dj[c * W / kQ8_0Elems];
          float& lane = acc[c % 16];
          if (def.family == Family::kQ8) {
            const float scale = dw * dx;  // fl(dw * dx)
            lane = std::fma(static_cast<float>(isum), scale, lane);
          } else {
            const float t = static_cast<float>(isum) * dx;  // fl(isum * dx)
            lane = std::fma(t, dw, lane);
          }
        }
      }
      y[j * w.rows + r] = reduce_lanes16(acc);
    }
  }
}

const TierOps* reference_ops() {
  // The definition of every format: the fallback of the other tiers.
  static const TierOps ops{prepare_ref,  rows_ref,       dot_f32_ref, dot_f16_f32_ref, axpy_f32_ref,
                           axpy_f16_ref, f32_to_f16_ref, nullptr,     nullptr,         kAllFormats};
  return &ops;
}

}  // namespace bonsai::kernels::detail
