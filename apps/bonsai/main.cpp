// bonsai: inference runtime and OpenAI-compatible server for Bonsai (Qwen3
// 1-bit / ternary GGUF) models. Subcommands live in cmd_*.cpp.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "apps/bonsai/commands.h"
#include "apps/bonsai/hub_cli.h"  // register_pull, register_list

namespace bonsai::app {
namespace {
int g_exit_code = 0;
}
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }
}  // namespace bonsai::app

int main(int argc, char** argv) {
  CLI::App app{"bonsai: run and serve Bonsai (Qwen3, Q1_0/Q2_0 GGUF) language models"};
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
  // llama.cpp's multi-letter single-dash flags, which CLI11 cannot register
  // (it takes one letter after a single dash): after the command word they
  // are passed on as their long names -- `-ctk` / `-ctv` as --cache-type-k /
  // --cache-type-v in run, chat, serve and bench (llama-cli, llama-server and
  // llama-bench all take them), llama-bench's `-pg PP,TG` as bench's --pg,
  // llama-server's `-np N` as serve's --parallel, llama.cpp's `-hf` /
  // `-hff` as --hf-repo / --hf-file in run, chat, serve, bench, info and
  // pull, and llama-server's / llama-cli's `-md FILE` as --model-draft in
  // run, chat and serve (CLI11 would read it as `-m d`): the draft model of
  // speculative decoding (issue 29).
  // Only a whole argument is rewritten (a prompt that merely contains
  // "-ctk" is untouched).
  std::vector<char*> args(argv, argv + argc);
  char pg_long[] = "--pg", ctk_long[] = "--cache-type-k", ctv_long[] = "--cache-type-v", np_long[] = "--parallel",
       md_long[] = "--model-draft";
  char hf_long[] = "--hf-repo", hff_long[] = "--hf-file";
  const char* command = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (command == nullptr) {
      for (const char* c : {"run", "chat", "serve", "bench", "info", "pull"}) {
        if (std::strcmp(argv[i], c) == 0) command = c;
      }
      continue;
    }
    if (std::strcmp(argv[i], "-hf") == 0 && std::strcmp(command, "pull") != 0)
      args[static_cast<size_t>(i)] = hf_long;
    else if (std::strcmp(argv[i], "-hff") == 0)
      args[static_cast<size_t>(i)] = hff_long;
    else if (std::strcmp(command, "info") == 0 || std::strcmp(command, "pull") == 0)
      continue;  // the other rewrites are for the model-running commands
    else if (std::strcmp(argv[i], "-ctk") == 0)
      args[static_cast<size_t>(i)] = ctk_long;
    else if (std::strcmp(argv[i], "-ctv") == 0)
      args[static_cast<size_t>(i)] = ctv_long;
    else if (std::strcmp(command, "bench") == 0 && std::strcmp(argv[i], "-pg") == 0)
      args[static_cast<size_t>(i)] = pg_long;
    else if (std::strcmp(command, "serve") == 0 && std::strcmp(argv[i], "-np") == 0)
      args[static_cast<size_t>(i)] = np_long;
    else if (std::strcmp(command, "bench") != 0 && std::strcmp(argv[i], "-md") == 0)
      args[static_cast<size_t>(i)] = md_long;
    else if (std::strcmp(command, "serve") == 0 && std::strcmp(argv[i], "--jinja") == 0)
      args[static_cast<size_t>(i)] = nullptr;  // llama-server's --jinja: serve's default (--no-jinja turns it off)
  }
  std::erase(args, nullptr);
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
