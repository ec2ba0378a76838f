// libFuzzer target for the GGUF reader (scripts/fuzz.sh builds and runs it).
// Parses the input as a GGUF file with each Q2 layout option; whatever the
// bytes, the reader must return a value or an error and never crash, leak or
// read outside the buffer (ASan/UBSan). Accepted files are checked for the
// reader's invariants: every tensor lies inside the buffer, every accessor works.
// The input cut in two is also read as a two-part split set (File::parse_split).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "gguf/gguf.h"

namespace {

void check_file(const bonsai::gguf::File& f) {
  for (const auto& t : f.tensors()) {
    if (t.part >= f.parts().size()) std::abort();
    const auto& m = *f.parts()[t.part].mapping;
    const uint8_t* begin = m.data();
    if (t.data < begin || t.data + t.n_bytes > begin + m.size() || t.n_bytes == 0) std::abort();
    if (f.find_tensor(t.name) == nullptr) std::abort();
    volatile uint8_t sink = t.data[t.n_bytes - 1];  // touch the last byte (ASan checks it)
    (void)sink;
  }
  for (const auto& kv : f.metadata()) {
    if (f.find(kv.key) == nullptr) std::abort();
    (void)f.get<uint32_t>(kv.key);
    (void)f.get<std::string>(kv.key);
    (void)f.get<float>(kv.key);
    (void)f.get_string_array(kv.key);
    (void)f.get_i32_array(kv.key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto mapping = bonsai::core::MappedFile::from_bytes(std::span<const uint8_t>(data, size), "fuzz.gguf");
  bonsai::gguf::OpenOptions opt;
  // The first byte (when present) picks detection or a forced layout, so the
  // forced-layout paths are fuzzed too.
  if (size > 0) {
    switch (data[size - 1] & 3) {
      case 1:
        opt.q2_layout = bonsai::core::Q2Layout::kG64;
        break;
      case 2:
        opt.q2_layout = bonsai::core::Q2Layout::kG128DFirst;
        break;
      case 3:
        opt.q2_layout = bonsai::core::Q2Layout::kG128QsFirst;
        break;
      default:
        break;
    }
  }
  auto f = bonsai::gguf::File::parse(mapping, opt);
  if (f) check_file(**f);
  // Two parts: the cut is at a multiple of 8 bytes taken from the second-last byte's value.
  if (size > 2) {
    const size_t cut = std::min<size_t>(size, static_cast<size_t>(data[size - 2]) * 8);
    auto a = bonsai::core::MappedFile::from_bytes(std::span<const uint8_t>(data, cut), "fuzz-00001-of-00002.gguf");
    auto b = bonsai::core::MappedFile::from_bytes(std::span<const uint8_t>(data + cut, size - cut),
                                                  "fuzz-00002-of-00002.gguf");
    auto s = bonsai::gguf::File::parse_split({a, b}, opt);
    if (s) check_file(**s);
  }
  return 0;
}
