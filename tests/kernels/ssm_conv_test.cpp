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
  std::vector<Tier> t;
  for (Tier x : kAllTiers)
    if (tier_supported(x)) t.push_back(x);
  return t;
}

// memcmp of two float ranges of n values (n = 0 compares nothing: the data
// pointers of empty vectors may be null).
bool same_bits(const float* a, const float* b, size_t n) { return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0; }

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
  for (int64_t t = 0; t < T; ++t) ssm_conv_step(w.data(), K, tail.data(), ld, xs.data() + t * n, out.data() + t * n, n);
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
            const double p =
                static_cast<double>(w[static_cast<size_t>(c * K + k)]) * xs[static_cast<size_t>(src * n + c)];
            ref += p;
            mag += std::fabs(p);
          }
          EXPECT_NEAR(out[static_cast<size_t>(t * n + c)], ref, 4e-7 * mag + 1e-30)
              << "K " << K << " t " << t << " c " << c;
        }
      }
      for (int64_t k = 0; k + 1 < K; ++k)
        for (int64_t c = 0; c < n; ++c)
          ASSERT_EQ(tail[static_cast<size_t>(k * ld + c)], xs[static_cast<size_t>((T - (K - 1) + k) * n + c)])
              << "K " << K << " tail row " << k << " c " << c;
    }
  }
}

TEST(SsmConv, AddsRoundedProductsInTapOrderFromPlusZeroOnEveryTier) {
  for (Tier tier : tiers()) {
    SCOPED_TRACE(std::string(tier_name(tier)));
    TierScope scope(tier);
    // 9 channels: 8 through a SIMD step where the tier has one, 1 on the
    // reference. Channel c gets the case c % 3.
    constexpr int64_t n = 9, K = 4;
    std::vector<float> w(n * K), tail(3 * n), x(n), out(n, -1.0f);
    for (int64_t c = 0; c < n; ++c) {
      float* wc = w.data() + c * K;
      switch (c % 3) {
        case 0:  // ((0 + 1e8) + 1) - 1e8 = 0 in tap order (1e8 + 1 rounds to 1e8), + 0.5; reversed: 0
          wc[0] = 1.0f, wc[1] = 1.0f, wc[2] = -1.0f, wc[3] = 1.0f;
          tail[c] = 1e8f, tail[n + c] = 1.0f, tail[2 * n + c] = 1e8f, x[c] = 0.5f;
          break;
        case 1:  // an inexact product: (1 + 2^-12)^2 rounds to 1 + 2^-11, so the
                 // sum is +0; an fma would keep its 2^-24
          wc[0] = 0.0f, wc[1] = 0.0f, wc[2] = -1.0f, wc[3] = 1.0f + 0x1p-12f;
          tail[c] = 0.0f, tail[n + c] = 0.0f, tail[2 * n + c] = 1.0f + 0x1p-11f, x[c] = 1.0f + 0x1p-12f;
          break;
        default:  // every product -0: the sum starts from +0, so it is +0 (from the first product: -0)
          wc[0] = wc[1] = wc[2] = wc[3] = -1.0f;
          tail[c] = tail[n + c] = tail[2 * n + c] = 0.0f, x[c] = 0.0f;
          break;
      }
    }
    const std::vector<float> x0 = x, t1(tail.begin() + n, tail.begin() + 2 * n), t2(tail.begin() + 2 * n, tail.end());
    ssm_conv_step(w.data(), K, tail.data(), n, x.data(), out.data(), n);
    for (int64_t c = 0; c < n; ++c) {
      SCOPED_TRACE("channel " + std::to_string(c));
      if (c % 3 == 0) {
        EXPECT_EQ(out[static_cast<size_t>(c)], 0.5f);
      } else {
        EXPECT_EQ(out[static_cast<size_t>(c)], 0.0f);
        EXPECT_FALSE(std::signbit(out[static_cast<size_t>(c)]));
      }
      // The tail moved by one token.
      EXPECT_EQ(tail[static_cast<size_t>(c)], t1[static_cast<size_t>(c)]);
      EXPECT_EQ(tail[static_cast<size_t>(n + c)], t2[static_cast<size_t>(c)]);
      EXPECT_EQ(tail[static_cast<size_t>(2 * n + c)], x0[static_cast<size_t>(c)]);
    }
    // NaN and infinity times zero give NaN on every tier.
    std::vector<float> tn(3 * n, 0.0f), xn(n, 1.0f), on(n);
    std::vector<float> wn(n * K, 1.0f);
    for (int64_t c = 0; c < n; ++c) {
      // Even channels: a NaN or Inf in the oldest tail input (weight 1);
      // odd ones: a NaN or Inf tap 0 weight (tail 0).
      float& slot = c % 2 == 0 ? tn[static_cast<size_t>(c)] : wn[static_cast<size_t>(c * K)];
      slot = c % 4 < 2 ? NAN : INFINITY;
    }
    ssm_conv_step(wn.data(), K, tn.data(), n, xn.data(), on.data(), n);
    for (int64_t c = 0; c < n; ++c) {
      const bool nan_in = c % 4 < 2;  // NaN anywhere, or Inf x 0 (odd c: Inf weight times a 0 tail)
      if (nan_in || c % 2 == 1) {
        EXPECT_TRUE(std::isnan(on[static_cast<size_t>(c)])) << "channel " << c;
      } else {
        EXPECT_TRUE(std::isinf(on[static_cast<size_t>(c)])) << "channel " << c;  // Inf tail x weight 1
      }
    }
  }
}

