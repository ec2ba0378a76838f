// ggml tensor type ids, names and block geometry, as llama.cpp's ggml.h and
// ggml.c (type_traits) define them. Only the ids listed here are accepted by
// the GGUF reader; kernels/ computes on a subset (see kernels/kernels.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bonsai::core {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  Q1_0 = 41,  // PrismML 1-bit: 128 weights, fp16 d + 16 bytes of sign bits (18 bytes)
  Q2_0 = 42,  // ternary; three incompatible on-disk layouts share this id (see Q2Layout)
  // PrismML's llama.cpp fork (../shared/fixtures/README.md "Weight formats"):
  PQ2_0 = 142,   // ternary g128: fp16 d, then 32 bytes of 2-bit codes (34 bytes)
  PTQ1_0 = 143,  // ternary g128 base-3: qs[24], qh[2], fp16 d last (28 bytes)
};

// The on-disk layout of a type-42 (Q2_0) block. general.file_type does not
// distinguish them; gguf/ detects it from tensor geometry and data.
enum class Q2Layout : uint8_t {
  kG64,          // llama.cpp Q2_0: 64 weights, {fp16 d, qs[16]} = 18 bytes, value (code-1)*d
  kG128DFirst,   // PrismML's older layout: 128 weights, {fp16 d, qs[32]} = 34 bytes
  kG128QsFirst,  // OxiBonsai TQ2_0_g128: 128 weights, {qs[32], fp16 d} = 34 bytes
};

// "g64", "g128-d-first", "g128-qs-first" (the names `--q2-layout` accepts).
std::string_view q2_layout_name(Q2Layout layout);
std::optional<Q2Layout> parse_q2_layout(std::string_view name);

struct GgmlTypeTraits {
  std::string_view name;  // ggml's spelling: "F32", "Q8_0", "Q1_0", ...
  uint32_t block_size;    // weights per block (1 for plain types)
  uint32_t type_size;     // bytes per block
};

// Traits of a known type id, or nullopt for an unknown / removed id. For Q2_0
// this is the g64 geometry; use q2_block_geometry for the others.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id);

// Block geometry of a Q2_0 layout: {weights per block, bytes per block}.
GgmlTypeTraits q2_block_geometry(Q2Layout layout);

// ggml's name for a type id, or "UNKNOWN(<id>)".
std::string ggml_type_name(uint32_t type_id);

}  // namespace bonsai::core
