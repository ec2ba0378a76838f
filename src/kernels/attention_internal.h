// Internal interface between the attention kernels' files: attention.cpp
// (dispatch, prefetch cursor), attention_ref.cpp (the scalar reference) and
// the tier files attention_avx2.cpp / attention_avx512.cpp /
// attention_neon.cpp / attention_neon_dotprod.cpp. Not for other
// parts; the public side is attention.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "core/fp16.h"  // fp16_to_fp32
#include "kernels/attention.h"

namespace bonsai::kernels::detail {

inline constexpr float kAttnNegInf = -std::numeric_limits<float>::infinity();

// Function table of one tier's attention kernels (attention.h AttnKernels):
// step and score_q8 apply where both head dims are multiples of
// head_dim_multiple (0: never; the reference table), load_rows always.
struct AttnOps {
  const char* name;
  int64_t head_dim_multiple;
  AttnStepFn step;
  AttnScoreQ8Fn score_q8;
  AttnLoadRowsFn load_rows;
};

// Tier tables; nullptr when the tier is not compiled into this binary.
const AttnOps* reference_attn_ops();
const AttnOps* avx2_attn_ops();
const AttnOps* avx512_attn_ops();
const AttnOps* neon_attn_ops();  // the neon tier (and the base of the next)
// neon_attn_ops() with the SDOT Q8_0-key scorer: the neon-dotprod and
// neon-i8mm tiers.
const AttnOps* neon_dotprod_attn_ops();

// The reference Q8_0-key scorer (AttnScoreQ8Fn); the tiers' fallback.
void attn_score_q8_ref(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const AttnQ8Query* qs, int64_t nq,
                       float scale, float* s);

// The calling thread's prefetch cursor (attention.h attn_prefetch_spread):
// set() points it at the next key block's K and V rows, and the group
// steps' inner loops call tick(n), which requests the next n cache lines
// (K's, then V's) into L2.
struct SpreadPrefetch {
  uintptr_t p[2] = {0, 0};  // next line of K's rows, of V's rows (addresses)
  uintptr_t end[2] = {0, 0};
  int64_t left = 0;  // lines not yet requested (both ranges): tick's cheap exit when 0
  // [k, k + kbytes) and [v, v + vbytes) (null: none), from their first lines.
  void set(const uint8_t* k, size_t kbytes, const uint8_t* v, size_t vbytes) {
    const uint8_t* from[2] = {k, v};
    const size_t bytes[2] = {k ? kbytes : 0, v ? vbytes : 0};
    left = 0;
    for (int i = 0; i < 2; ++i) {
      end[i] = reinterpret_cast<uintptr_t>(from[i]) + bytes[i];
      p[i] = reinterpret_cast<uintptr_t>(from[i]) & ~uintptr_t{63};
      left += static_cast<int64_t>((end[i] - p[i] + 63) / 64);
    }
  }
  // Requests the next n lines (none once all are requested).
  void tick(int n) {
    if (left <= 0) return;
    left -= n;
    for (int i = 0; i < 2 && n > 0; ++i) {
      for (; n > 0 && p[i] < end[i]; --n, p[i] += 64) __builtin_prefetch(reinterpret_cast<const void*>(p[i]), 0, 2);
    }
  }
};
// The calling thread's prefetch cursor (a thread_local in attention.cpp,
// reached through this out-of-line call: a tier file that named the
// variable itself got initial-exec TLS code that ASan instruments in a form
// the linker cannot relax, "TLS transition from R_X86_64_GOTTPOFF to
// R_X86_64_TPOFF32 ... failed"). Valid for the thread's lifetime.
SpreadPrefetch& spread_prefetch();

// The score formula of the header comment for key row `k` (ggml block_q8_0
// x hd/32) from its block sums; every scorer ends in exactly these fp32 ops.
// (With the key row's block scales already converted: dk [nb].)
inline float combine_q8_dk(const int32_t* isum, const AttnQ8Query& q, const float* dk, int64_t nb, float scale) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const float term = static_cast<float>(isum[b]) * (q.d[b] * dk[b]);
    acc = b == 0 ? term : acc + term;
  }
  return acc * scale;
}
inline float combine_q8(const int32_t* isum, const AttnQ8Query& q, const uint8_t* k, int64_t nb, float scale) {
  float dk[kAttnQ8MaxHeadDim / 32];
  for (int64_t b = 0; b < nb; ++b) {
    uint16_t dh;
    std::memcpy(&dh, k + 34 * b, 2);
    dk[b] = core::fp16_to_fp32(dh);
  }
  return combine_q8_dk(isum, q, dk, nb, scale);
}

