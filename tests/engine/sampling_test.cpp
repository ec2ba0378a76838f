// Sampler chain against hand-computed distributions (5-logit vectors whose
// softmax is written out in the comments), RNG reproducibility, validation.
#include "engine/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace bonsai::engine {
namespace {

// logits 1..5 for ids 0..4. At temperature 1, exp(l - 5) =
// [e^-4, e^-3, e^-2, e^-1, 1] = [0.0183156, 0.0497871, 0.1353353, 0.3678794, 1],
// sum 1.5713175, so p = [0.0116562, 0.0316849, 0.0861285, 0.2341217, 0.6364086].
const std::vector<float> kRamp = {1, 2, 3, 4, 5};

SamplingParams off() {  // every filter off, temperature 1
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

void expect_dist(const std::vector<Candidate>& c, const std::vector<int32_t>& ids, const std::vector<double>& probs) {
  ASSERT_EQ(c.size(), ids.size());
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].id, ids[i]) << "rank " << i;
    EXPECT_NEAR(c[i].p, probs[i], 1e-6) << "rank " << i;
  }
}

TEST(Rng, SplitMix64SeedingMatchesReference) {
  // splitmix64 from 0: first output 0xe220a8397b1dcdaf (the value published
  // with Vigna's splitmix64.c); it becomes state word 0.
  Rng r(0);
  EXPECT_EQ(r.state().s[0], 0xe220a8397b1dcdafULL);
  EXPECT_EQ(r.state().s[1], 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(r.state().s[2], 0x06c45d188009454fULL);
  EXPECT_EQ(r.state().s[3], 0xf88bb8a8724c81ecULL);
}

TEST(Rng, Xoshiro256StarStarFixedSequence) {
  Rng r(0);
  // First output by hand: rotl(s1 * 5, 7) * 9 with s1 = 0x6e789e6aa1b965f4.
  const uint64_t s1 = 0x6e789e6aa1b965f4ULL;
  const uint64_t m = s1 * 5;
  const uint64_t by_hand = ((m << 7) | (m >> 57)) * 9;
  EXPECT_EQ(by_hand, 0x99ec5f36cb75f2b4ULL);
  const std::array<uint64_t, 4> expected = {0x99ec5f36cb75f2b4ULL, 0xbf6e1f784956452aULL, 0x1a5f849d4933e6e0ULL,
                                            0x6aa594f1262d2d2cULL};
  for (uint64_t e : expected) EXPECT_EQ(r.next_u64(), e);

  Rng r42(42);
  EXPECT_EQ(r42.next_u64(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(r42.next_u64(), 0x6104d9866d113a7eULL);
}

TEST(Rng, NextDoubleIsTop53Bits) {
  Rng r(0);
  // (0x99ec5f36cb75f2b4 >> 11) * 2^-53 = 0.60126299941790...
  EXPECT_DOUBLE_EQ(r.next_double(), static_cast<double>(0x99ec5f36cb75f2b4ULL >> 11) * 0x1.0p-53);
  EXPECT_NEAR(Rng(0).next_double(), 0.6012629994179048, 1e-15);
}

TEST(Rng, StateRoundTripAndReseed) {
  Rng a(7);
  a.next_u64();
  const Rng::State s = a.state();
  const uint64_t x = a.next_u64();
  a.set_state(s);
  EXPECT_EQ(a.next_u64(), x);
  a.reseed(7);
  Rng b(7);
  EXPECT_EQ(a.next_u64(), b.next_u64());
}

TEST(Filter, AllFiltersOffIsPlainSoftmax) {
  expect_dist(filter_candidates(kRamp, off()), {4, 3, 2, 1, 0},
              {0.6364086, 0.2341217, 0.0861285, 0.0316849, 0.0116562});
}

TEST(Filter, TopK) {
  SamplingParams p = off();
  p.top_k = 3;  // ids 4,3,2; exp = [1, e^-1, e^-2], sum 1.5032147
  expect_dist(filter_candidates(kRamp, p), {4, 3, 2}, {0.6652410, 0.2447285, 0.0900306});
  p.top_k = 1;
  expect_dist(filter_candidates(kRamp, p), {4}, {1.0});
  p.top_k = 99;  // >= n_vocab: off
  EXPECT_EQ(filter_candidates(kRamp, p).size(), 5u);
}

TEST(Filter, TopP) {
  SamplingParams p = off();
  // Cumulative sorted probabilities: 0.6364, 0.8705, 0.9566, ...
  p.top_p = 0.8f;  // reaches 0.8 at the 2nd token: ids 4,3 -> [1, e^-1] / 1.3678794
  expect_dist(filter_candidates(kRamp, p), {4, 3}, {0.7310586, 0.2689414});
  p.top_p = 0.5f;  // the first token alone reaches 0.5
  expect_dist(filter_candidates(kRamp, p), {4}, {1.0});
  p.top_p = 0.95f;  // 0.8705 < 0.95 <= 0.9566: three tokens
  EXPECT_EQ(filter_candidates(kRamp, p).size(), 3u);
}

TEST(Filter, MinP) {
  SamplingParams p = off();
  // Keep p_i >= min_p * p_max, i.e. exp(l_i - 5) >= min_p.
  p.min_p = 0.1f;  // e^-2 = 0.135 >= 0.1 > e^-3 = 0.0498: ids 4,3,2
  expect_dist(filter_candidates(kRamp, p), {4, 3, 2}, {0.6652410, 0.2447285, 0.0900306});
  p.min_p = 0.36f;  // e^-1 = 0.3679 >= 0.36
  EXPECT_EQ(filter_candidates(kRamp, p).size(), 2u);
  p.min_p = 0.37f;  // e^-1 < 0.37
  expect_dist(filter_candidates(kRamp, p), {4}, {1.0});
}

TEST(Filter, Temperature) {
  SamplingParams p = off();
  p.temperature = 2.0f;  // exp((l - 5) / 2) = [e^-2, e^-1.5, e^-1, e^-0.5, 1], sum 2.3328755
  expect_dist(filter_candidates(kRamp, p), {4, 3, 2, 1, 0}, {0.4286555, 0.2599927, 0.1576936, 0.0956460, 0.0580122});
  p.temperature = 0.5f;  // exp(2 (l - 5)) = [e^-8, e^-6, e^-4, e^-2, 1], sum 1.1564645
  expect_dist(filter_candidates(kRamp, p), {4, 3, 2, 1, 0}, {0.8647040, 0.1170250, 0.0158376, 0.0021434, 0.0002901});
}

// Regression: a tiny temperature overflowed logit / T to inf in float, the
// probabilities became NaN and sample() returned the LEAST likely token
// (temperature 1e-40 over HTTP gave garbage instead of ~greedy text).
TEST(Filter, TinyTemperatureTendsToGreedyWithoutNaN) {
  for (const float t : {1e-30f, 1e-38f, 1e-40f, 1e-45f}) {
    SamplingParams p = off();
    p.temperature = t;
    const auto c = filter_candidates(kRamp, p);
    ASSERT_EQ(c.size(), 5u);
    EXPECT_EQ(c[0].id, 4) << t;
    EXPECT_FLOAT_EQ(c[0].p, 1.0f) << t;
    for (size_t i = 1; i < c.size(); ++i) {
      EXPECT_TRUE(std::isfinite(c[i].p)) << t;
      EXPECT_EQ(c[i].p, 0.0f) << t;
    }
    p.seed = 3;
    Sampler s(p);
    for (int k = 0; k < 20; ++k) EXPECT_EQ(s.sample(kRamp, {}), 4) << t;
  }
  // Negative logits too (l / T -> -inf for every candidate).
  const std::vector<float> neg = {-3.0f, -1.0f, -2.0f};
  SamplingParams p = off();
  p.temperature = 1e-40f;
  Sampler s(p);
  EXPECT_EQ(s.sample(neg, {}), 1);
}

TEST(Filter, TopPSeesUntemperedProbabilities) {
  // llama.cpp order: top_p before temperature. At T=1, top_p 0.8 keeps ids 4,3;
  // (at T=2 it would keep three: 0.4287, 0.6887, 0.8464). Then T=2:
  // [1, e^-0.5] / 1.6065307 = [0.6224593, 0.3775407].
  SamplingParams p = off();
  p.top_p = 0.8f;
  p.temperature = 2.0f;
  expect_dist(filter_candidates(kRamp, p), {4, 3}, {0.6224593, 0.3775407});
}

TEST(Filter, ChainTopKThenTopPThenMinP) {
  // top_k 4 drops id 0: exp = [1, e^-1, e^-2, e^-3], sum 1.5532018,
  // p = [0.6438, 0.2369, 0.0871, 0.0321]; top_p 0.9 -> cum 0.6438, 0.8807,
  // 0.9678: ids 4,3,2; min_p 0.2 -> e^-2 < 0.2: ids 4,3.
  SamplingParams p = off();
  p.top_k = 4;
  p.top_p = 0.9f;
  p.min_p = 0.2f;
  expect_dist(filter_candidates(kRamp, p), {4, 3}, {0.7310586, 0.2689414});
  p.min_p = 0.1f;  // now top_p decides: ids 4,3,2
  expect_dist(filter_candidates(kRamp, p), {4, 3, 2}, {0.6652410, 0.2447285, 0.0900306});
}

TEST(Filter, TiesBreakByLowestId) {
  const std::vector<float> tie = {1, 3, 3, 0};
  SamplingParams p = off();
  p.top_k = 1;
  expect_dist(filter_candidates(tie, p), {1}, {1.0});
  p.top_k = 0;
  const auto c = filter_candidates(tie, p);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].id, 1);
  EXPECT_EQ(c[1].id, 2);
  EXPECT_EQ(argmax(tie), 1);
}

TEST(Argmax, EqualsTheScalarScanOnEdgeCases) {
  // argmax is vectorised (max, then the first index equal to it); it must
  // return what the scalar "first i with l[i] > l[best]" scan returns:
  // lowest id on ties, -0 == +0, NaN never wins unless it is at index 0,
  // every length (the 16-wide blocks and the scalar tail).
  auto scalar = [](const std::vector<float>& l) {
    size_t best = 0;
    for (size_t i = 1; i < l.size(); ++i)
      if (l[i] > l[best]) best = i;
    return static_cast<int32_t>(best);
  };
  const float nan = std::nanf(""), inf = INFINITY;
  const std::vector<std::vector<float>> fixed = {{nan, 5, 7},        {1, nan, 7, nan}, {-0.0f, 0.0f}, {0.0f, -0.0f},
                                                 {-inf, -inf, -inf}, {2, 2, 2, 2},     {inf, 1, inf}};
  for (const auto& l : fixed) EXPECT_EQ(argmax(l), scalar(l));
  // A signalling NaN inside the vector blocks (IEEE maxNum, ARM's FMAXNM,
  // would return it and lose the maximum): still never the answer.
  std::vector<float> snan_block(40, 1.0f);
  snan_block[3] = std::numeric_limits<float>::signaling_NaN();
  snan_block[21] = std::numeric_limits<float>::signaling_NaN();
  snan_block[30] = 2.0f;
  EXPECT_EQ(argmax(snan_block), 30);
  EXPECT_EQ(argmax(snan_block), scalar(snan_block));
  Rng r(11);
  for (int t = 0; t < 3000; ++t) {
    std::vector<float> l(1 + r.next_u64() % 300);
    for (auto& x : l) {
      const uint64_t k = r.next_u64() % 10;
      x = k == 0   ? nan
          : k == 1 ? 0.0f
          : k == 2 ? -0.0f
          : k == 3 ? -inf
          : k == 4 ? inf
                   : static_cast<float>(r.next_u64() % 7) - 3.0f;
    }
    ASSERT_EQ(argmax(l), scalar(l)) << "case " << t << " size " << l.size();
  }
  std::vector<float> big(151936);
  for (auto& x : big) x = static_cast<float>(r.next_double() * 20.0 - 10.0);
  big[151935] = 11.0f;  // the maximum in the scalar tail... or the last block
  EXPECT_EQ(argmax(big), scalar(big));
  big[77] = 11.0f;  // tie: the lower id
  EXPECT_EQ(argmax(big), 77);
}

TEST(Filter, LargeVocabularyTopKMatchesNaiveFullSort) {
  // The heap selection must keep exactly a full sort's first k, in order
  // (logit desc, id asc), ties included (values on a coarse grid).
  Rng r(5);
  std::vector<float> l(151936);
  for (auto& x : l) x = static_cast<float>(r.next_u64() % 64) / 4.0f - 8.0f;
  std::vector<int32_t> ids(l.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  for (int32_t k : {1, 40, 1000}) {
    SamplingParams p = off();
    p.top_k = k;
    const auto c = filter_candidates(l, p);
    ASSERT_EQ(c.size(), static_cast<size_t>(k));
    for (int32_t i = 0; i < k; ++i) ASSERT_EQ(c[static_cast<size_t>(i)].id, ids[static_cast<size_t>(i)]) << "k " << k;
  }
}

TEST(Sampler, GreedyWithAndWithoutTheLogitsCopyAgree) {
  // No logit_bias and neutral penalties: the chain reads the logits in place;
  // a penalty (copy path) must still change only what it should.
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>((i * 37) % 101) / 10.0f;
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler plain(p);
  const std::vector<int32_t> hist = {static_cast<int32_t>(argmax(l))};
  EXPECT_EQ(plain.sample(l, hist), argmax(l));
  p.repeat_penalty = 1000.0f;  // the previous best is pushed down
  Sampler pen(p);
  EXPECT_NE(pen.sample(l, hist), argmax(l));
}

TEST(Filter, LargeVocabularyTopPMatchesNaiveFullSort) {
  // The partial-sort fast path must keep exactly the prefix a full sort keeps.
  Rng r(3);
  std::vector<float> l(20000);
  for (auto& x : l) x = static_cast<float>(r.next_double() * 12.0 - 6.0);
  l[17] = 14.0f;  // a peak, so small top_p stops early
  for (float top_p : {0.05f, 0.5f, 0.9f, 0.999f}) {
    SamplingParams p = off();
    p.top_p = top_p;
    const auto c = filter_candidates(l, p);
    // Naive: sort everything (logit desc, id asc), cut where the cumulative
    // softmax first reaches top_p.
    std::vector<int32_t> ids(l.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    double z = 0;
    for (float x : l) z += std::exp(static_cast<double>(x) - 14.0);
    size_t keep = ids.size();
    double cum = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += std::exp(static_cast<double>(l[ids[i]]) - 14.0) / z;
      if (cum >= top_p) {
        keep = i + 1;
        break;
      }
    }
    ASSERT_EQ(c.size(), keep) << "top_p " << top_p;
    for (size_t i = 0; i < keep; ++i) ASSERT_EQ(c[i].id, ids[i]) << "top_p " << top_p << " rank " << i;
  }
}

// ---- Temperature-only sampling without the full sort (sample_tempered) ----------------

// The old algorithm, kept in the code as the reference: filter_candidates
// (full sort, softmax in sorted order) and walk. The draws of a Sampler with
// temperature only must equal it token for token, RNG state included.
void expect_tempered_equals_reference(const std::vector<float>& l, float temp, uint64_t seed, int draws,
                                      const std::string& what) {
  SamplingParams p = off();
  p.temperature = temp;
  p.seed = seed;
  Sampler s(p);
  Rng r(seed);
  const std::vector<Candidate> c = filter_candidates(l, p);
  for (int d = 0; d < draws; ++d) {
    const int32_t want = walk(c, r.next_double());
    ASSERT_EQ(s.sample(l, {}), want) << what << " draw " << d;
  }
  EXPECT_EQ(s.rng().state(), r.state()) << what;  // one draw per sample, as before
}

// Logit vectors with what the fast path must get right: ties (a coarse grid),
// -inf entries (the overflow branch), +0 / -0, repeated maxima, denormals,
// spreads from 0.01 to 1000.
std::vector<float> random_logits(Rng& r, size_t n, int kind) {
  std::vector<float> l(n);
  const double scale = std::array<double, 5>{0.01, 1.0, 4.0, 30.0, 1000.0}[r.next_u64() % 5];
  for (auto& x : l) {
    switch (kind) {
      case 0:  // continuous
        x = static_cast<float>((r.next_double() * 2 - 1) * scale);
        break;
      case 1:  // a coarse grid: many ties
        x = static_cast<float>(static_cast<int>(r.next_u64() % 16) - 8) * 0.5f;
        break;
      case 2:  // continuous with -inf and zero entries of both signs
        x = r.next_u64() % 7 == 0   ? -INFINITY
            : r.next_u64() % 9 == 0 ? (r.next_u64() % 2 != 0 ? 0.0f : -0.0f)
                                    : static_cast<float>((r.next_double() * 2 - 1) * scale);
        break;
      default:  // tiny values (denormals) and exact duplicates
        x = r.next_u64() % 3 == 0 ? 1e-40f * static_cast<float>(r.next_u64() % 5)
                                  : static_cast<float>(r.next_u64() % 4);
        break;
    }
  }
  if (n > 3 && r.next_u64() % 2 != 0) l[n / 2] = l[n / 3] = *std::max_element(l.begin(), l.end());  // tied maxima
  return l;
}

TEST(SampleTempered, EqualsTheFullSortReferenceOnRandomVectors) {
  Rng r(20261202);
  const float temps[] = {1e-30f, 0.01f, 0.3f, 0.7f, 1.0f, 1.5f, 3.0f, 100.0f};
  int cases = 0;
  for (const size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, size_t{1000}, size_t{5000}}) {
    for (int kind = 0; kind < 4; ++kind) {
      for (int rep = 0; rep < 6; ++rep) {
        const std::vector<float> l = random_logits(r, n, kind);
        const float t = temps[r.next_u64() % std::size(temps)];
        expect_tempered_equals_reference(
            l, t, r.next_u64(), 20,
            "n " + std::to_string(n) + " kind " + std::to_string(kind) + " T " + std::to_string(t));
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 7 * 4 * 6);
}

TEST(SampleTempered, EqualsTheFullSortReferenceAtVocabularySize) {
  // Qwen3's 151,936 entries: logits shaped like a model's (a few large, a
  // normal-ish bulk), plus ties and -inf (a grammar-like mask).
  Rng r(7);
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<float> l(151936);
    for (auto& x : l) x = static_cast<float>((r.next_double() + r.next_double() + r.next_double() - 1.5) * 6.0);
    for (int k = 0; k < 20; ++k) l[r.next_u64() % l.size()] = static_cast<float>(10 + r.next_u64() % 8);
    if (rep >= 2)
      for (size_t i = 0; i < l.size(); i += 3) l[i] = -INFINITY;
    if (rep == 3) l[5] = l[77] = l[151935] = *std::max_element(l.begin(), l.end());
    for (const float t : {0.6f, 1.0f, 1.3f})
      expect_tempered_equals_reference(l, t, 1000 + static_cast<uint64_t>(rep), 25,
                                       "rep " + std::to_string(rep) + " T " + std::to_string(t));
  }
}

TEST(SampleTempered, DecidesOrDefersNeverDiffers) {
  // Direct: for draws u across [0, 1), including the largest double below 1
  // (beyond the candidates' float mass: may defer with -1), the fast path
  // returns the reference's token or -1; it defers only at the very top.
  Rng r(11);
  TemperedScratch sc;
  for (int rep = 0; rep < 20; ++rep) {
    const std::vector<float> l = random_logits(r, 300, rep % 4);
    const float t = std::array<float, 3>{0.8f, 2.0f, 1e-30f}[rep % 3];  // 1e-30: l / T overflows (the other branch)
    SamplingParams p = off();
    p.temperature = t;
    const auto c = filter_candidates(l, p);
    for (const double u : {0.0, 0.25, 0.5, 0.999, r.next_double(), 1.0 - 0x1.0p-53}) {
      const int32_t got = sample_tempered(l, t, u, sc);
      if (u < 0.999) {
        EXPECT_EQ(got, walk(c, u)) << rep << " u " << u;
      } else {
        EXPECT_TRUE(got == -1 || got == walk(c, u)) << rep << " u " << u;
      }
    }
  }
  // NaN (no strict order) and a non-finite maximum: deferred, and the Sampler
  // then runs the reference (same token, same RNG use).
  std::vector<float> nan_l = {1.0f, NAN, 2.0f};
  EXPECT_EQ(sample_tempered(nan_l, 1.0f, 0.5, sc), -1);
  std::vector<float> all_ninf = {-INFINITY, -INFINITY};
  EXPECT_EQ(sample_tempered(all_ninf, 1.0f, 0.5, sc), -1);
  std::vector<float> pinf = {1.0f, INFINITY, 2.0f};
  EXPECT_EQ(sample_tempered(pinf, 1.0f, 0.5, sc), -1);
  expect_tempered_equals_reference(nan_l, 1.0f, 3, 10, "nan");
  expect_tempered_equals_reference(all_ninf, 1.0f, 3, 10, "all -inf");
  expect_tempered_equals_reference(pinf, 1.0f, 3, 10, "+inf");
  // top_k >= n_vocab is temperature only too.
  SamplingParams p = off();
  p.top_k = 5;
  p.temperature = 0.9f;
  p.seed = 9;
  Sampler s(p);
  Rng ref(9);
  const auto c = filter_candidates(kRamp, p);
  for (int d = 0; d < 50; ++d) EXPECT_EQ(s.sample(kRamp, {}), walk(c, ref.next_double()));
}

TEST(Penalties, RepeatPenaltyDividesPositiveMultipliesNegative) {
  std::vector<float> l = {2, -1, 0.5f, 3, -2};
  const std::vector<int32_t> hist = {0, 1, 1, 4};
  SamplingParams p = off();
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 64;
  apply_penalties(l, hist, p);
  // id0: 2/2 = 1; id1: -1*2 = -2 (applied once, not per occurrence); id4: -2*2 = -4.
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], -2.0f);
  EXPECT_FLOAT_EQ(l[2], 0.5f);
  EXPECT_FLOAT_EQ(l[3], 3.0f);
  EXPECT_FLOAT_EQ(l[4], -4.0f);
}

