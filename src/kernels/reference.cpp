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

// Integer dot of one 32-value sub-block: weights given as small ints.
inline int32_t isum32(const int8_t* w, const int8_t* q) {
  int32_t s = 0;
  for (int i = 0; i < 32; ++i) s += static_cast<int32_t>(w[i]) * q[i];
  return s;
}

// Decodes block `b` of a quantized row into integer weights wi[] (block_elems
// values) and returns its scale.
inline float decode_block_int(Format f, const uint8_t* row, int64_t b, int8_t* wi) {
  switch (f) {
    case Format::kQ8_0: {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      std::memcpy(wi, blk->qs, 32);
      return load_fp16(blk->d);
    }
    case Format::kQ1_0: {
      const auto* blk = reinterpret_cast<const BlockQ1_0*>(row) + b;
      for (int j = 0; j < 128; ++j) wi[j] = ((blk->qs[j / 8] >> (j % 8)) & 1) ? 1 : -1;
      return load_fp16(blk->d);
    }
    case Format::kQ2_0: {
      const auto* blk = reinterpret_cast<const BlockQ2_0*>(row) + b;
      for (int j = 0; j < 64; ++j) {
        wi[j] = static_cast<int8_t>(q2_code_value((blk->qs[j / 4] >> (2 * (j % 4))) & 3, false));
      }
      return load_fp16(blk->d);
    }
    case Format::kQ2_0G128D: {
      const auto* blk = reinterpret_cast<const BlockQ2_0G128D*>(row) + b;
      for (int j = 0; j < 128; ++j) {
        wi[j] = static_cast<int8_t>(q2_code_value((blk->qs[j / 4] >> (2 * (j % 4))) & 3, true));
      }
      return load_fp16(blk->d);
    }
    case Format::kQ2_0G128Qs: {
      const auto* blk = reinterpret_cast<const BlockQ2_0G128Qs*>(row) + b;
      for (int j = 0; j < 128; ++j) {
        wi[j] = static_cast<int8_t>(q2_code_value((blk->qs[j / 4] >> (2 * (j % 4))) & 3, true));
      }
      return load_fp16(blk->d);
    }
    default:
      return 0.0f;
  }
}

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

void rows_ref(const MatrixView& w, const float* x, const QuantAct* a, int64_t n, float* y,
              int64_t r0, int64_t r1) {
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
  const int64_t be = block_elems(f);
  const int64_t nb = cols / be;
  const int64_t nsub = be / kQ8_0Elems;
  // Sub-blocks summed before each multiply by the weight scale: a whole
  // block, except that the g128 Q2_0 layouts are summed per 64-weight half
  // (two sub-blocks), exactly as two consecutive g64 blocks with the same d,
  // so that a g128 matrix gives bit-identical results to its g64 twin.
  const int64_t group = (f == Format::kQ2_0G128D || f == Format::kQ2_0G128Qs) ? 2 : nsub;
  int8_t wi[128];
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride;
    for (int64_t j = 0; j < n; ++j) {
      const int8_t* qj = a->q + j * cols;
      const float* dj = a->d + j * (cols / kQ8_0Elems);
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const float dw = decode_block_int(f, row, b, wi);
        for (int64_t k0 = 0; k0 < nsub; k0 += group) {
          float bs = 0.0f;
          for (int64_t k = k0; k < k0 + group; ++k) {
            const int64_t s = b * nsub + k;
            bs += dj[s] * static_cast<float>(isum32(wi + k * 32, qj + s * 32));
          }
          acc += dw * bs;
        }
      }
      y[j * w.rows + r] = acc;
    }
  }
}

const TierOps* reference_ops() {
  static const TierOps ops{prepare_ref,     rows_ref,     dot_f32_ref,   dot_f16_f32_ref,
                           axpy_f32_ref,    axpy_f16_ref, f32_to_f16_ref};
  return &ops;
}

}  // namespace bonsai::kernels::detail
