// Runs the built `bonsai` binary for the CLI tests: stdout and stderr
// captured separately (each into a file, so a test sees exactly what a user's
// terminal or pipe would), with optional environment assignments.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/test_util.h"

namespace bonsai::test {

struct CliResult {
  int rc = -1;  // exit status; -1 if killed by a signal
  std::string out, err;
};

inline std::string slurp_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `ENV bonsai ARGS </dev/null` (env: shell assignments such as "X='y' ").
inline CliResult run_bonsai(const std::string& args, const std::string& env = "") {
  namespace fs = std::filesystem;
  static int n = 0;
  const fs::path dir =
      fs::temp_directory_path() / ("bonsai_apps_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  fs::create_directories(dir);
  const std::string bin = (binary_dir() / "apps" / "bonsai" / "bonsai").string();
  const std::string cmd = env + "'" + bin + "' " + args + " </dev/null >'" + (dir / "out").string() + "' 2>'" +
                          (dir / "err").string() + "'";
  CliResult r;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp_file(dir / "out");
  r.err = slurp_file(dir / "err");
  fs::remove_all(dir);
  return r;
}

}  // namespace bonsai::test