TEST(Penalties, PresenceAndFrequency) {
  std::vector<float> l = {2, -1, 0.5f, 3, -2};
  const std::vector<int32_t> hist = {0, 1, 1, 4};
  SamplingParams p = off();
  p.repeat_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  apply_penalties(l, hist, p);
  // After the repeat penalty, minus count * 0.25 + 0.5:
  EXPECT_FLOAT_EQ(l[0], 1.0f - 0.75f);  // count 1
  EXPECT_FLOAT_EQ(l[1], -2.0f - 1.0f);  // count 2
  EXPECT_FLOAT_EQ(l[2], 0.5f);          // absent: untouched
  EXPECT_FLOAT_EQ(l[3], 3.0f);
  EXPECT_FLOAT_EQ(l[4], -4.0f - 0.75f);  // count 1
}

TEST(Penalties, WindowIsLastNTokens) {
  std::vector<float> l = {2, -1, 0.5f, 3, -2};
  const std::vector<int32_t> hist = {0, 1, 1, 4};
  SamplingParams p = off();
  p.frequency_penalty = 1.0f;
  p.repeat_last_n = 2;  // sees {1, 4} only
  apply_penalties(l, hist, p);
  EXPECT_FLOAT_EQ(l[0], 2.0f);
  EXPECT_FLOAT_EQ(l[1], -2.0f);
  EXPECT_FLOAT_EQ(l[4], -3.0f);

  std::vector<float> l2 = {2, -1, 0.5f, 3, -2};
  p.repeat_last_n = 0;  // off
  apply_penalties(l2, hist, p);
  EXPECT_FLOAT_EQ(l2[1], -1.0f);

  std::vector<float> l3 = {2, -1, 0.5f, 3, -2};
  p.repeat_last_n = -1;                                              // whole history
  apply_penalties(l3, std::vector<int32_t>{0, 1, 1, 4, 99, -5}, p);  // out-of-range ids ignored
  EXPECT_FLOAT_EQ(l3[0], 1.0f);
  EXPECT_FLOAT_EQ(l3[1], -3.0f);
}

