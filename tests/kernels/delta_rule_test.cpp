// kernels::delta_rule_step (kernels/delta_rule.h): the step against a
// float64 evaluation of the same recurrence over many tokens, every
// supported tier equal to the scalar reference bit for bit (the 16-lane sums
// and fold of delta_rule.h "Arithmetic") for head dims that take the SIMD
// kernel and ones that do not, and the reference's sums against a hand
// evaluation of the lane order.
#include "kernels/delta_rule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

std::vector<float> random_values(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<Tier> tiers() {
  std::vector<Tier> t{Tier::kReference};
  for (Tier x : {Tier::kAvx2, Tier::kAvx512, Tier::kNeon, Tier::kNeonDotprod, Tier::kNeonI8mm})
    if (tier_supported(x)) t.push_back(x);
  return t;
}

struct TierScope {
  explicit TierScope(Tier t) : saved(active_tier()) { EXPECT_TRUE(set_active_tier(t).has_value()); }
  ~TierScope() { (void)set_active_tier(saved); }
  Tier saved;
};

// One token's inputs for a head of dim d: L2-normed q and k (as the layer
// gives them), v, g in (0, 1), beta in (0, 1).
struct Token {
  std::vector<float> q, k, v;
  float g, beta;
};

std::vector<Token> random_tokens(int64_t d, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Token> out;
  for (int t = 0; t < n; ++t) {
    Token tk;
    tk.q = random_values(static_cast<size_t>(d), rng);
    tk.k = random_values(static_cast<size_t>(d), rng);
    for (auto* x : {&tk.q, &tk.k}) {
      double ss = 0.0;
      for (float f : *x) ss += static_cast<double>(f) * f;
      for (float& f : *x) f = static_cast<float>(f / std::sqrt(ss));
    }
    tk.v = random_values(static_cast<size_t>(d), rng, -2.0f, 2.0f);
    tk.g = std::uniform_real_distribution<float>(0.5f, 1.0f)(rng);
    tk.beta = std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
    out.push_back(std::move(tk));
  }
  return out;
}

// Runs the tokens through delta_rule_step from a zero state: the outputs of
// every token, concatenated, then the final state.
std::vector<float> run(const std::vector<Token>& tokens, int64_t d, float scale) {
  std::vector<float> S(static_cast<size_t>(d * d), 0.0f), out;
  std::vector<float> o(static_cast<size_t>(d));
  for (const Token& t : tokens) {
    delta_rule_step(S.data(), t.q.data(), t.k.data(), t.v.data(), t.g, t.beta, scale, o.data(), d);
    out.insert(out.end(), o.begin(), o.end());
  }
  out.insert(out.end(), S.begin(), S.end());
  return out;
}

// The same recurrence in float64 (Yang et al. 2024 eq. 10, delta_rule.h).
std::vector<double> run_f64(const std::vector<Token>& tokens, int64_t d, double scale) {
  std::vector<double> S(static_cast<size_t>(d * d), 0.0), out;
  for (const Token& t : tokens) {
    for (int64_t i = 0; i < d; ++i) {
      double* row = S.data() + i * d;
      double sk = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        row[j] *= t.g;
        sk += row[j] * t.k[static_cast<size_t>(j)];
      }
      const double delta = (t.v[static_cast<size_t>(i)] - sk) * t.beta;
      double sq = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        row[j] += delta * t.k[static_cast<size_t>(j)];
        sq += row[j] * t.q[static_cast<size_t>(j)];
      }
      out.push_back(sq * scale);
    }
  }
  out.insert(out.end(), S.begin(), S.end());
  return out;
}

constexpr int64_t kDims[] = {1, 7, 16, 17, 32, 48, 64, 100, 128, 256};

TEST(DeltaRuleKernelTest, MatchesFloat64RecurrenceOver64Tokens) {
  for (Tier tier : tiers()) {
    TierScope scope(tier);
    for (int64_t d : kDims) {
      const auto tokens = random_tokens(d, 64, static_cast<uint32_t>(d));
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      const auto got = run(tokens, d, scale);
      const auto want = run_f64(tokens, d, scale);
      ASSERT_EQ(got.size(), want.size());
      double worst = 0.0, mag = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(got[i] - want[i]));
        mag = std::max(mag, std::abs(want[i]));
      }
      // 64 steps of a contraction (g < 1, |k| = 1): fp32 rounding stays
      // within a few hundred ulps of the largest value.
      EXPECT_GT(mag, 0.1) << "d=" << d;
      EXPECT_LE(worst, mag * 2e-5) << tier_name(tier) << " d=" << d;
    }
  }
}

TEST(DeltaRuleKernelTest, EveryTierEqualsTheReferenceBitForBit) {
  std::vector<float> reference;
  for (int64_t d : kDims) {
    const auto tokens = random_tokens(d, 24, static_cast<uint32_t>(1000 + d));
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> want;
    {
      TierScope scope(Tier::kReference);
      want = run(tokens, d, scale);
    }
    for (Tier tier : tiers()) {
      TierScope scope(tier);
      const auto got = run(tokens, d, scale);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << tier_name(tier) << " d=" << d;
    }
  }
}

// The reference sums in delta_rule.h's lane order: with S = 0, g = 1 and
// beta = 1, the first token's state is v k^T and o_i = (v_i k^T q) * scale,
// whose dot k.q must be the 16-lane sum folded as the header says, not a
// running sum (values chosen so the two orders round differently).
TEST(DeltaRuleKernelTest, SumsInTheDocumentedLaneOrder) {
  constexpr int64_t d = 32;
  std::vector<float> q(d), k(d), v(d, 0.0f);
  for (int64_t j = 0; j < d; ++j) {
    k[static_cast<size_t>(j)] = 1.0f;
    q[static_cast<size_t>(j)] = (j % 2 == 0) ? 1.0f : 1e-8f;  // a running sum drops every 1e-8 once it is >= 1
  }
  q[0] = 1e8f;
  v[0] = 1.0f;
  float lanes[16];
  for (int64_t l = 0; l < 16; ++l) lanes[l] = q[static_cast<size_t>(l)] + q[static_cast<size_t>(l + 16)];
  for (int64_t l = 0; l < 8; ++l) lanes[l] = lanes[l] + lanes[l + 8];
  for (int64_t l = 0; l < 4; ++l) lanes[l] = lanes[l] + lanes[l + 4];
  for (int64_t l = 0; l < 2; ++l) lanes[l] = lanes[l] + lanes[l + 2];
  const float folded = lanes[0] + lanes[1];
  float running = 0.0f;
  for (float x : q) running = running + x;
  ASSERT_NE(folded, running);  // the case tells the orders apart
  for (Tier tier : tiers()) {
    TierScope scope(tier);
    std::vector<float> S(static_cast<size_t>(d * d), 0.0f), o(static_cast<size_t>(d));
    delta_rule_step(S.data(), q.data(), k.data(), v.data(), 1.0f, 1.0f, 1.0f, o.data(), d);
    EXPECT_EQ(o[0], folded) << tier_name(tier);
    EXPECT_EQ(o[1], 0.0f) << tier_name(tier);
  }
}

}  // namespace
}  // namespace bonsai::kernels
