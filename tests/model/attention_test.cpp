// Attention (model/attention.h): agrees with a double-precision softmax
// reference, and is batch invariant bit for bit: a query's output is the same
// whether it ran alone (decode), inside a prefill of any chunking, or next to
// other sequences' tokens; for every KV type and kernels tier. End to end:
// logits memcmp across prefill chunkings and batch mixes on stories260K
// (head dim 8: the AVX2 / NEON kernels, scalar elsewhere) and the tiny Qwen3 fixture (head dim 64).
#include "model/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>  // pair
#include <vector>

#include "core/fp16.h"  // fp16_to_fp32
#include "kernels/kernels.h"
#include "model_test_util.h"

namespace bonsai::model {
namespace {

using testing::load_or_fail;

// One sequence's synthetic layer: P positions of K/V, P queries.
struct Synth {
  ModelConfig cfg;
  std::vector<float> k, v, q;  // [P][n_kv][hd], [P][n_kv][hd], [P][n_head][hd]
  int64_t P = 0;
};

Synth make_synth(int64_t hd, int64_t n_head, int64_t n_kv, int64_t P, uint32_t seed) {
  Synth s;
  s.cfg.n_layer = 1, s.cfg.n_head = n_head, s.cfg.n_head_kv = n_kv;
  s.cfg.head_dim_k = hd, s.cfg.head_dim_v = hd;
  s.P = P;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  s.k.resize(P * n_kv * hd), s.v.resize(P * n_kv * hd), s.q.resize(P * n_head * hd);
  for (auto& x : s.k) x = nd(rng);
  for (auto& x : s.v) x = nd(rng);
  for (auto& x : s.q) x = 2.0f * nd(rng);  // peaky softmax: exercises the rescaling
  return s;
}

void store(KvType t, const float* src, uint8_t* dst, int64_t n) {
  if (t == KvType::kF16)
    kernels::f32_to_f16_row(src, reinterpret_cast<uint16_t*>(dst), n);
  else if (t == KvType::kQ8_0)
    kernels::quantize_row_q8_0(src, dst, n);
  else
    std::memcpy(dst, src, n * sizeof(float));
}

std::unique_ptr<KvCache> fill_cache(const Synth& s, KvType tk, KvType tv) {
  auto c = KvCache::create(s.cfg, s.P, tk, tv);
  EXPECT_TRUE(c.has_value());
  auto kv = std::make_unique<KvCache>(std::move(*c));
  const int64_t hd = s.cfg.head_dim_k, n_kv = s.cfg.n_head_kv;
  for (int64_t p = 0; p < s.P; ++p) {
    for (int64_t h = 0; h < n_kv; ++h) {
      store(tk, &s.k[(p * n_kv + h) * hd], kv->k_row(0, h, p), hd);
      store(tv, &s.v[(p * n_kv + h) * hd], kv->v_row(0, h, p), hd);
    }
  }
  // The rows past P up to the end of their 32-key block hold NaN (all bytes
  // 0xFF: NaN in f16, f32 and a Q8_0 block's scale). Kernels may read them
  // (lanes of keys past a query's position) but must not let them reach a
  // live key's lane, which a NaN would show.
  const int64_t pad = (32 - s.P % 32) % 32;
  EXPECT_LE(s.P % kv->block_size() + pad, kv->block_size());
  for (int64_t h = 0; h < n_kv; ++h) {
    for (int64_t i = 1; i <= pad; ++i) {
      std::memset(kv->k_row(0, h, s.P - 1) + i * kv->k_row_bytes(), 0xFF, kv->k_row_bytes());
      std::memset(kv->v_row(0, h, s.P - 1) + i * kv->v_row_bytes(), 0xFF, kv->v_row_bytes());
    }
  }
  kv->set_size(s.P);
  return kv;
}

// Runs attention for the tokens `positions` of sequence 0 (in that order),
// interleaved with `others` single tokens of other sequences after each of
// ours; returns our rows ([positions.size()][n_head*hd]).
std::vector<float> run(const Synth& s, std::span<KvCache* const> caches, std::span<const int32_t> positions, int others,
                       core::ThreadPool& pool) {
  const int64_t qd = s.cfg.n_head * s.cfg.head_dim_k;
  std::vector<BatchToken> tok;
  std::vector<float> q;
  std::vector<size_t> ours;
  for (int32_t p : positions) {
    ours.push_back(tok.size());
    tok.push_back({0, p, 0, false});
    q.insert(q.end(), s.q.begin() + p * qd, s.q.begin() + (p + 1) * qd);
    for (int o = 0; o < others; ++o) {  // another sequence's query at some position
      const int32_t op = (p * 7 + o * 13) % static_cast<int32_t>(s.P);
      tok.push_back({0, op, 1 + o, false});
      q.insert(q.end(), s.q.begin() + op * qd, s.q.begin() + (op + 1) * qd);
    }
  }
  std::vector<float> out(tok.size() * qd, -1.0f);
  attention(s.cfg, 0, tok, caches, q.data(), out.data(), 1.0f / std::sqrt(float(s.cfg.head_dim_k)), pool);
  std::vector<float> mine;
  for (size_t i : ours) mine.insert(mine.end(), out.begin() + i * qd, out.begin() + (i + 1) * qd);
  return mine;
}

// Every position 0..P-1 of sequence 0 as its own call (decode), rows
// concatenated ([P][n_head*hd]).
std::vector<float> run_decode(const Synth& s, std::span<KvCache* const> caches, core::ThreadPool& pool) {
  std::vector<float> out;
  for (int32_t p = 0; p < static_cast<int32_t>(s.P); ++p) {
    const int32_t one[] = {p};
    const auto r = run(s, caches, one, 0, pool);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

// The cache's values as fp32 (what attention reads), for the reference.
float cached(const KvCache& kv, bool is_k, int64_t h, int64_t p, int64_t i, int64_t hd) {
  std::vector<float> row(hd);
  const KvType t = is_k ? kv.type_k() : kv.type_v();
  const auto f = t == KvType::kF16    ? kernels::Format::kF16
                 : t == KvType::kQ8_0 ? kernels::Format::kQ8_0
                                      : kernels::Format::kF32;
  kernels::dequantize_row(f, is_k ? kv.k_row(0, h, p) : kv.v_row(0, h, p), row.data(), hd);
  return row[i];
}

class AttentionInvariance : public ::testing::TestWithParam<std::tuple<int64_t, KvType, kernels::Tier>> {};

TEST_P(AttentionInvariance, DecodePrefillChunksAndMixesAreBitIdentical) {
  const auto [hd, type, tier] = GetParam();
  if (!kernels::tier_supported(tier)) GTEST_SKIP() << "tier not supported here";
  if (type == KvType::kQ8_0 && hd % 32 != 0) GTEST_SKIP() << "q8_0 needs hd % 32 == 0";
  const kernels::Tier saved = kernels::active_tier();
  ASSERT_TRUE(kernels::set_active_tier(tier).has_value());
  const int64_t P = 150;  // 4 full key blocks + a partial one
  const Synth s = make_synth(hd, 4, 2, P, 42u + static_cast<uint32_t>(hd));
  std::vector<std::unique_ptr<KvCache>> owned;
  std::vector<KvCache*> caches;
  for (int i = 0; i < 17; ++i) {
    owned.push_back(fill_cache(s, type, type));
    caches.push_back(owned.back().get());
  }
  core::ThreadPool pool(2);
  std::vector<int32_t> all(P);
  for (int32_t p = 0; p < P; ++p) all[p] = p;
  const int64_t row = s.cfg.n_head * hd;

  // Decode: one query per call.
  const std::vector<float> decode = run_decode(s, caches, pool);
  // Reference: double-precision softmax over the cached values. With Q8_0
  // keys the scores use q quantized to Q8_0 (attention.cpp's integer path,
  // as ggml's): the reference takes that q, dequantized.
  double worst = 0.0;
  const KvCache& kv = *caches[0];
  for (int32_t p = 0; p < P; p += 7) {
    for (int64_t h = 0; h < s.cfg.n_head; ++h) {
      const int64_t kvh = h / 2;
      std::vector<float> qh(s.q.begin() + p * row + h * hd, s.q.begin() + p * row + (h + 1) * hd);
      if (type == KvType::kQ8_0) {
        std::vector<uint8_t> blocks(kernels::row_bytes(kernels::Format::kQ8_0, hd));
        kernels::quantize_row_q8_0(qh.data(), blocks.data(), hd);
        kernels::dequantize_row(kernels::Format::kQ8_0, blocks.data(), qh.data(), hd);
      }
      std::vector<double> sc(p + 1);
      double m = -1e300;
      for (int32_t t = 0; t <= p; ++t) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(qh[i]) * cached(kv, true, kvh, t, i, hd);
        sc[t] = d / std::sqrt(double(hd));
        m = std::max(m, sc[t]);
      }
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - m));
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (int32_t t = 0; t <= p; ++t) o += sc[t] / sum * cached(kv, false, kvh, t, i, hd);
        worst = std::max(worst, std::abs(o - decode[p * row + h * hd + i]));
      }
    }
  }
  EXPECT_LE(worst, 2e-5) << "vs double reference";