TEST(LogitBias, AddsBeforePenalties) {
  SamplingParams p = off();
  p.temperature = 0.0f;
  p.logit_bias = {{0, 10.0f}, {2, -100.0f}, {99, 5.0f}, {0, 1.0f}};  // id 99: ignored; id 0 twice
  std::vector<float> l = {1, 2, 3, 4, 5};
  apply_logit_bias(l, p);
  EXPECT_FLOAT_EQ(l[0], 12.0f);
  EXPECT_FLOAT_EQ(l[2], -97.0f);
  EXPECT_FLOAT_EQ(l[4], 5.0f);
  Sampler s(p);
  EXPECT_EQ(s.sample(kRamp, {}), 0);  // 1 + 11 = 12 beats 5
  // Bias first, then the repeat penalty: (1 + 11) / 4 = 3 < 5.
  p.repeat_penalty = 4.0f;
  s.set_params(p);
  EXPECT_EQ(s.sample(kRamp, std::vector<int32_t>{0}), 4);
  // A -100 bias removes a token from a sampled distribution in practice.
  SamplingParams q = off();
  q.logit_bias = {{4, -100.0f}};
  std::vector<float> biased = kRamp;
  apply_logit_bias(biased, q);
  const auto c = filter_candidates(biased, q);
  EXPECT_EQ(c[0].id, 3);
  EXPECT_LT(c.back().p, 1e-30);
}

