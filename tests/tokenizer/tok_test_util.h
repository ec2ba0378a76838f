// Helpers for the tokenizer tests: load a tokenizer from a shared GGUF once
// per test binary, and read text fixtures.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace bonsai::tokenizer::testing {

// Tokenizer of ../shared/<rel>, loaded once; nullptr (with a test failure)
// when loading fails. Callers guard with BONSAI_REQUIRE_FILE first.
inline std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& rel) {
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  if (auto it = cache.find(rel); it != cache.end()) return it->second;
  auto file = gguf::File::open(test::shared_path(rel));
  if (!file) {
    ADD_FAILURE() << "open " << rel << ": " << file.error().message;
    return nullptr;
  }
  auto tok = Tokenizer::from_gguf(**file);
  if (!tok) {
    ADD_FAILURE() << "tokenizer " << rel << ": " << tok.error().message;
    return nullptr;
  }
  cache[rel] = *tok;
  return *tok;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline constexpr const char* kQwenGguf = "fixtures/qwen3-tiny-q1_0.gguf";
inline constexpr const char* kStoriesGguf = "models/stories260K/stories260K.gguf";
inline constexpr const char* kLlama2Gguf = "models/llama-2-tiny-random/llama-2-tiny-random.gguf";

}  // namespace bonsai::tokenizer::testing
