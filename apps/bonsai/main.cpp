// bonsai: inference runtime and OpenAI-compatible server for Bonsai (Qwen3
// 1-bit / ternary GGUF) models. Subcommands live in cmd_*.cpp.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "apps/bonsai/commands.h"
#include "apps/bonsai/hub_cli.h"       // register_pull, register_list
#include "apps/bonsai/llama_compat.h"  // rewrite_llama_args

namespace bonsai::app {
namespace {
int g_exit_code = 0;
}
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }
}  // namespace bonsai::app

int main(int argc, char** argv) {
  CLI::App app{"bonsai: run and serve Bonsai (Qwen3, qwen35; Q1_0/Q2_0/PQ2_0/PTQ1_0 GGUF) language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "bonsai 0.1.0");
  bonsai::app::register_run(app);
  bonsai::app::register_serve(app);
  bonsai::app::register_info(app);
  bonsai::app::register_validate(app);
  bonsai::app::register_synth(app);
  bonsai::app::register_tokenize(app);
  bonsai::app::register_logits(app);
  bonsai::app::register_bench(app);
  bonsai::app::register_pull(app);
  bonsai::app::register_list(app);
  // The exit status rule (README: "Exit status"), at the end of every --help.
  const char* exit_status =
      "\nExit status: 0 success; 1 runtime failure (a model file that cannot be read or loaded, a download or "
      "bind that fails); 2 usage error (an unknown flag, a flag or config file value that is bad or out of range, "
      "a bad BONSAI_* environment variable).";
  app.footer(exit_status);
  for (CLI::App* sub : app.get_subcommands({})) sub->footer(exit_status);
  // llama.cpp's multi-letter single-dash flags (-ngl, -hf, -ctk, -np, -sys, ...),
  // which CLI11 cannot register, passed on as their long names.
  std::vector<char*> args = bonsai::app::rewrite_llama_args(argc, argv);
  argc = static_cast<int>(args.size());
  // Commands report errors as messages and exit codes; this is the last line
  // of defence so that an exception nobody expected (std::bad_alloc on a huge
  // request, std::system_error from the OS) still ends with a message and
  // exit 1 instead of std::terminate's abort.
  try {
    try {
      app.parse(argc, args.data());
    } catch (const CLI::ParseError& e) {
      // --help / --version print and exit 0. A usage error CLI11 finds (an
      // unknown option, a value that does not convert, an option given
      // twice, no command) exits 2, as the commands' own usage errors
      // (`run -p X -f FILE`) do, not with CLI11's 101..117 codes.
      return app.exit(e) == 0 ? 0 : 2;
    }
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "bonsai: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bonsai: fatal error: %s\n", e.what());
    return 1;
  }
  return bonsai::app::exit_code();
}