TEST(Sampler, PenaltyChangesTheGreedyChoice) {
  SamplingParams p = off();
  p.temperature = 0.0f;
  Sampler s(p);
  const std::vector<float> l = {0, 0, 3, 2.5f};
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{2}), 2);
  p.repeat_penalty = 1.5f;  // 3 / 1.5 = 2 < 2.5
  s.set_params(p);
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{2}), 3);
}

TEST(Sampler, GreedyConsumesNoRandomness) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p);
  const Rng::State before = s.rng().state();
  EXPECT_EQ(s.sample(kRamp, {}), 4);
  EXPECT_EQ(s.rng().state(), before);
}

TEST(Sampler, DrawWalksTheSortedDistribution) {
  // Survivors {4: 0.7310586, 3: 0.2689414}. Seed 0 draws u = 0.6012630
  // (< 0.731: id 4), then u = 0.7477741 (>= 0.731: id 3).
  SamplingParams p = off();
  p.top_p = 0.8f;
  p.seed = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(kRamp, {}), 4);
  EXPECT_EQ(s.sample(kRamp, {}), 3);
  // One draw per sample even with a single survivor.
  p.top_k = 1;
  Sampler one(p);
  one.sample(kRamp, {});
  Rng r(0);
  r.next_u64();
  EXPECT_EQ(one.rng().state(), r.state());
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  SamplingParams p = off();
  p.seed = 1234;
  Sampler s(p);
  std::array<int, 5> count{};
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[static_cast<size_t>(s.sample(kRamp, {}))];
  const std::array<double, 5> expected = {0.0116562, 0.0316849, 0.0861285, 0.2341217, 0.6364086};
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(count[i] / double(n), expected[i], 0.012) << i;
}

