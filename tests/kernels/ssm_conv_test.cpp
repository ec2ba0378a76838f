// kernels::ssm_conv_step (kernels/ssm_conv.h): a run of tokens through the
// step against a float64 direct convolution of the whole sequence, the tail
// holding exactly the last K-1 inputs after each token, the reference's tap
// order against a hand evaluation, and every supported tier equal to the
// scalar reference bit for bit for channel counts that take the SIMD kernel
// and ones that leave a remainder, every K, unaligned pointers and out = x.
#include "kernels/ssm_conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
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

// Runs T tokens of n channels (inputs xs[t][c]) through the step from a zero
// tail; returns the outputs [T][n] and leaves the tail in `tail`.
std::vector<float> run_tokens(const std::vector<float>& w, int64_t K, const std::vector<float>& xs, int64_t T,
                              int64_t n, int64_t ld, std::vector<float>& tail) {
  tail.assign(static_cast<size_t>((K > 1 ? K - 1 : 0) * ld), 0.0f);
  std::vector<float> out(static_cast<size_t>(T * n));
  for (int64_t t = 0; t < T; ++t)
    ssm_conv_step(w.data(), K, tail.data(), ld, xs.data() + t * n, out.data() + t * n, n);
  return out;
}

TEST(SsmConv, MatchesDirectConvolutionAndKeepsTheTail) {
  std::mt19937 rng(7);
  for (Tier tier : tiers()) {
    SCOPED_TRACE(std::string(tier_name(tier)));
    TierScope scope(tier);
    for (int64_t K : {1, 2, 4, 5}) {
      const int64_t n = 37, T = 9, ld = n + 3;
      const auto w = random_values(static_cast<size_t>(n * K), rng);
      const auto xs = random_values(static_cast<size_t>(T * n), rng);
      std::vector<float> tail;
      const auto out = run_tokens(w, K, xs, T, n, ld, tail);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < n; ++c) {
          double ref = 0.0, mag = 0.0;  // inputs before token 0 are zero
          for (int64_t k = 0; k < K; ++k) {
            const int64_t src = t - (K - 1) + k;
            if (src < 0) continue;
            const double p = static_cast<double>(w[static_cast<size_t>(c * K + k)]) * xs[static_cast<size_t>(src * n + c)];
            ref += p;
            mag += std::fabs(p);
          }
          EXPECT_NEAR(out[static_cast<size_t>(t * n + c)], ref, 4e-7 * mag + 1e-30) << "K " << K << " t " << t << " c " << c;
        }
      }
      for (int64_t k = 0; k + 1 < K; ++k)
        for (int64_t c = 0; c < n; ++c)
          ASSERT_EQ(tail[static_cast<size_t>(k * ld + c)], xs[static_cast<size_t>((T - (K - 1) + k) * n + c)])
              << "K " << K << " tail row " << k << " c " << c;
    }
  }
}

TEST(SsmConv, ReferenceAddsRoundedProductsInTapOrderFromPlusZero) {
  // Products chosen so that another order or an fma changes the sum:
  // 1e8 + 1 - 1e8 is 0 in tap order (1e8 + 1 rounds to 1e8) and 1 otherwise.
  const float w[4] = {1.0f, 1.0f, -1.0f, 1.0f};
  float tail[3] = {1e8f, 1.0f, 1e8f};
  const float x = 0.5f;
  float out = -1.0f;
  TierScope scope(Tier::kReference);
  ssm_conv_step(w, 4, tail, 1, &x, &out, 1);
  EXPECT_EQ(out, 0.5f);  // ((0 + 1e8) + 1) - 1e8 = 0, + 0.5
  EXPECT_EQ(tail[0], 1.0f);
  EXPECT_EQ(tail[1], 1e8f);
  EXPECT_EQ(tail[2], 0.5f);
  // -0 products: the sum starts from +0, so it is +0 (not -0).
  const float wz[2] = {-1.0f, -1.0f};
  float tz[1] = {0.0f};
  const float xz = 0.0f;
  ssm_conv_step(wz, 2, tz, 1, &xz, &out, 1);
  EXPECT_FALSE(std::signbit(out));
}

TEST(SsmConv, EveryTierEqualsTheReferenceBitForBit) {
  std::mt19937 rng(11);
  for (int64_t K : {1, 3, 4, 6}) {
    for (int64_t n : {0, 1, 3, 4, 7, 8, 9, 16, 31, 64, 67}) {
      const int64_t T = 5, ld = n + 5, off = 1;  // off: pointers one float past 64-byte alignment
      const auto w = random_values(static_cast<size_t>(n * K + off), rng);
      const auto xs = random_values(static_cast<size_t>(T * n + off), rng);
      std::vector<float> want, want_tail;
      {
        TierScope scope(Tier::kReference);
        std::vector<float> w1(w.begin() + off, w.end()), x1(xs.begin() + off, xs.end());
        want = run_tokens(w1, K, x1, T, n, ld, want_tail);
      }
      for (Tier tier : tiers()) {
        SCOPED_TRACE(std::string(tier_name(tier)) + " K " + std::to_string(K) + " n " + std::to_string(n));
        TierScope scope(tier);
        // Unaligned: every array starts `off` floats into its buffer; out = x in place.
        std::vector<float> tail(static_cast<size_t>((K > 1 ? K - 1 : 0) * ld + off), 0.0f);
        std::vector<float> io(xs);
        for (int64_t t = 0; t < T; ++t) {
          float* xt = io.data() + off + t * n;
          ssm_conv_step(w.data() + off, K, tail.data() + off, ld, xt, xt, n);
        }
        ASSERT_EQ(std::memcmp(io.data() + off, want.data(), want.size() * sizeof(float)), 0);
        ASSERT_EQ(std::memcmp(tail.data() + off, want_tail.data(), want_tail.size() * sizeof(float)), 0);
      }
    }
  }
}

}  // namespace
}  // namespace bonsai::kernels
