// Reference block decodes and the out-of-line format queries of formats.h.
// Portable code (no ISA flags).
#include "kernels/formats.h"

#include <algorithm>
#include <cstring>

namespace bonsai::kernels {

namespace {

// 2-bit codes j = (qs[j/4] >> (2*(j%4))) & 3 of `elems` weights, value code - 1
// (code 3: +2, or 0 where code3_is_zero).
void decode_codes(const uint8_t* qs, int elems, bool code3_is_zero, int8_t* w) {
  for (int j = 0; j < elems; ++j) {
    w[j] = static_cast<int8_t>(q2_code_value((qs[j / 4] >> (2 * (j % 4))) & 3, code3_is_zero));
  }
}

}  // namespace

float decode_q8_0(const uint8_t* block, int8_t* w) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(block);
  std::memcpy(w, b->qs, sizeof(b->qs));
  return load_fp16(b->d);
}

float decode_q1_0(const uint8_t* block, int8_t* w) {
  const auto* b = reinterpret_cast<const BlockQ1_0*>(block);
  for (int j = 0; j < kQ1_0Elems; ++j) w[j] = ((b->qs[j / 8] >> (j % 8)) & 1) ? 1 : -1;
  return load_fp16(b->d);
}

float decode_q2_0(const uint8_t* block, int8_t* w) {
  const auto* b = reinterpret_cast<const BlockQ2_0*>(block);
  decode_codes(b->qs, kQ2_0Elems, false, w);
  return load_fp16(b->d);
}

float decode_q2_0_g128d(const uint8_t* block, int8_t* w) {
  const auto* b = reinterpret_cast<const BlockQ2_0G128D*>(block);
  decode_codes(b->qs, kQ2G128Elems, true, w);
  return load_fp16(b->d);
}

float decode_q2_0_g128qs(const uint8_t* block, int8_t* w) {
  const auto* b = reinterpret_cast<const BlockQ2_0G128Qs*>(block);
  decode_codes(b->qs, kQ2G128Elems, true, w);
  return load_fp16(b->d);
}

float decode_pq2_0(const uint8_t* block, int8_t* w) {
  const auto* b = reinterpret_cast<const BlockPQ2_0*>(block);
  decode_codes(b->qs, kQ2G128Elems, false, w);
  return load_fp16(b->d);
}

namespace {

// Digit n (0 = most significant) of a base-3 byte (BlockPTQ1_0).
int trit(uint8_t b, int n) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const auto scaled = static_cast<uint8_t>(b * kPow3[n]);  // mod 256
  return (scaled * 3) >> 8;
}

}  // namespace

float decode_ptq1_0(const uint8_t* block, int8_t* w) {
  const auto* b = reinterpret_cast<const BlockPTQ1_0*>(block);
  for (int e = 0; e < 128; ++e) {
    int t;
    if (e < 80) {
      t = trit(b->qs[e % 16], e / 16);
    } else if (e < 120) {
      t = trit(b->qs[16 + (e - 80) % 8], (e - 80) / 8);
    } else {
      t = trit(b->qh[(e - 120) % 2], (e - 120) / 2);
    }
    w[e] = static_cast<int8_t>(t - 1);
  }
  return load_fp16(b->d);
}

void encode_ptq1_0(const int8_t* w, uint16_t d, uint8_t* out) {
  auto* b = reinterpret_cast<BlockPTQ1_0*>(out);
  const auto digit = [w](int e) { return std::clamp<int>(w[e], -1, 1) + 1; };
  // count digits, most significant first: ceil(q * 256 / 243) for 5, of 3q for 4.
  const auto pack = [&](int first, int stride, int count) {
    int q = 0;
    for (int n = 0; n < count; ++n) q = q * 3 + digit(first + stride * n);
    if (count == 4) q *= 3;
    return static_cast<uint8_t>((q * 256 + 242) / 243);
  };
  for (int i = 0; i < 16; ++i) b->qs[i] = pack(i, 16, 5);          // weights i, i + 16, ..., i + 64
  for (int i = 0; i < 8; ++i) b->qs[16 + i] = pack(80 + i, 8, 5);  // weights 80 + i, ..., 80 + i + 32
  for (int i = 0; i < 2; ++i) b->qh[i] = pack(120 + i, 2, 4);      // weights 120 + i, ..., 120 + i + 6
  std::memcpy(b->d, &d, sizeof d);
}

const FormatDef& format_def(Format f) {
  const auto i = static_cast<size_t>(f);
  return kFormatDefs[i < kFormatCount ? i : 0];
}

int64_t unit_elems(Format f) {
  return visit_format(f, [](auto fc) -> int64_t {
    if constexpr (kHasUnits<fc.value>) return UnitGeo<fc.value>::kElems;
    return 0;
  });
}

int64_t units_per_block(Format f) {
  return visit_format(f, [](auto fc) -> int64_t {
    if constexpr (kHasUnits<fc.value>) return UnitGeo<fc.value>::kPerBlock;
    return 0;
  });
}

size_t unit_qs_offset(Format f, int64_t b) {
  return visit_format(f, [b](auto fc) -> size_t {
    if constexpr (kHasUnits<fc.value>) return UnitGeo<fc.value>::unit_qs(b);
    return 0;
  });
}

size_t unit_d_offset(Format f, int64_t b) {
  return visit_format(f, [b](auto fc) -> size_t {
    if constexpr (kHasUnits<fc.value>) return UnitGeo<fc.value>::unit_d(b);
    return 0;
  });
}

}  // namespace bonsai::kernels
