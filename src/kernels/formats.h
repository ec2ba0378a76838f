// On-disk block structs of the quantized formats the kernels compute on,
// bit-exact with ggml's definitions (llama.cpp ggml-common.h: block_q8_0,
// block_q1_0, block_q2_0) and with the two other type-42 layouts seen in the
// wild (PrismML's older 128-weight Q2_0, OxiBonsai's TQ2_0_g128), as written
// by ../shared/tools/make_qwen3_gguf.py.
//
// All structs are packed byte arrays (alignment 1): blocks sit back to back in
// a tensor, so an fp16 scale can be at any address. Read scales with
// load_fp16() rather than through a uint16_t lvalue.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/fp16.h"

namespace bonsai::kernels {

inline constexpr int kQ8_0Elems = 32;   // Q8_0 weights per block
inline constexpr int kQ1_0Elems = 128;  // Q1_0 weights per block
inline constexpr int kQ2_0Elems = 64;   // llama.cpp Q2_0 (g64) weights per block
inline constexpr int kQ2G128Elems = 128;

// Q8_0 (ggml type 8): x[j] = d * qs[j].
struct BlockQ8_0 {
  uint8_t d[2];   // fp16 scale, little endian
  int8_t qs[32];  // signed quants
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q1_0 (ggml type 41): x[j] = ((qs[j/8] >> (j%8)) & 1) ? +d : -d, j in [0,128).
struct BlockQ1_0 {
  uint8_t d[2];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ1_0) == 18);

// Q2_0 g64 (ggml type 42, llama.cpp): code j = (qs[j/4] >> (2*(j%4))) & 3,
// x[j] = (code - 1) * d, so codes 0,1,2,3 -> -d, 0, +d, +2d. j in [0,64).
struct BlockQ2_0 {
  uint8_t d[2];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ2_0) == 18);

// Q2_0 g128, d first (PrismML's older layout): same code packing over 128
// weights, qs[32]. Ternary only: codes 0,1,2 -> -d,0,+d; code 3 (never
// written by valid files) decodes as 0, as OxiBonsai's TQ2_0_g128 defines it.
struct BlockQ2_0G128D {
  uint8_t d[2];
  uint8_t qs[32];
};
static_assert(sizeof(BlockQ2_0G128D) == 34);

// Q2_0 g128, qs first (OxiBonsai TQ2_0_g128): qs[32] then fp16 d; codes as
// BlockQ2_0G128D (code 3 -> 0).
struct BlockQ2_0G128Qs {
  uint8_t qs[32];
  uint8_t d[2];
};
static_assert(sizeof(BlockQ2_0G128Qs) == 34);

// Reads a little-endian fp16 at any alignment and widens it to float.
inline float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return core::fp16_to_fp32(h);
}

// Ternary value (code - 1) of a 2-bit code in the g64 layout (3 -> +2) or a
// g128 layout (3 -> 0).
inline int q2_code_value(int code, bool g128) { return (g128 && code == 3) ? 0 : code - 1; }

}  // namespace bonsai::kernels