TEST(Sampler, SameSeedSameSequenceAndSetParamsKeepsRng) {
  SamplingParams p;  // defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05
  p.seed = 99;
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i)) * 3.0f;
  Sampler a(p), b(p);
  std::vector<int32_t> ta, tb;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(a.sample(l, ta));
    tb.push_back(b.sample(l, tb));
  }
  EXPECT_EQ(ta, tb);
  // set_params keeps the RNG (its seed field is ignored), reseed restarts it.
  const Rng::State st = a.rng().state();
  SamplingParams q = p;
  q.seed = 5;
  a.set_params(q);
  EXPECT_EQ(a.rng().state(), st);
  a.reseed(99);
  EXPECT_EQ(a.rng().state(), Rng(99).state());
  EXPECT_EQ(a.params().seed, 99u);
}

TEST(SamplingParams, Validate) {
  EXPECT_TRUE(SamplingParams{}.validate().has_value());
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_FALSE(p.validate().has_value());
  p = {};
  p.min_p = 1.5f;
  EXPECT_FALSE(p.validate().has_value());
  p = {};
  p.repeat_penalty = 0.0f;
  EXPECT_FALSE(p.validate().has_value());
  p = {};
  p.temperature = NAN;
  auto r = p.validate();
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("temperature"), std::string::npos);
  p = {};
  p.stop = {"ok", ""};
  EXPECT_FALSE(p.validate().has_value());
  p = {};
  p.logit_bias = {{3, INFINITY}};
  EXPECT_FALSE(p.validate().has_value());
  p = {};
  p.repeat_last_n = -2;
  EXPECT_FALSE(p.validate().has_value());
  p = {};
  p.temperature = -1.0f;  // negative = greedy, allowed
  EXPECT_TRUE(p.validate().has_value());
}

