// The number formats the kernels compute on: one definition each (issue 31).
// A format is its Format value, its on-disk block struct, one row of
// kFormatDefs (geometry, ggml type, the family of kernels that computes it)
// and its reference block decode (formats.cpp), which every tier is tested
// against. The tiers, the packer, the row (de)quantizers and the format
// queries of kernels.h read these rows; none of them restates a block size
// or a byte offset.
//
// Adding a format: a Format value and a kFormatDefs row here, its block
// decode in formats.cpp, its ggml type id in core/ggml_types.{h,cpp}. It
// then computes on every tier through the reference kernels (kernels.cpp
// sends a format a tier does not list in TierOps::formats to the reference
// tier); SIMD kernels and packings are added per tier where they pay.
//
// Block structs are bit-exact with ggml's definitions (llama.cpp
// ggml-common.h: block_q8_0, block_q1_0, block_q2_0) and with the two other
// type-42 layouts seen in the wild (PrismML's older 128-weight Q2_0,
// OxiBonsai's TQ2_0_g128), as written by ../shared/tools/make_qwen3_gguf.py.
// All structs are packed byte arrays (alignment 1): blocks sit back to back
// in a tensor, so an fp16 scale can be at any address. Read scales with
// load_fp16() rather than through a uint16_t lvalue.
//
// SIMD tier files include this header with their own ISA flags: use the
// table only in constant expressions there (template arguments,
// `constexpr` locals), so that no inline code of this header is emitted
// with an ISA the portable callers may not have (see internal.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "core/fp16.h"
#include "core/ggml_types.h"

namespace bonsai::kernels {

// A weight/row format the kernels compute on. The three Q2_0 layouts that
// share ggml type id 42 are distinct formats here. Values index kFormatDefs.
enum class Format : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,        // 32 weights: fp16 d, int8 qs[32]                (34 bytes)
  kQ1_0,        // 128 weights: fp16 d, qs[16] sign bits          (18 bytes)
  kQ2_0,        // 64 weights: fp16 d, qs[16] 2-bit codes          (18 bytes)
  kQ2_0G128D,   // 128 weights: fp16 d, qs[32]                     (34 bytes)
  kQ2_0G128Qs,  // 128 weights: qs[32], fp16 d                     (34 bytes)
  kPQ2_0,       // 128 weights: fp16 d, qs[32] (type 142)          (34 bytes)
  kPTQ1_0,      // 128 weights: qs[24], qh[2] base-3, fp16 d       (28 bytes)
};
inline constexpr size_t kFormatCount = 10;  // values of Format (0 .. kFormatCount - 1)

// How a format's weights meet the activations: which activation layout a
// tier prepares and which family of kernels runs the product.
enum class Family : uint8_t {
  kFloat,  // F32 / F16 / BF16: float activations, fp32 arithmetic
  kQ8,     // 8-bit quants: Q8_0 activations, chunks of 4
  kSign,   // 1-bit signs (+-d): chunks of 32, kernels walk 128-weight units
  kCode2,  // 2-bit codes, value code - 1 (ternary): chunks of 16, 64-weight units
  kTrit,   // base-3 digits, 5 per byte (PTQ1_0): chunks of 16; decoded to int8 digits in registers
};

// One format's definition. Byte offsets are within a block.
struct FormatDef {
  std::string_view name;     // "Q1_0", "Q2_0(g128-d-first)", ... (format_name)
  core::GgmlType ggml_type;  // the tensor type id that stores it
  core::Q2Layout q2_layout;  // its type-42 layout (kG64 for every other type)
  int64_t block_elems;       // weights per block (1 for float formats)
  size_t block_bytes;        // bytes per block (bytes per value for float formats)
  Family family;             // kernels and activation layout
  int64_t chunk_elems;       // W of internal.h's canonical order (1 for float formats)
  int qs_offset;             // offset of the weights (bits, codes, quants)
  int d_offset;              // offset of the fp16 scale d
  bool code3_is_zero;        // kCode2: code 3 decodes as 0 (g128 layouts), not +2 (g64)
  // Reference decode of one block (formats.cpp): writes block_elems small
  // integer weights to w (+-1, code values, or int8 quants) and returns d,
  // so that weight j = w[j] * d. nullptr for float formats.
  float (*decode_block)(const uint8_t* block, int8_t* w);
};