// Row sources of the group steps: row t's fp32 elements [16c, 16c + 16)
// (load16, AVX-512) or [8c, 8c + 8) (load8, AVX2).
struct RowsF32 {
  const float* p;
  int64_t stride;  // floats between rows
};
struct RowsF16 {
  const uint8_t* p;
  size_t stride;  // bytes between rows
};
struct RowsQ8 {  // ggml block_q8_0 rows
  const uint8_t* p;
  size_t stride;  // bytes between rows
};

// ---- The group step's row-type dispatch and head grouping, shared by the
// tiers: Heads::run<NQ> (Avx512Heads, Avx2Heads) is the tier's step for NQ
// heads. nh heads of one key block go 4 (else 2, 1) at a time; the rows'
// types are chosen at run time; k null: Q8_0 keys, the scores already in s
// (-inf past nk). s: [nh][kAttnKeyBlock] scratch; head j's state at st + j * st_len.
template <class Heads, class KR, class VR>
void step_group(const float* const* q, int64_t nh, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v,
                float scale, float* s, float* st, int64_t st_len) {
  int64_t j = 0;
  for (; j + 4 <= nh; j += 4) {
    Heads::template run<4>(q + j, k, v, nk, hd_k, hd_v, scale, s + j * kAttnKeyBlock, st + j * st_len, st_len);
  }
  if (j + 2 <= nh) {
    Heads::template run<2>(q + j, k, v, nk, hd_k, hd_v, scale, s + j * kAttnKeyBlock, st + j * st_len, st_len);
    j += 2;
  }
  if (j < nh)
    Heads::template run<1>(q + j, k, v, nk, hd_k, hd_v, scale, s + j * kAttnKeyBlock, st + j * st_len, st_len);
}

template <class Heads, class KR>
void step_v(const float* const* q, int64_t nh, const KR* k, const AttnRows& v, int64_t nk, int64_t hd_k, int64_t hd_v,
            float scale, float* s, float* st, int64_t st_len) {
  switch (v.f) {
    case kernels::Format::kF16:
      return step_group<Heads>(q, nh, k, RowsF16{v.p, v.stride}, nk, hd_k, hd_v, scale, s, st, st_len);
    case kernels::Format::kQ8_0:
      return step_group<Heads>(q, nh, k, RowsQ8{v.p, v.stride}, nk, hd_k, hd_v, scale, s, st, st_len);
    default:
      return step_group<Heads>(
          q, nh, k, RowsF32{reinterpret_cast<const float*>(v.p), static_cast<int64_t>(v.stride / sizeof(float))}, nk,
          hd_k, hd_v, scale, s, st, st_len);
  }
}

template <class Heads>
void step_rows(const float* const* q, int64_t nh, const AttnRows* k, const AttnRows& v, int64_t nk, int64_t hd_k,
               int64_t hd_v, float scale, float* s, float* st, int64_t st_len) {
  if (!k) return step_v<Heads, RowsF32>(q, nh, nullptr, v, nk, hd_k, hd_v, scale, s, st, st_len);
  if (k->f == kernels::Format::kF16) {
    const RowsF16 kr{k->p, k->stride};
    return step_v<Heads>(q, nh, &kr, v, nk, hd_k, hd_v, scale, s, st, st_len);
  }
  const RowsF32 kr{reinterpret_cast<const float*>(k->p), static_cast<int64_t>(k->stride / sizeof(float))};
  return step_v<Heads>(q, nh, &kr, v, nk, hd_k, hd_v, scale, s, st, st_len);
}

}  // namespace bonsai::kernels::detail