// apply_overrides: the one merge of a request's sampling fields onto the
// defaults; a set field wins (an empty stop list too), an unset one keeps
// the default.
TEST(Sampling, ApplyOverridesReplacesOnlyTheSetFields) {
  SamplingParams d;
  d.temperature = 0.3f;
  d.top_k = 7;
  d.seed = 5;
  d.stop = {"x"};
  d.max_tokens = 9;
  SamplingOverrides o;
  EXPECT_EQ(apply_overrides(d, o).top_k, 7);
  o.top_k = 2;
  o.seed = 8;
  o.stop = std::vector<std::string>{};
  o.ignore_eos = true;
  o.logprobs = 4;
  const SamplingParams p = apply_overrides(d, o);
  EXPECT_FLOAT_EQ(p.temperature, 0.3f);
  EXPECT_EQ(p.top_k, 2);
  EXPECT_EQ(p.seed, 8u);
  EXPECT_TRUE(p.stop.empty());
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.max_tokens, 9);
  EXPECT_EQ(p.logprobs, 4);
  EXPECT_EQ(p.prompt_logprobs, -1);
}

// Speculative verification (Sampler::verify, the rejection rule of Leviathan
// et al. 2023 / Chen et al. 2023 for a point-mass proposal): whatever is
// proposed, the token taken is distributed as the target chain's p. Pearson's
// chi-square over 20,000 draws per proposer against p (4 degrees of freedom
// for kRamp: p > 0.01, the bar, is chi-square < 13.28; fixed seeds, so
// the figures do not move between runs); a proposer that always offers the least likely
// token, one that offers the most likely, and one that offers a different
// token each time. With top_k 3 a proposal outside the survivors is never taken.
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    const double e = p[i] * n;
    x2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x2;
}

