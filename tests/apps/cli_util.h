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

// `ENV bonsai ARGS <STDIN` (env: shell assignments such as "X='y' "; stdin:
// the bytes piped in, from a file, so stdin is not a terminal; empty: /dev/null).
inline CliResult run_bonsai_stdin(const std::string& args, const std::string& stdin_text, const std::string& env = "") {
  namespace fs = std::filesystem;
  static int n = 0;
  const fs::path dir =
      fs::temp_directory_path() / ("bonsai_apps_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  fs::create_directories(dir);
  const std::string bin = (binary_dir() / "apps" / "bonsai" / "bonsai").string();
  std::string in = "/dev/null";
  if (!stdin_text.empty()) {
    in = (dir / "in").string();
    std::ofstream(in, std::ios::binary) << stdin_text;
  }
  const std::string cmd = env + "'" + bin + "' " + args + " <'" + in + "' >'" + (dir / "out").string() + "' 2>'" +
                          (dir / "err").string() + "'";
  CliResult r;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp_file(dir / "out");
  r.err = slurp_file(dir / "err");
  fs::remove_all(dir);
  return r;
}

// `ENV bonsai ARGS </dev/null`.
inline CliResult run_bonsai(const std::string& args, const std::string& env = "") {
  return run_bonsai_stdin(args, "", env);
}

}  // namespace bonsai::test
