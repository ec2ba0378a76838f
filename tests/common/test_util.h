// Shared test helpers: where ../shared lives, and the rule that a missing
// fixture fails under CI=true instead of skipping.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace bonsai::test {

// The shared fixtures folder: env BONSAI_SHARED if set, else the path CMake
// recorded (../shared beside the source tree).
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("BONSAI_SHARED"); env != nullptr && *env != '\0') return env;
  return BONSAI_SHARED_DIR;
}

// A file under ../shared, e.g. shared_path("fixtures/qwen3-tiny-q1_0.gguf").
inline std::string shared_path(const std::string& rel) { return (shared_dir() / rel).string(); }

// The build tree (to find the `bonsai` binary in end-to-end tests).
inline std::filesystem::path binary_dir() { return BONSAI_BINARY_DIR; }

inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

}  // namespace bonsai::test

// Use at the top of a test: skips when the fixture is missing, but fails under CI=true.
#define BONSAI_REQUIRE_FILE(path)                                                   \
  do {                                                                              \
    if (!std::filesystem::exists(path)) {                                           \
      if (::bonsai::test::running_in_ci()) FAIL() << "missing fixture: " << (path); \
      GTEST_SKIP() << "missing fixture: " << (path);                                \
    }                                                                               \
  } while (0)