float decode_q8_0(const uint8_t* block, int8_t* w);
float decode_q1_0(const uint8_t* block, int8_t* w);
float decode_q2_0(const uint8_t* block, int8_t* w);         // g64: codes 0..3 -> -1, 0, 1, 2
float decode_q2_0_g128d(const uint8_t* block, int8_t* w);   // code 3 -> 0
float decode_q2_0_g128qs(const uint8_t* block, int8_t* w);  // code 3 -> 0
float decode_pq2_0(const uint8_t* block, int8_t* w);        // codes as g64 (3 -> 2)
float decode_ptq1_0(const uint8_t* block, int8_t* w);       // digits 0, 1, 2 -> -1, 0, 1
// The inverse of decode_ptq1_0: writes the 28-byte PTQ1_0 block (`out`) of
// 128 weights w[e] in {-1, 0, +1} (digit w[e] + 1, in the format's weight
// order; BlockPTQ1_0) with the fp16 scale bits `d`. A qs byte of 5 digits
// is ceil(q * 256 / 243), a qh byte of 4 is ceil(3q * 256 / 243) (q the
// digits read most significant first), the encoding of
// ../shared/fixtures/README.md "Weight formats" (ggml's TQ1_0 packing).
// Values of w outside {-1, 0, 1} are a caller error (clamped).
void encode_ptq1_0(const int8_t* w, uint16_t d, uint8_t* out);

// Indexed by Format. Sources: ggml type_traits (llama.cpp ggml.c) for the
// geometry of Q8_0 / Q1_0 / Q2_0; OxiBonsai's TQ2_0_g128 and PrismML's
// converter for the g128 layouts; ../shared/fixtures/README.md "Weight
// formats" for PQ2_0 and PTQ1_0 (PrismML's fork); internal.h for the chunk
// widths (PQ2_0 and PTQ1_0 use the Q2_0 chunks, so files of the same
// weights in Q2_0 g64, PQ2_0 and PTQ1_0 give bit-identical products).
inline constexpr FormatDef kFormatDefs[kFormatCount] = {
    {"F32", core::GgmlType::F32, core::Q2Layout::kG64, 1, 4, Family::kFloat, 1, 0, 0, false, nullptr},
    {"F16", core::GgmlType::F16, core::Q2Layout::kG64, 1, 2, Family::kFloat, 1, 0, 0, false, nullptr},
    {"BF16", core::GgmlType::BF16, core::Q2Layout::kG64, 1, 2, Family::kFloat, 1, 0, 0, false, nullptr},
    {"Q8_0", core::GgmlType::Q8_0, core::Q2Layout::kG64, 32, 34, Family::kQ8, 4, 2, 0, false, decode_q8_0},
    {"Q1_0", core::GgmlType::Q1_0, core::Q2Layout::kG64, 128, 18, Family::kSign, 32, 2, 0, false, decode_q1_0},
    {"Q2_0", core::GgmlType::Q2_0, core::Q2Layout::kG64, 64, 18, Family::kCode2, 16, 2, 0, false, decode_q2_0},
    {"Q2_0(g128-d-first)", core::GgmlType::Q2_0, core::Q2Layout::kG128DFirst, 128, 34, Family::kCode2, 16, 2, 0, true,
     decode_q2_0_g128d},
    {"Q2_0(g128-qs-first)", core::GgmlType::Q2_0, core::Q2Layout::kG128QsFirst, 128, 34, Family::kCode2, 16, 0, 32,
     true, decode_q2_0_g128qs},
    {"PQ2_0", core::GgmlType::PQ2_0, core::Q2Layout::kG64, 128, 34, Family::kCode2, 16, 2, 0, false, decode_pq2_0},
    {"PTQ1_0", core::GgmlType::PTQ1_0, core::Q2Layout::kG64, 128, 28, Family::kTrit, 16, 0, 26, false, decode_ptq1_0},
};

// The largest block_elems of any format (a buffer for one decoded block).
inline constexpr int64_t kMaxBlockElems = 128;
static_assert(
    [] {
      for (const FormatDef& d : kFormatDefs)
        if (d.block_elems > kMaxBlockElems) return false;
      return true;
    }(),
    "kMaxBlockElems: a format's block is larger");

// The definition of f (out of line: safe to call from any translation unit).
const FormatDef& format_def(Format f);

// The definition of F, for constant expressions (template arguments).
template <Format F>
inline constexpr const FormatDef& kDef = kFormatDefs[static_cast<size_t>(F)];