TEST(SsmConv, EveryTierEqualsTheReferenceBitForBit) {
  // As the model calls it: channel ranges [c0, c1) of a wider tail (row
  // stride ld), each range on its own, several tokens in turn; pointers one
  // float past the vectors' alignment; out = x in place. Values around the
  // ranges and the rows are NaN sentinels that must stay untouched.
  std::mt19937 rng(11);
  for (int64_t K : {1, 3, 4, 6}) {
    for (int64_t n : {0, 1, 3, 4, 7, 8, 9, 16, 31, 64, 67}) {
      const int64_t T = 5, ld = n + 11, off = 1, c0 = 3;  // the range [c0, c0 + n) of ld channels
      const auto w = random_values(static_cast<size_t>(ld * K + off), rng);
      const auto xs = random_values(static_cast<size_t>(T * ld + off), rng);
      const int64_t rows = K > 1 ? K - 1 : 0;
      auto run = [&](std::vector<float>& io, std::vector<float>& tail) {
        io = xs;
        tail.assign(static_cast<size_t>(rows * ld + off), NAN);
        for (int64_t k = 0; k < rows; ++k)
          for (int64_t c = c0; c < c0 + n; ++c) tail[static_cast<size_t>(off + k * ld + c)] = 0.0f;
        for (int64_t t = 0; t < T; ++t) {
          float* xt = io.data() + off + t * ld + c0;
          ssm_conv_step(w.data() + off + c0 * K, K, tail.data() + off + c0, ld, xt, xt, n);
        }
      };
      std::vector<float> want, want_tail;
      {
        TierScope scope(Tier::kReference);
        run(want, want_tail);
      }
      // The reference left everything outside the ranges alone.
      for (int64_t k = 0; k < rows; ++k) {
        for (int64_t c = 0; c < ld; ++c) {
          if (c >= c0 && c < c0 + n) continue;
          ASSERT_TRUE(std::isnan(want_tail[static_cast<size_t>(off + k * ld + c)])) << "K " << K << " n " << n;
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < ld; ++c) {
          if (c >= c0 && c < c0 + n) continue;
          const auto at = static_cast<size_t>(off + t * ld + c);
          ASSERT_EQ(want[at], xs[at]) << "K " << K << " n " << n;
        }
      }
      for (Tier tier : tiers()) {
        SCOPED_TRACE(std::string(tier_name(tier)) + " K " + std::to_string(K) + " n " + std::to_string(n));
        TierScope scope(tier);
        std::vector<float> io, tail;
        run(io, tail);
        ASSERT_TRUE(same_bits(io.data(), want.data(), io.size()));
        ASSERT_TRUE(same_bits(tail.data(), want_tail.data(), tail.size()));
      }
    }
  }
}

}  // namespace
}  // namespace bonsai::kernels
