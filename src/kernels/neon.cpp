// NEON tier (arm64 Advanced SIMD, baseline ARMv8.0: no dotprod needed).
// Straightforward vectorisation of the reference scheme (internal.h) with
// activations in natural order: weight bits/codes are expanded to bytes with
// vtst / shifts, the signed int8 products are summed exactly in int16/int32
// per 16-element piece, and scaled in fp32 in internal.h's canonical order
// (bit-identical to the reference; not tuned for speed). Built only on arm64; elsewhere
// this file defines an absent tier.
#include "kernels/internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"

namespace bonsai::kernels::detail {
namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

// Exact sum of w[i] * q[i] over 16 int8 pairs (|w| <= 2, |q| <= 127).
inline int32x4_t dot16(int8x16_t w, int8x16_t q, int32x4_t acc) {
  const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(q));
  const int16x8_t hi = vmull_s8(vget_high_s8(w), vget_high_s8(q));
  return vpadalq_s16(vpadalq_s16(acc, lo), hi);
}

// Weights of elements [16c, 16c+16) of a Q1_0 block as int8 +-1.
inline int8x16_t q1_weights16(const uint8_t* qs, int c) {
  static const uint8_t kBits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t bytes = vcombine_u8(vdup_n_u8(qs[2 * c]), vdup_n_u8(qs[2 * c + 1]));
  const uint8x16_t set = vtstq_u8(bytes, vld1q_u8(kBits));
  return vbslq_s8(set, vdupq_n_s8(1), vdupq_n_s8(-1));
}

// Weights of elements [16c, 16c+16) of a 2-bit-code block as int8 values.
inline int8x16_t q2_weights16(const uint8_t* qs, int c, bool g128) {
  static const int8_t kShift[16] = {0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6};
  static const uint8_t kIdx[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  const uint8x16_t src = vreinterpretq_u8_u32(vdupq_n_u32([&] {
    uint32_t v;
    std::memcpy(&v, qs + 4 * c, 4);
    return v;
  }()));
  const uint8x16_t rep = vqtbl1q_u8(src, vld1q_u8(kIdx));
  const uint8x16_t code = vandq_u8(vshlq_u8(rep, vld1q_s8(kShift)), vdupq_n_u8(3));
  static const int8_t kG64[16] = {-1, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  static const int8_t kG128[16] = {-1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  return vqtbl1q_s8(vld1q_s8(g128 ? kG128 : kG64), code);
}

void rows(const MatrixView& w, const float* x, const QuantAct* a, int64_t n, float* y, int64_t r0, int64_t r1) {
  const Format f = w.format;
  if (f == Format::kF32 || f == Format::kF16 || f == Format::kBF16) {
    rows_ref(w, x, a, n, y, r0, r1);  // float weights: reference path (tier must only compile)
    return;
  }
  const int64_t cols = w.cols;
  const FormatDef& def = format_def(f);  // geometry (formats.h)
  const int64_t be = def.block_elems, bb = static_cast<int64_t>(def.block_bytes);
  const int64_t qs_off = def.qs_offset, d_off = def.d_offset;
  const int64_t nb = cols / be;
  // internal.h's canonical order: chunk c (W weights) adds into lane c % 16,
  // scalar fp32 operations (vfmas_f32-style std::fma), reduce_lanes16 last;
  // bit-identical to the reference. W = 32 (Q1_0), 16 (Q2_0), 4 (Q8_0).
  const int W = static_cast<int>(chunk_elems(f));
  const int per_block = static_cast<int>(be) / W;
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride;
    for (int64_t j = 0; j < n; ++j) {
      const int8_t* q = a->q + j * cols;
      const float* dx = a->d + j * (cols / 32);
      float acc[16] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * bb;
        const uint8_t* qs = blk + qs_off;
        const float dw = half_at(blk + d_off);
        // Exact int32 sums of the block's 16-element pieces.
        int32_t piece[8];
        for (int c = 0; c < static_cast<int>(be) / 16; ++c) {
          int8x16_t wv;
          if (def.family == Family::kSign) {
            wv = q1_weights16(qs, c);
          } else if (def.family == Family::kQ8) {
            wv = vld1q_s8(reinterpret_cast<const int8_t*>(qs) + 16 * c);
          } else {
            wv = q2_weights16(qs, c, def.code3_is_zero);
          }
          piece[c] = vaddvq_s32(dot16(wv, vld1q_s8(q + b * be + 16 * c), vdupq_n_s32(0)));
        }
        for (int k = 0; k < per_block; ++k) {
          const int64_t ch = b * per_block + k;  // chunk index in the row
          int32_t isum = 0;
          if (W == 32) {
            isum = piece[2 * k] + piece[2 * k + 1];
          } else if (W == 16) {
            isum = piece[k];
          } else {  // Q8_0: 4-element chunks
            const int8_t* wq = reinterpret_cast<const int8_t*>(qs) + 4 * k;
            for (int e = 0; e < 4; ++e) isum += static_cast<int32_t>(wq[e]) * q[b * be + 4 * k + e];
          }
          const float dxc = dx[ch * W / 32];
          float& lane = acc[ch % 16];
          if (def.family == Family::kQ8) {
            const float scale = dw * dxc;
            lane = std::fma(static_cast<float>(isum), scale, lane);
          } else {
            const float t = static_cast<float>(isum) * dxc;
            lane = std::fma(t, dw, lane);
          }
        }
      }
      y[j * w.rows + r] = reduce_lanes16(acc);
    }
  }
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float32x4_t s = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) s = vfmaq_f32(s, vld1q_f32(a + i), vld1q_f32(b + i));
  float r = vaddvq_f32(s);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

float dot_f16_f32(const uint16_t* a, const float* b, int64_t n) {
  float32x4_t s = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s = vfmaq_f32(s, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(a + i))), vld1q_f32(b + i));
  }
  float r = vaddvq_f32(s);
  for (; i < n; ++i) r += core::fp16_to_fp32(a[i]) * b[i];
  return r;
}

void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), alpha));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i))), alpha));
  }
  for (; i < n; ++i) y[i] += alpha * core::fp16_to_fp32(x[i]);
}

void f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
  for (; i < n; ++i) dst[i] = core::fp32_to_fp16(src[i]);
}

}  // namespace

const TierOps* neon_ops() {
  // Activation quantization is the reference's (natural order, exact).
  // rows: the float formats through rows_ref, Q8_0 and the 1-/2-bit formats
  // of 16-weight pieces with 2-bit codes or sign bits.
  static const TierOps ops{prepare_ref,
                           rows,
                           dot_f32,
                           dot_f16_f32,
                           axpy_f32,
                           axpy_f16,
                           f32_to_f16,
                           nullptr,
                           nullptr,
                           family_bits(Family::kFloat) | family_bits(Family::kQ8) | family_bits(Family::kSign) |
                               family_bits(Family::kCode2)};
  return &ops;
}

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
const TierOps* neon_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
