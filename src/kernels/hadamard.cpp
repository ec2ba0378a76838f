// The scalar reference of the Walsh-Hadamard transform and its dispatch by
// the active tier (hadamard.h). Compiled without ISA flags.
#include "kernels/hadamard.h"

#include <bit>
#include <cassert>
#include <cmath>

#include "kernels/hadamard_internal.h"
#include "kernels/kernels.h"  // active_tier

namespace bonsai::kernels {

namespace detail {

void hadamard_ref(float* x, int64_t n, const float* signs, int64_t width, int64_t block, float scale, bool inverse) {
  for (int64_t c = 0; c < n; c += block) {
    float* p = x + c;
    const float* s = signs != nullptr ? signs + c % width : nullptr;
    if (s != nullptr && !inverse) {
      for (int64_t j = 0; j < block; ++j) p[j] = p[j] * s[j];
    }
    for (int64_t h = 1; h < block; h *= 2) {
      for (int64_t i = 0; i < block; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          const float a = p[j];
          const float b = p[j + h];
          p[j] = a + b;
          p[j + h] = a - b;
        }
      }
    }
    for (int64_t j = 0; j < block; ++j) p[j] = p[j] * scale;
    if (s != nullptr && inverse) {
      for (int64_t j = 0; j < block; ++j) p[j] = p[j] * s[j];
    }
  }
}

}  // namespace detail

namespace {

detail::HadamardFn hadamard_fn() {
  detail::HadamardFn fn = nullptr;
  switch (active_tier()) {
    case Tier::kAvx2:
      fn = detail::avx2_hadamard();
      break;
    case Tier::kAvx512:
      fn = detail::avx512_hadamard();
      break;
    case Tier::kNeon:
    case Tier::kNeonDotprod:
    case Tier::kNeonI8mm:
      fn = detail::neon_hadamard();
      break;
    case Tier::kReference:
      break;
  }
  return fn != nullptr ? fn : detail::hadamard_ref;
}

void run(std::span<float> x, std::span<const float> signs, int64_t block, bool inverse) {
  assert(block >= 1 && std::has_single_bit(static_cast<uint64_t>(block)));
  const auto n = static_cast<int64_t>(x.size());
  const auto width = signs.empty() ? n : static_cast<int64_t>(signs.size());
  assert(n % block == 0);
  assert(signs.empty() || (width % block == 0 && n % width == 0));
  if (n == 0) return;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  hadamard_fn()(x.data(), n, signs.empty() ? nullptr : signs.data(), width, block, scale, inverse);
}

}  // namespace

void hadamard_rotate(std::span<float> x, std::span<const float> signs, int64_t block) {
  run(x, signs, block, /*inverse=*/false);
}

void hadamard_unrotate(std::span<float> x, std::span<const float> signs, int64_t block) {
  run(x, signs, block, /*inverse=*/true);
}

}  // namespace bonsai::kernels