  // Prefill chunkings 3, 7, 64 and whole, each vs decode, memcmp.
  for (int chunk : {3, 7, 64, static_cast<int>(P)}) {
    std::vector<float> got;
    for (int32_t p0 = 0; p0 < P; p0 += chunk) {
      const auto part = std::span<const int32_t>(all).subspan(p0, std::min<int64_t>(chunk, P - p0));
      const auto r = run(s, caches, part, 0, pool);
      got.insert(got.end(), r.begin(), r.end());
    }
    ASSERT_EQ(got.size(), decode.size());
    EXPECT_EQ(std::memcmp(got.data(), decode.data(), got.size() * sizeof(float)), 0) << "chunk " << chunk;
  }
  // Batches with other sequences mixed in (N = 2, 3, 8, 16 sequences in all).
  for (int n_seq : {2, 3, 8, 16}) {
    for (int chunk : {1, 64}) {
      std::vector<float> got;
      for (int32_t p0 = 0; p0 < P; p0 += chunk) {
        const auto part = std::span<const int32_t>(all).subspan(p0, std::min<int64_t>(chunk, P - p0));
        const auto r = run(s, caches, part, n_seq - 1, pool);
        got.insert(got.end(), r.begin(), r.end());
      }
      EXPECT_EQ(std::memcmp(got.data(), decode.data(), got.size() * sizeof(float)), 0)
          << "N " << n_seq << " chunk " << chunk;
    }
  }
  // One thread gives the same bits as two.
  core::ThreadPool one_thread(1);
  const auto whole1 = run(s, caches, all, 0, one_thread);
  EXPECT_EQ(std::memcmp(whole1.data(), decode.data(), decode.size() * sizeof(float)), 0);
  std::printf("[attention] hd %lld %s tier %s kernel %s: max |diff| vs double %.3g\n", (long long)hd,
              kv_type_name(type), std::string(kernels::tier_name(tier)).c_str(), attention_kernel_name(hd, hd), worst);
  ASSERT_TRUE(kernels::set_active_tier(saved).has_value());
}

