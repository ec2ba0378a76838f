// Scalar reference of the attention kernels (attention.h): the portable
// per-head step (std::exp, plain loops) and the Q8_0 query quantizer and
// scorer whose bits every tier reproduces. Compiled without ISA flags.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention_internal.h"

namespace bonsai::kernels {

using detail::kAttnNegInf;

void attn_update_ref(float* s, const float* v, int64_t nk, int64_t hd_v, float* state) {
  float mb = kAttnNegInf;
  for (int64_t t = 0; t < nk; ++t) mb = std::max(mb, s[t]);
  const float m_new = std::max(state[0], mb);
  const float corr = std::exp(state[0] - m_new);  // 0 on the first block (m = -inf)
  float l = 0.0f;
  for (int64_t t = 0; t < nk; ++t) {
    s[t] = std::exp(s[t] - m_new);
    l += s[t];
  }
  state[0] = m_new;
  state[1] = state[1] * corr + l;
  float* acc = state + 2;
  for (int64_t i = 0; i < hd_v; ++i) acc[i] *= corr;
  for (int64_t t = 0; t < nk; ++t) {
    const float* vt = v + t * hd_v;
    for (int64_t i = 0; i < hd_v; ++i) acc[i] += s[t] * vt[i];
  }
}

void attn_block_ref(const float* q, const float* k, const float* v, int64_t nk, int64_t hd_k, int64_t hd_v, float scale,
                    float* state) {
  float s[kAttnKeyBlock];
  for (int64_t t = 0; t < nk; ++t) {
    const float* kt = k + t * hd_k;
    float d = 0.0f;
    for (int64_t i = 0; i < hd_k; ++i) d += q[i] * kt[i];
    s[t] = d * scale;
  }
  attn_update_ref(s, v, nk, hd_v, state);
}

namespace {

inline int8_t round_i8(float v) {
  if (!(v == v)) return -128;  // NaN: as cvtps2dq's integer indefinite (kernels' round_to_i8)
  const float r = std::nearbyint(v);
  return static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -128.0f ? -128.0f : r));
}

}  // namespace

void attn_quantize_q8(const float* x, int64_t hd, AttnQ8Query& out) {
  for (int64_t b = 0; b < hd / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      out.q[32 * b + i] = round_i8(xb[i] * id);
      sum += out.q[32 * b + i];
    }
    out.d[b] = core::fp16_to_fp32(core::fp32_to_fp16(d));
    out.sum[b] = sum;
  }
}

namespace detail {

void attn_score_q8_ref(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const AttnQ8Query* qs, int64_t nq,
                       float scale, float* s) {
  const int64_t nb = hd / 32;
  int32_t isum[kAttnQ8MaxHeadDim / 32];
  for (int64_t j = 0; j < nq; ++j) {
    for (int64_t t = 0; t < nk; ++t) {
      const uint8_t* kt = k + t * row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const auto* kq = reinterpret_cast<const int8_t*>(kt + 34 * b + 2);
        int32_t acc = 0;
        for (int i = 0; i < 32; ++i) acc += int32_t{qs[j].q[32 * b + i]} * int32_t{kq[i]};
        isum[b] = acc;
      }
      s[j * kAttnKeyBlock + t] = combine_q8(isum, qs[j], kt, nb, scale);
    }
  }
}

namespace {

void load_rows_ref(Format f, const uint8_t* src, float* dst, int64_t n) { dequantize_row(f, src, dst, n); }

}  // namespace

const AttnOps* reference_attn_ops() {
  static const AttnOps ops{"scalar", 0, nullptr, attn_score_q8_ref, load_rows_ref};
  return &ops;
}

}  // namespace detail

}  // namespace bonsai::kernels
