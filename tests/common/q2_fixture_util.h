// Test helper: an "ambiguous" copy of a g128 Q2_0 fixture, the case
// --q2-layout / BONSAI_Q2_LAYOUT exist for (the detector refuses it; a forced
// byte order is honoured). Needs bonsai_gguf.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace bonsai::test {

// Copies the g128-d-first Q2_0 GGUF `src` to `dst` with every 34-byte block of
// every type-42 tensor replaced by one that is valid under both g128 byte
// orders: bytes 0-1 and 32-33 hold fp16 0.015625 (0x2400, whose bytes 0x00 /
// 0x24 are also code bytes without a 2-bit 3) and bytes 2-31 codes 0..2.
// Returns an empty string on success, else what went wrong.
inline std::string write_ambiguous_g128_copy(const std::string& src, const std::string& dst) {
  gguf::OpenOptions opt;
  opt.q2_layout = core::Q2Layout::kG128DFirst;
  auto f = gguf::File::open(src, opt);
  if (!f) return f.error().message;
  std::ifstream in(src, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    if (t.type_id != static_cast<uint32_t>(core::GgmlType::Q2_0)) continue;
    const uint64_t at = (*f)->data_offset() + t.offset;
    for (uint64_t b = 0; b < t.n_bytes / 34; ++b) {
      char* blk = bytes.data() + at + b * 34;
      blk[0] = 0x00;
      blk[1] = 0x24;
      for (int i = 2; i < 32; ++i) blk[i] = static_cast<char>(i % 3 == 0 ? 0x24 : (i % 3 == 1 ? 0x19 : 0x06));
      blk[32] = 0x00;
      blk[33] = 0x24;
    }
  }
  std::ofstream out(dst, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return out ? std::string() : dst + ": cannot write";
}

}  // namespace bonsai::test