// Named hd<N>_<kv type>_<tier> ("hd64_q8_0_neon_dotprod"), so a run can pick
// one tier (scripts/test-arm64.sh: --gtest_filter='*_neon').
INSTANTIATE_TEST_SUITE_P(All, AttentionInvariance,
                         ::testing::Combine(::testing::Values<int64_t>(8, 40, 64, 128),
                                            ::testing::Values(KvType::kF16, KvType::kF32, KvType::kQ8_0),
                                            ::testing::ValuesIn(kernels::kAllTiers)),
                         [](const ::testing::TestParamInfo<AttentionInvariance::ParamType>& info) {
                           std::string name = "hd" + std::to_string(std::get<0>(info.param)) + "_" +
                                              kv_type_name(std::get<1>(info.param)) + "_" +
                                              std::string(kernels::tier_name(std::get<2>(info.param)));
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

// Three and four query heads per KV head (the AVX-512, AVX2 and NEON steps
// take heads 4, 2 and 1 at a time: decode runs 2 + 1 or 4, two whole-block
// queries 4 + 2 or 4 + 4), tiles of 1 and 2 tokens (K/V read in place: at
// most 4 heads) and longer ones (converted to fp32), head dims 64, 96 and
// 256, with K and V of the same and of different types: a query's output is
// the same bits however its heads and queries were grouped, on every tier.
TEST(AttentionKernel, OddGroupsBitIdenticalAcrossChunkings) {
  const kernels::Tier saved = kernels::active_tier();
  core::ThreadPool pool(2);
  const std::pair<KvType, KvType> kv_types[] = {{KvType::kF16, KvType::kF16},
                                                {KvType::kQ8_0, KvType::kQ8_0},
                                                {KvType::kQ8_0, KvType::kF16},
                                                {KvType::kF16, KvType::kQ8_0}};
  constexpr int64_t kShapes[][2] = {{3, 64}, {4, 64}, {3, 96}, {4, 256}};  // (GQA group, head dim)
  // The reference tier's decode outputs, per shape and (K, V) types.
  std::vector<float> ref[std::size(kShapes)][std::size(kv_types)];
  for (kernels::Tier tier : kernels::kAllTiers) {
    if (!kernels::tier_supported(tier)) continue;
    ASSERT_TRUE(kernels::set_active_tier(tier).has_value());
    for (size_t si = 0; si < std::size(kShapes); ++si) {
      for (size_t ti = 0; ti < std::size(kv_types); ++ti) {
        const auto [tk, tv] = kv_types[ti];
        const int64_t P = 100, group = kShapes[si][0], hd = kShapes[si][1];
        const Synth s = make_synth(hd, 2 * group, 2, P, 5u);
        std::vector<std::unique_ptr<KvCache>> owned;
        std::vector<KvCache*> caches;
        for (int i = 0; i < 3; ++i) {
          owned.push_back(fill_cache(s, tk, tv));
          caches.push_back(owned.back().get());
        }
        std::vector<int32_t> all(P);
        for (int32_t p = 0; p < P; ++p) all[p] = p;
        const std::vector<float> decode = run_decode(s, caches, pool);
        // Sanity: a softmax average of V, so |out| <= max |v| (a wrong head
        // mapping would still pass the memcmps below).
        float vmax = 0.0f;
        for (float x : s.v) vmax = std::max(vmax, std::fabs(x));
        for (float x : decode) ASSERT_LE(std::fabs(x), vmax * 1.01f);
        // And each tier within fp32 rounding of the scalar reference (the same
        // Q8_0 scores on every tier; the fp32 orders differ).
        std::vector<float>& r0 = ref[si][ti];
        if (tier == kernels::Tier::kReference) r0 = decode;
        ASSERT_EQ(r0.size(), decode.size());
        for (size_t i = 0; i < decode.size(); ++i) ASSERT_NEAR(decode[i], r0[i], 1e-5f) << i;
        // (chunk, other sequences' tokens after each of ours): chunk 2 with
        // others interleaved runs tiles of 1 token, without them tiles of 2.
        for (const auto& [chunk, others] : {std::pair{2, 1}, std::pair{2, 0}, std::pair{5, 0}, std::pair{int(P), 0}}) {
          std::vector<float> got;
          for (int32_t p0 = 0; p0 < P; p0 += chunk) {
            const auto part = std::span<const int32_t>(all).subspan(p0, std::min<int64_t>(chunk, P - p0));
            const auto r = run(s, caches, part, others, pool);
            got.insert(got.end(), r.begin(), r.end());
          }
          ASSERT_EQ(got.size(), decode.size());
          EXPECT_EQ(std::memcmp(got.data(), decode.data(), got.size() * sizeof(float)), 0)
              << "chunk " << chunk << " others " << others << " group " << group << " hd " << hd << " K "
              << kv_type_name(tk) << " V " << kv_type_name(tv) << " tier " << kernels::tier_name(tier);
        }
      }
    }
  }
  ASSERT_TRUE(kernels::set_active_tier(saved).has_value());
}

// The Q8_0-key scores (integer dot + one fp32 formula) are the same bits on
// every tier, for every key count of a block (groups of 16 keys on AVX-512,
// 8 on AVX2, 4 on NEON, and the tails)
// and head dim; and they equal the formula written out here.
TEST(AttentionKernel, Q8ScoresBitIdenticalAcrossTiers) {
  const kernels::Tier saved = kernels::active_tier();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // (160, 224: 5 and 7 blocks per key.)
  for (int64_t hd : {32, 64, 128, 160, 224, 256}) {
    const size_t rb = kernels::row_bytes(kernels::Format::kQ8_0, hd);
    std::vector<float> q(hd), k(kKeyBlock * hd);
    for (auto& x : q) x = 3.0f * nd(rng);
    for (auto& x : k) x = nd(rng);
    q[5] = 0.0f;  // a zero and an all-zero block of q
    if (hd >= 64) std::fill(q.begin() + 32, q.begin() + 64, 0.0f);
    std::vector<uint8_t> rows(kKeyBlock * rb);
    for (int64_t t = 0; t < kKeyBlock; ++t) kernels::quantize_row_q8_0(&k[t * hd], &rows[t * rb], hd);
    // The formula, from the public quantizers.
    std::vector<uint8_t> qb(rb);
    kernels::quantize_row_q8_0(q.data(), qb.data(), hd);
    const float scale = 0.0883883f;
    std::vector<float> want(kKeyBlock);
    for (int64_t t = 0; t < kKeyBlock; ++t) {
      float acc = 0.0f;
      for (int64_t b = 0; b < hd / 32; ++b) {
        const uint8_t* kb = &rows[t * rb + 34 * b];
        const uint8_t* qblk = &qb[34 * b];
        int32_t isum = 0;
        for (int i = 0; i < 32; ++i) isum += int32_t(int8_t(qblk[2 + i])) * int32_t(int8_t(kb[2 + i]));
        uint16_t dq, dk;
        std::memcpy(&dq, qblk, 2), std::memcpy(&dk, kb, 2);
        const float fdq = core::fp16_to_fp32(dq), fdk = core::fp16_to_fp32(dk);
        // volatile: one rounding per operation, never a fused multiply-add.
        const volatile float w = fdq * fdk;
        const volatile float term = float(isum) * w;
        acc = b == 0 ? term : acc + term;
      }
      want[t] = acc * scale;
    }
    for (kernels::Tier tier : kernels::kAllTiers) {
      if (!kernels::tier_supported(tier)) continue;
      ASSERT_TRUE(kernels::set_active_tier(tier).has_value());
      for (int64_t nk = 1; nk <= kKeyBlock; ++nk) {
        std::vector<float> s(kKeyBlock, -1.0f);
        attention_q8_scores(q.data(), rows.data(), rb, nk, hd, scale, s.data());
        EXPECT_EQ(std::memcmp(s.data(), want.data(), nk * sizeof(float)), 0)
            << "hd " << hd << " nk " << nk << " tier " << kernels::tier_name(tier);
        if (nk < kKeyBlock) {
          EXPECT_EQ(s[nk], -1.0f) << "wrote past nk " << nk;
        }
      }
    }
  }
  ASSERT_TRUE(kernels::set_active_tier(saved).has_value());
}

TEST(AttentionKernel, Avx512IsUsedWhereAvailable) {
  if (!kernels::tier_supported(kernels::Tier::kAvx512)) GTEST_SKIP();
  const kernels::Tier saved = kernels::active_tier();
  ASSERT_TRUE(kernels::set_active_tier(kernels::Tier::kAvx512).has_value());
  EXPECT_STREQ(attention_kernel_name(128, 128), "avx512");
  EXPECT_STREQ(attention_kernel_name(40, 40), "avx2");  // not a multiple of 16: the AVX2 kernels
  EXPECT_STREQ(attention_kernel_name(8, 8), "avx2");
  EXPECT_STREQ(attention_kernel_name(12, 12), "scalar");
  ASSERT_TRUE(kernels::set_active_tier(kernels::Tier::kReference).has_value());
  EXPECT_STREQ(attention_kernel_name(128, 128), "scalar");
  ASSERT_TRUE(kernels::set_active_tier(saved).has_value());
}

TEST(AttentionKernel, Avx2IsUsedWhereAvailable) {
  if (!kernels::tier_supported(kernels::Tier::kAvx2)) GTEST_SKIP();
  const kernels::Tier saved = kernels::active_tier();
  ASSERT_TRUE(kernels::set_active_tier(kernels::Tier::kAvx2).has_value());
  EXPECT_STREQ(attention_kernel_name(128, 128), "avx2");
  EXPECT_STREQ(attention_kernel_name(8, 8), "avx2");
  EXPECT_STREQ(attention_kernel_name(12, 12), "scalar");
  ASSERT_TRUE(kernels::set_active_tier(saved).has_value());
}

// The three ARM tiers share the NEON kernels (head dims multiples of 4).
TEST(AttentionKernel, NeonIsUsedWhereAvailable) {
  const kernels::Tier saved = kernels::active_tier();
  int tried = 0;
  for (kernels::Tier tier : {kernels::Tier::kNeon, kernels::Tier::kNeonDotprod, kernels::Tier::kNeonI8mm}) {
    if (!kernels::tier_supported(tier)) continue;
    ++tried;
    ASSERT_TRUE(kernels::set_active_tier(tier).has_value());
    EXPECT_STREQ(attention_kernel_name(128, 128), "neon") << kernels::tier_name(tier);
    EXPECT_STREQ(attention_kernel_name(8, 8), "neon");
    EXPECT_STREQ(attention_kernel_name(12, 4), "neon");
    EXPECT_STREQ(attention_kernel_name(6, 8), "scalar");
  }
  ASSERT_TRUE(kernels::set_active_tier(saved).has_value());
  if (tried == 0) GTEST_SKIP() << "no ARM tier here";
}

// ---- End to end: logits bit-identical across chunkings and batch mixes ----

std::vector<int32_t> prompt_ids(int n, int64_t vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i == 0 ? 1 : static_cast<int32_t>(3 + (i * 37 + 11) % (vocab - 3));
  return ids;
}

// Last-token logits of every chunk of a `chunk`-token prefill (all positions
// get logits, so each position is compared), sequence 0 alone or with
// n_seq - 1 other sequences (their own prompts) sharing every forward call.
std::vector<float> chunked_logits(const Model& m, const std::vector<int32_t>& ids, int chunk, int n_seq,
                                  core::ThreadPool& pool) {
  const int64_t V = m.config().n_vocab;
  std::vector<std::unique_ptr<KvCache>> owned;
  std::vector<KvCache*> caches;
  for (int s = 0; s < n_seq; ++s) {
    owned.push_back(std::make_unique<KvCache>(std::move(*KvCache::create(m.config(), 128))));
    caches.push_back(owned.back().get());
  }
  Workspace ws;
  std::vector<float> mine;
  const int n = static_cast<int>(ids.size());
  for (int p0 = 0; p0 < n; p0 += chunk) {
    Batch b;
    const int len = std::min(chunk, n - p0);
    for (int i = 0; i < len; ++i) b.add(ids[p0 + i], p0 + i, 0, true);
    for (int s = 1; s < n_seq; ++s) {  // other sequences: s tokens each, their own text
      const int32_t start = static_cast<int32_t>(caches[s]->size());
      for (int i = 0; i < s % 5 + 1 && start + i < 128; ++i) b.add((7 * s + 5 * i + 2) % V, start + i, s, i == 0);
    }
    std::vector<float> logits(b.n_wanted() * V);
    EXPECT_TRUE(m.forward(b, caches, ws, logits, pool).has_value());
    mine.insert(mine.end(), logits.begin(), logits.begin() + len * V);  // ours come first
  }
  return mine;
}

void expect_end_to_end_invariant(const std::string& path) {
  auto model = load_or_fail(path);
  ASSERT_TRUE(model);
  core::ThreadPool pool(2);
  const auto ids = prompt_ids(70, model->config().n_vocab);
  const auto ref = chunked_logits(*model, ids, 1, 1, pool);  // token-by-token decode
  for (int chunk : {3, 7, 64, 70}) {
    const auto got = chunked_logits(*model, ids, chunk, 1, pool);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0) << path << " chunk " << chunk;
  }
  for (int n_seq : {2, 3, 8, 16}) {
    for (int chunk : {1, 7}) {
      const auto got = chunked_logits(*model, ids, chunk, n_seq, pool);
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0)
          << path << " N " << n_seq << " chunk " << chunk;
    }
  }
}

