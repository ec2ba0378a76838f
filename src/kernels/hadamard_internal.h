// Internal interface between the Walsh-Hadamard transform's files:
// hadamard.cpp (dispatch and the scalar reference) and the tier files
// hadamard_avx2.cpp / hadamard_avx512.cpp / hadamard_neon.cpp. The public
// side is hadamard.h.
#pragma once

#include <cstdint>

namespace bonsai::kernels::detail {

// Transforms x[0, n) (n a multiple of block) in place, block-chunk by
// block-chunk (hadamard.h "Arithmetic"). signs: nullptr (all +1) or an array
// of `width` values (width a multiple of block, n a multiple of width) that
// repeats for every row of `width`. inverse = false: x <- H(s ⊙ x) * scale;
// true: x <- s ⊙ (H(x) * scale).
using HadamardFn = void (*)(float* x, int64_t n, const float* signs, int64_t width, int64_t block, float scale,
                            bool inverse);

// The scalar reference (the definition every tier reproduces).
void hadamard_ref(float* x, int64_t n, const float* signs, int64_t width, int64_t block, float scale, bool inverse);
// Tier kernels; nullptr when the tier is not compiled into this binary. Each
// handles every block size (falling back to hadamard_ref below its vector
// width).
HadamardFn avx2_hadamard();
HadamardFn avx512_hadamard();
HadamardFn neon_hadamard();  // the neon, neon-dotprod and neon-i8mm tiers

}  // namespace bonsai::kernels::detail
