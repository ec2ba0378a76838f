// Test helper: splits a GGUF into gguf-split parts (gguf::write_split), for
// shell tests that need split files made at run time (tests/hub/hub_test.sh).
//   gguf_split_tool [--no-tensor-first-split] N IN.gguf OUT_PREFIX
// Writes OUT_PREFIX-00001-of-0000N.gguf ... and prints their paths, one a
// line. Exit 0 on success, 1 on an error (printed), 2 on bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gguf/gguf.h"

int main(int argc, char** argv) {
  int i = 1;
  bool no_tensors_in_first = false;
  if (i < argc && std::string(argv[i]) == "--no-tensor-first-split") {
    no_tensors_in_first = true;
    ++i;
  }
  if (argc - i != 3) {
    std::fprintf(stderr, "usage: %s [--no-tensor-first-split] N IN.gguf OUT_PREFIX\n", argv[0]);
    return 2;
  }
  char* end = nullptr;
  const long n = std::strtol(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || n < 1 || n > 65535) {
    std::fprintf(stderr, "%s: N must be 1..65535, got '%s'\n", argv[0], argv[i]);
    return 2;
  }
  // parse (not open): a file to split is read as the one file it is.
  auto mapping = bonsai::core::MappedFile::open(argv[i + 1]);
  if (!mapping) {
    std::fprintf(stderr, "%s\n", mapping.error().message.c_str());
    return 1;
  }
  auto src = bonsai::gguf::File::parse(*mapping);
  if (!src) {
    std::fprintf(stderr, "%s\n", src.error().message.c_str());
    return 1;
  }
  auto paths = bonsai::gguf::write_split(**src, static_cast<int>(n), argv[i + 2], no_tensors_in_first);
  if (!paths) {
    std::fprintf(stderr, "%s\n", paths.error().message.c_str());
    return 1;
  }
  for (const auto& p : *paths) std::printf("%s\n", p.c_str());
  return 0;
}