TEST(Verify, RejectionRuleKeepsTheTargetDistribution) {
  const std::vector<double> p = {0.0116562, 0.0316849, 0.0861285, 0.2341217, 0.6364086};
  constexpr int kDraws = 20000;
  struct Case {
    const char* name;
    int32_t (*proposal)(int);
  };
  const Case cases[] = {{"least likely", [](int) { return 0; }},
                        {"most likely", [](int) { return 4; }},
                        {"cycling", [](int i) { return i % 5; }}};
  for (const Case& c : cases) {
    Sampler s(off());
    s.reseed(77);
    std::vector<int> counts(5, 0);
    int accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      const int32_t x = c.proposal(i);
      const int32_t t = s.verify(kRamp, {}, x);
      ASSERT_GE(t, 0);
      ASSERT_LT(t, 5);
      ++counts[static_cast<size_t>(t)];
      accepted += t == x;
    }
    EXPECT_LT(chi_square(counts, p, kDraws), 13.28) << c.name;  // p > 0.01
    // Acceptance itself is p(x): 1.2% for the least likely token, 64% for the most likely.
    const std::string name = c.name;
    if (name == "least likely") EXPECT_NEAR(accepted / double(kDraws), p[0], 0.004) << c.name;
    if (name == "most likely") EXPECT_NEAR(accepted / double(kDraws), p[4], 0.015) << c.name;
    if (name == "cycling") EXPECT_NEAR(accepted / double(kDraws), 0.2, 0.015) << c.name;  // sum p(x) / 5
  }
  // The chi-square has teeth: the proposer's own distribution (always the
  // least likely token when taken as is) is far from p.
  std::vector<int> biased(5, 0);
  biased[0] = kDraws;
  EXPECT_GT(chi_square(biased, p, kDraws), 1000);
}