// Weights per block of the formats the quantizers and decodes name (from the table).
inline constexpr int kQ8_0Elems = static_cast<int>(kDef<Format::kQ8_0>.block_elems);  // also the activation sub-block
inline constexpr int kQ1_0Elems = static_cast<int>(kDef<Format::kQ1_0>.block_elems);
inline constexpr int kQ2_0Elems = static_cast<int>(kDef<Format::kQ2_0>.block_elems);  // llama.cpp Q2_0 (g64)
inline constexpr int kQ2G128Elems = static_cast<int>(kDef<Format::kQ2_0G128D>.block_elems);

// Unit geometry of a 1- or 2-bit format as the SIMD kernels and the packer
// walk a row: units of 128 weights (kSign) or 64 (kCode2, so a 128-weight
// g128 block is two units sharing one d), each with 16 bytes of bits/codes.
// For unit b of a row: its bits/codes at unit_qs(b), its fp16 d at
// unit_d(b) (bytes from the row start; qs_at / d_at: the same as pointers).
// Always inlined: tier files with different ISA flags use it (see the
// header comment).
template <Format F>
struct UnitGeo {
  static constexpr const FormatDef& kFmt = kDef<F>;
  static constexpr int kElems = kFmt.family == Family::kSign ? 128 : 64;         // weights per unit
  static constexpr int kBytes = static_cast<int>(kFmt.block_bytes);              // bytes per block
  static constexpr int kQs = kFmt.qs_offset, kD = kFmt.d_offset;                 // offsets in a block
  static constexpr int kPlanes = kFmt.family == Family::kSign ? 8 : 4;           // weights per byte
  static constexpr int kPerBlock = static_cast<int>(kFmt.block_elems) / kElems;  // units per block: 1 or 2
  static_assert(kFmt.family == Family::kSign || kFmt.family == Family::kCode2, "UnitGeo: 1- or 2-bit formats");
  static_assert(kPerBlock == 1 || kPerBlock == 2, "UnitGeo: a block is one or two units");
  [[gnu::always_inline]] static constexpr size_t unit_qs(int64_t b) {
    if constexpr (kPerBlock == 2) {
      return static_cast<size_t>(b >> 1) * kBytes + kQs + (b & 1) * 16;
    } else {
      return static_cast<size_t>(b) * kBytes + kQs;
    }
  }
  [[gnu::always_inline]] static constexpr size_t unit_d(int64_t b) {
    if constexpr (kPerBlock == 2) {
      return static_cast<size_t>(b >> 1) * kBytes + kD;
    } else {
      return static_cast<size_t>(b) * kBytes + kD;
    }
  }
  // The same as pointers into a row.
  [[gnu::always_inline]] static const uint8_t* qs_at(const uint8_t* row, int64_t b) { return row + unit_qs(b); }
  [[gnu::always_inline]] static const uint8_t* d_at(const uint8_t* row, int64_t b) { return row + unit_d(b); }
};

// Whether F has unit geometry (a kSign or kCode2 format).
template <Format F>
inline constexpr bool kHasUnits = kDef<F>.family == Family::kSign || kDef<F>.family == Family::kCode2;

// Calls fn(std::integral_constant<Format, F>{}) with F == f, so that code
// generic over formats is instantiated per format from one switch: the only
// runtime-to-template dispatch on a Format (every branch of fn must return
// the same type). Always inlined, as UnitGeo.
template <class Fn>
[[gnu::always_inline]] inline decltype(auto) visit_format(Format f, Fn&& fn) {
  using enum Format;
  switch (f) {
    case kF32:
      return fn(std::integral_constant<Format, kF32>{});
    case kF16:
      return fn(std::integral_constant<Format, kF16>{});
    case kBF16:
      return fn(std::integral_constant<Format, kBF16>{});
    case kQ8_0:
      return fn(std::integral_constant<Format, kQ8_0>{});
    case kQ1_0:
      return fn(std::integral_constant<Format, kQ1_0>{});
    case kQ2_0:
      return fn(std::integral_constant<Format, kQ2_0>{});
    case kQ2_0G128D:
      return fn(std::integral_constant<Format, kQ2_0G128D>{});
    case kQ2_0G128Qs:
      return fn(std::integral_constant<Format, kQ2_0G128Qs>{});
    case kPQ2_0:
      return fn(std::integral_constant<Format, kPQ2_0>{});
    case kPTQ1_0:
      return fn(std::integral_constant<Format, kPTQ1_0>{});
  }
  return fn(std::integral_constant<Format, kF32>{});  // (not a Format value)
}

