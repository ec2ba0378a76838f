// silu_mul (kernels/silu.h): every supported tier equals the scalar
// reference bit for bit (lengths 0..40, so every tail; values across the
// clamp, zeros, infinities, NaN, subnormals), and the reference is within a
// few ulp of silu(x) * u computed in double (|x| <= 87), with the limits the
// header states past the clamp.
#include "kernels/silu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/silu_internal.h"

namespace bonsai::kernels {
namespace {

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

// Inputs: a sweep over [-100, 100], random normals of several scales, and
// the special values.
std::vector<float> inputs() {
  std::vector<float> v;
  for (int i = -2000; i <= 2000; ++i) v.push_back(static_cast<float>(i) * 0.05f);
  std::mt19937 rng(7);
  for (float s : {0.01f, 1.0f, 4.0f, 30.0f}) {
    std::normal_distribution<float> d(0.0f, s);
    for (int i = 0; i < 500; ++i) v.push_back(d(rng));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, 1e-40f, -1e-40f, 86.9f, 87.0f, 87.1f, -87.9f, -88.0f, -88.1f, 200.0f, -200.0f, 3e38f,
                  -3e38f, inf, -inf, std::numeric_limits<float>::quiet_NaN()})
    v.push_back(x);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(Silu, EveryTierEqualsTheReferenceBitForBit) {
  const std::vector<float> g = inputs();
  std::vector<float> u(g.size());
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (float& x : u) x = d(rng);
  std::vector<float> want(g.size());
  detail::silu_mul_ref(g.data(), u.data(), want.data(), static_cast<int64_t>(g.size()));
  for (Tier t : tiers()) {
    TierScope scope(t);
    const std::string name(tier_name(t));
    // Every length 0..40 at offsets 0..3 (tails and unaligned starts).
    for (int64_t off = 0; off < 4; ++off) {
      for (int64_t n = 0; n <= 40; ++n) {
        std::vector<float> got(static_cast<size_t>(n) + 1, -1.0f);
        silu_mul(g.data() + off, u.data() + off, got.data(), n);
        for (int64_t j = 0; j < n; ++j)
          ASSERT_TRUE(same_bits(got[static_cast<size_t>(j)], want[static_cast<size_t>(off + j)]))
              << name << " n=" << n << " off=" << off << " j=" << j << " x=" << g[static_cast<size_t>(off + j)];
        EXPECT_EQ(got[static_cast<size_t>(n)], -1.0f) << name << ": wrote past n";
      }
    }
    // The whole input, and in place (out == g).
    std::vector<float> got(g.size());
    silu_mul(g.data(), u.data(), got.data(), static_cast<int64_t>(g.size()));
    std::vector<float> inplace = g;
    silu_mul(inplace.data(), u.data(), inplace.data(), static_cast<int64_t>(g.size()));
    for (size_t j = 0; j < g.size(); ++j) {
      ASSERT_TRUE(same_bits(got[j], want[j])) << name << " j=" << j << " x=" << g[j];
      ASSERT_TRUE(same_bits(inplace[j], want[j])) << name << " in place, j=" << j;
    }
  }
}

TEST(Silu, ReferenceIsWithinAFewUlpOfTheExactValue) {
  const std::vector<float> g = inputs();
  const std::vector<float> one(g.size(), 1.0f);
  std::vector<float> got(g.size());
  detail::silu_mul_ref(g.data(), one.data(), got.data(), static_cast<int64_t>(g.size()));
  double worst = 0;
  for (size_t j = 0; j < g.size(); ++j) {
    const double x = g[j];
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(got[j]));
      continue;
    }
    if (std::isinf(x)) {
      if (x > 0) {
        EXPECT_EQ(got[j], std::numeric_limits<float>::infinity());
      }
      continue;
    }
    if (x < -87.0) {  // past the clamp: a tiny non-positive value
      EXPECT_LE(got[j], 0.0f) << x;
      EXPECT_LE(std::fabs(static_cast<double>(got[j])), std::ldexp(std::fabs(x), -120)) << x;
      continue;
    }
    const double exact = x / (1.0 + std::exp(-x));
    if (exact == 0) {
      EXPECT_EQ(got[j], 0.0f) << x;
      continue;
    }
    const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(exact)) - 23);
    worst = std::max(worst, std::fabs(got[j] - exact) / ulp);
  }
  EXPECT_LE(worst, 4.0);
  std::printf("silu reference: max error %.2f ulp over %zu inputs\n", worst, g.size());
}

}  // namespace
}  // namespace bonsai::kernels