TEST(AttentionEndToEnd, Stories260KLogitsInvariantAcrossChunkingsAndBatches) {
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(path);
  expect_end_to_end_invariant(path);
}

TEST(AttentionEndToEnd, TinyQwen3LogitsInvariantAcrossChunkingsAndBatches) {
  const std::string path = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  expect_end_to_end_invariant(path);
}

TEST(KvCacheTypes, Q8_0BytesAndParsing) {
  ModelConfig c;
  c.n_layer = 2, c.n_head_kv = 2, c.head_dim_k = 64, c.head_dim_v = 32;
  auto q8 = KvCache::create(c, 10, KvType::kQ8_0, KvType::kF16);
  ASSERT_TRUE(q8.has_value());
  // K: 2 blocks of 34 bytes per row; V: 32 f16 = 64 bytes per row; 10
  // positions take one KV block of 32.
  EXPECT_EQ(q8->bytes(), 2u * 2 * 32 * (68 + 64));
  EXPECT_EQ(KvCache::bytes_per_position(c, KvType::kQ8_0, KvType::kF16), 2u * 2 * (68 + 64));
  EXPECT_EQ(q8->k_row(0, 0, 1) - q8->k_row(0, 0, 0), 68);
  // A standalone cache of 10 positions is one block of 32 (KvPool layout):
  // the last V row of the last layer ends the allocation.
  EXPECT_EQ(q8->block_size(), 32);
  EXPECT_EQ(q8->v_row(1, 1, 31) + 64 - q8->k_row(0, 0, 0), static_cast<ptrdiff_t>(q8->bytes()));
  c.head_dim_k = 48;  // not a multiple of 32
  EXPECT_FALSE(KvCache::create(c, 10, KvType::kQ8_0, KvType::kF16).has_value());
  EXPECT_TRUE(KvCache::create(c, 10, KvType::kF16, KvType::kQ8_0).has_value());
  EXPECT_EQ(*parse_kv_type("q8_0"), KvType::kQ8_0);
  EXPECT_EQ(*parse_kv_type("f16"), KvType::kF16);
  EXPECT_EQ(*parse_kv_type("f32"), KvType::kF32);
  EXPECT_FALSE(parse_kv_type("q4_0").has_value());
  EXPECT_FALSE(parse_kv_type("F16").has_value());
}

}  // namespace
}  // namespace bonsai::model