// A set of formats as bits: bit f for Format f (TierOps::formats).
constexpr uint32_t format_bit(Format f) { return uint32_t{1} << static_cast<unsigned>(f); }
// The bits of every format of family `fam`.
constexpr uint32_t family_bits(Family fam) {
  uint32_t bits = 0;
  for (size_t i = 0; i < kFormatCount; ++i)
    if (kFormatDefs[i].family == fam) bits |= uint32_t{1} << i;
  return bits;
}
inline constexpr uint32_t kAllFormats = (uint32_t{1} << kFormatCount) - 1;

// Out-of-line UnitGeo queries for a runtime Format (the packer's): weights
// per unit, units per block, and the byte offsets unit_qs / unit_d of unit b
// of a row; 0 for a format without units.
int64_t unit_elems(Format f);
int64_t units_per_block(Format f);
size_t unit_qs_offset(Format f, int64_t b);
size_t unit_d_offset(Format f, int64_t b);

// Q8_0 (ggml type 8): x[j] = d * qs[j].
struct BlockQ8_0 {
  uint8_t d[2];   // fp16 scale, little endian
  int8_t qs[32];  // signed quants
};

// Q1_0 (ggml type 41): x[j] = ((qs[j/8] >> (j%8)) & 1) ? +d : -d, j in [0,128).
struct BlockQ1_0 {
  uint8_t d[2];
  uint8_t qs[16];
};

// Q2_0 g64 (ggml type 42, llama.cpp): code j = (qs[j/4] >> (2*(j%4))) & 3,
// x[j] = (code - 1) * d, so codes 0,1,2,3 -> -d, 0, +d, +2d. j in [0,64).
struct BlockQ2_0 {
  uint8_t d[2];
  uint8_t qs[16];
};

// Q2_0 g128, d first (PrismML's older layout): same code packing over 128
// weights, qs[32]. Ternary only: codes 0,1,2 -> -d,0,+d; code 3 (never
// written by valid files) decodes as 0, as OxiBonsai's TQ2_0_g128 defines it.
struct BlockQ2_0G128D {
  uint8_t d[2];
  uint8_t qs[32];
};

// Q2_0 g128, qs first (OxiBonsai TQ2_0_g128): qs[32] then fp16 d; codes as
// BlockQ2_0G128D (code 3 -> 0).
struct BlockQ2_0G128Qs {
  uint8_t qs[32];
  uint8_t d[2];
};

// PQ2_0 (type 142, PrismML's fork): the bytes of BlockQ2_0G128D, with the
// g64 code rule (x[j] = (code - 1) * d, code 3 -> +2d, never written).
struct BlockPQ2_0 {
  uint8_t d[2];
  uint8_t qs[32];
};

// PTQ1_0 (type 143, PrismML's fork): 128 ternary weights as base-3 digits
// t (0, 1, 2 -> -d, 0, +d). A qs byte holds 5 digits, byte = ceil(q * 256 /
// 243) with q = sum t_n * 3^(4-n); digit n of byte b is ((uint8)(b * 3^n)
// * 3) >> 8. A qh byte holds 4 digits the same way (q * 3, its 5th digit 0).
// Weight e < 80: digit e/16 of qs[e % 16]; 80 <= e < 120: digit (e-80)/8 of
// qs[16 + (e-80) % 8]; e >= 120: digit (e-120)/2 of qh[(e-120) % 2].
struct BlockPTQ1_0 {
  uint8_t qs[24];
  uint8_t qh[2];
  uint8_t d[2];  // fp16, last
};

// The structs and the table agree.
template <class B, Format F>
constexpr bool block_matches() {
  return sizeof(B) == kDef<F>.block_bytes && offsetof(B, qs) == static_cast<size_t>(kDef<F>.qs_offset) &&
         offsetof(B, d) == static_cast<size_t>(kDef<F>.d_offset);
}
static_assert(block_matches<BlockQ8_0, Format::kQ8_0>());
static_assert(block_matches<BlockQ1_0, Format::kQ1_0>());
static_assert(block_matches<BlockQ2_0, Format::kQ2_0>());
static_assert(block_matches<BlockQ2_0G128D, Format::kQ2_0G128D>());
static_assert(block_matches<BlockQ2_0G128Qs, Format::kQ2_0G128Qs>());
static_assert(block_matches<BlockPQ2_0, Format::kPQ2_0>());
static_assert(block_matches<BlockPTQ1_0, Format::kPTQ1_0>());

static_assert(kFormatCount == static_cast<size_t>(Format::kPTQ1_0) + 1, "kFormatCount: update with Format");

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