TEST(Verify, ProposalOutsideTheSurvivorsIsNeverTaken) {
  SamplingParams params = off();
  params.top_k = 3;  // survivors 4, 3, 2: p proportional to e^5, e^4, e^3
  const double z = std::exp(5.0) + std::exp(4.0) + std::exp(3.0);
  const std::vector<double> p = {0, 0, std::exp(3.0) / z, std::exp(4.0) / z, std::exp(5.0) / z};
  Sampler s(params);
  s.reseed(5);
  constexpr int kDraws = 20000;
  std::vector<int> counts(5, 0);
  for (int i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(s.verify(kRamp, {}, 1))];
  EXPECT_EQ(counts[0] + counts[1], 0);
  EXPECT_LT(chi_square(counts, p, kDraws), 13.82);  // 2 degrees of freedom, 0.1%
}

TEST(Verify, GreedyIsTheArgMaxAndDrawsNothing) {
  SamplingParams params = off();
  params.temperature = 0;
  Sampler s(params);
  const Rng::State before = s.rng().state();
  EXPECT_EQ(s.verify(kRamp, {}, 1), 4);
  EXPECT_EQ(s.verify(kRamp, {}, 4), 4);
  EXPECT_EQ(s.rng().state(), before);
}

TEST(Verify, OneDrawWhenAcceptedTwoWhenRejected) {
  // verify_point_proposal with explicit draws: u_accept < p(x) takes x;
  // otherwise u_resample walks the rest (p renormalised by 1 - p(x)).
  const std::vector<Candidate> c = {{4, 0, 0.5f}, {3, 0, 0.3f}, {2, 0, 0.2f}};
  EXPECT_EQ(verify_point_proposal(c, 3, 0.29, 0.99), 3);
  EXPECT_EQ(verify_point_proposal(c, 3, 0.31, 0.0), 4);   // rejected: 4 has 0.5 / 0.7 of the rest
  EXPECT_EQ(verify_point_proposal(c, 3, 0.31, 0.70), 4);  // 0.70 * 0.7 = 0.49 < 0.5
  EXPECT_EQ(verify_point_proposal(c, 3, 0.31, 0.72), 2);  // 0.72 * 0.7 = 0.504: past 4's 0.5
  // RNG use through the Sampler: a seed whose first draw u lies in
  // [p(0), p(4)) accepts a proposed 4 (one draw) and rejects a proposed 0 (two).
  uint64_t seed = 1;
  for (;; ++seed) {
    const double u = Rng(seed).next_double();
    if (u >= 0.0116562 + 1e-6 && u < 0.6364086 - 1e-6) break;
  }
  Sampler s(off());
  s.reseed(seed);
  Rng r(seed);
  r.next_double();
  EXPECT_EQ(s.verify(kRamp, {}, 4), 4);
  EXPECT_EQ(s.rng().state(), r.state());
  Sampler s2(off());
  s2.reseed(seed);
  Rng r2(seed);
  r2.next_double();
  r2.next_double();
  EXPECT_NE(s2.verify(kRamp, {}, 0), 0);
  EXPECT_EQ(s2.rng().state(), r2.state());
}

}  // namespace
}  // namespace bonsai::engine
