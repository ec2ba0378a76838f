// kernels::hadamard_rotate / hadamard_unrotate (kernels/hadamard.h): the
// transform against the O(n^2) float64 product with H_B for B = 1 .. 1024,
// the round trip, and every supported tier equal to the scalar reference bit
// for bit (the butterfly order of hadamard.h "Arithmetic").
#include "kernels/hadamard.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

constexpr int64_t kBlocks[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<float> random_signs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> s(n);
  for (float& x : s) x = (rng() & 1) != 0 ? 1.0f : -1.0f;
  return s;
}

// H_B[r][c] = (-1)^popcount(r & c) / sqrt(B) applied to each B-chunk as a
// dense float64 matrix product; signs before (rotate) or after (unrotate).
std::vector<double> dense_reference(const std::vector<float>& x, const std::vector<float>& s, int64_t block,
                                    bool inverse) {
  const auto n = static_cast<int64_t>(x.size());
  const auto width = static_cast<int64_t>(s.size());
  const double norm = 1.0 / std::sqrt(static_cast<double>(block));
  std::vector<double> y(x.size());
  for (int64_t c = 0; c < n; c += block) {
    for (int64_t r = 0; r < block; ++r) {
      double acc = 0.0;
      for (int64_t k = 0; k < block; ++k) {
        const double sign = (std::popcount(static_cast<uint64_t>(r & k)) & 1) != 0 ? -1.0 : 1.0;
        const double in = inverse ? x[c + k] : static_cast<double>(x[c + k]) * s[(c + k) % width];
        acc += sign * in;
      }
      y[c + r] = inverse ? acc * norm * s[(c + r) % width] : acc * norm;
    }
  }
  return y;
}

// The tiers this CPU runs (the reference first).
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

// Error bound of hadamard.h: log2(B) rounded additions and one rounded
// scale on values of |x| <= 1 ~ (log2(B) + 2) * 2^-24 * sqrt(B).
double tolerance(int64_t block) {
  return (std::log2(static_cast<double>(block)) + 2.0) * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(block));
}

TEST(HadamardKernelTest, MatchesDenseFloat64ProductEveryBlockSize) {
  for (Tier tier : tiers()) {
    TierScope scope(tier);
    for (int64_t block : kBlocks) {
      const int64_t width = 2 * block;  // two chunks per row, three rows
      const auto s = random_signs(static_cast<size_t>(width), static_cast<uint32_t>(block));
      const auto x = random_values(static_cast<size_t>(3 * width), static_cast<uint32_t>(block + 7));
      for (bool inverse : {false, true}) {
        const auto want = dense_reference(x, s, block, inverse);
        std::vector<float> got = x;
        if (inverse) {
          hadamard_unrotate(got, s, block);
        } else {
          hadamard_rotate(got, s, block);
        }
        double worst = 0.0;
        for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
        EXPECT_LE(worst, tolerance(block)) << tier_name(tier) << " B=" << block << " inverse=" << inverse;
      }
    }
  }
}

TEST(HadamardKernelTest, EmptySignsAreAllPlusOne) {
  for (int64_t block : {1, 8, 64, 1024}) {
    const auto x = random_values(static_cast<size_t>(2 * block), 11);
    const std::vector<float> ones(x.size(), 1.0f);
    std::vector<float> a = x, b = x;
    hadamard_rotate(a, {}, block);
    hadamard_rotate(b, ones, block);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "B=" << block;
  }
}

TEST(HadamardKernelTest, UnrotateInvertsRotate) {
  for (Tier tier : tiers()) {
    TierScope scope(tier);
    for (int64_t block : kBlocks) {
      const int64_t width = 4 * block;
      const auto s = random_signs(static_cast<size_t>(width), 3);
      const auto x = random_values(static_cast<size_t>(2 * width), 5);
      std::vector<float> y = x;
      hadamard_rotate(y, s, block);
      hadamard_unrotate(y, s, block);
      float worst = 0.0f;
      for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(y[i] - x[i]));
      EXPECT_LE(worst, 1e-6f) << tier_name(tier) << " B=" << block;
    }
  }
}

// Every tier computes the reference's butterflies: equal bits, both
// directions, with and without signs, several rows, including the real
// 27B widths (block 1024, width 5120).
TEST(HadamardKernelTest, TiersEqualReferenceBitForBit) {
  struct Case {
    int64_t block, width, rows;
  };
  std::vector<Case> cases;
  for (int64_t block : kBlocks) cases.push_back({block, 3 * block, 2});
  cases.push_back({1024, 5120, 2});
  cases.push_back({64, 384, 5});
  for (const Case& c : cases) {
    const auto s = random_signs(static_cast<size_t>(c.width), static_cast<uint32_t>(c.width));
    // Values of mixed magnitude so that roundings differ between orders.
    auto x = random_values(static_cast<size_t>(c.width * c.rows), 17);
    for (size_t i = 0; i < x.size(); i += 3) x[i] *= 1e3f;
    for (bool inverse : {false, true}) {
      for (bool with_signs : {true, false}) {
        const std::span<const float> signs = with_signs ? std::span<const float>(s) : std::span<const float>{};
        auto apply = [&](Tier t) {
          TierScope scope(t);
          std::vector<float> y = x;
          if (inverse) {
            hadamard_unrotate(y, signs, c.block);
          } else {
            hadamard_rotate(y, signs, c.block);
          }
          return y;
        };
        const auto want = apply(Tier::kReference);
        for (Tier t : tiers()) {
          const auto got = apply(t);
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << tier_name(t) << " B=" << c.block << " width=" << c.width << " inverse=" << inverse
              << " signs=" << with_signs;
        }
      }
    }
  }
}

}  // namespace
}  // namespace bonsai::kernels
