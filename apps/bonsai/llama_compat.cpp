#include "apps/bonsai/llama_compat.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <iostream>

namespace bonsai::app {
namespace {

// One rewrite: `from` (a whole argument after the command word) becomes
// `to` in the commands listed in `commands` (space-separated); `to` null:
// the argument is dropped.
struct Rewrite {
  const char* from;
  const char* to;
  const char* commands;
};

// Storage the rewritten argv points into (argv's entries are char*).
char kHfRepo[] = "--hf-repo", kHfFile[] = "--hf-file", kCtk[] = "--cache-type-k", kCtv[] = "--cache-type-v",
     kPg[] = "--pg", kNp[] = "--parallel", kMd[] = "--model-draft", kNgl[] = "--n-gpu-layers", kFa[] = "--flash-attn",
     kUb[] = "--ubatch-size", kNkvo[] = "--no-kv-offload", kSm[] = "--split-mode", kMg[] = "--main-gpu",
     kTs[] = "--tensor-split", kDev[] = "--device", kMmp[] = "--mmap", kSys[] = "--system", kCnv[] = "--conversation",
     kNoCnv[] = "--no-conversation", kCb[] = "--cont-batching", kNoCb[] = "--no-cont-batching",
     kLv[] = "--log-verbosity";

constexpr const char* kModelCommands = "run chat serve bench";
const Rewrite kRewrites[] = {
    {"-hf", kHfRepo, "run chat serve bench info"},  // pull takes the repository as its argument
    {"-hff", kHfFile, "run chat serve bench info pull"},
    {"-ctk", kCtk, kModelCommands},
    {"-ctv", kCtv, kModelCommands},
    {"-pg", kPg, "bench"},
    {"-np", kNp, "serve"},
    {"-md", kMd, "run chat serve"},  // the draft model (speculative decoding); CLI11 would read `-m d`
    {"-ngl", kNgl, kModelCommands},
    {"-fa", kFa, kModelCommands},
    {"-ub", kUb, kModelCommands},
    {"-nkvo", kNkvo, kModelCommands},
    {"-sm", kSm, kModelCommands},
    {"-mg", kMg, kModelCommands},
    {"-ts", kTs, kModelCommands},
    {"-dev", kDev, kModelCommands},
    {"-mmp", kMmp, "bench"},
    {"-sys", kSys, "run chat"},
    {"-cnv", kCnv, "run chat"},
    {"-no-cnv", kNoCnv, "run chat"},
    {"-lv", kLv, kModelCommands},
    {"-cb", kCb, "serve"},
    {"-nocb", kNoCb, "serve"},
    {"--jinja", nullptr, "serve"},  // llama-server's --jinja: serve's default (--no-jinja turns it off)
};

// Whether the space-separated word list `list` holds `word`.
bool has_word(std::string_view list, std::string_view word) {
  while (!list.empty()) {
    const size_t sp = list.find(' ');
    if (list.substr(0, sp) == word) return true;
    if (sp == std::string_view::npos) break;
    list.remove_prefix(sp + 1);
  }
  return false;
}

// The items of a comma list ("99,0" -> {"99", "0"}); `one`: a single item only.
std::vector<std::string_view> items(std::string_view s, bool one) {
  if (one) return {s};
  std::vector<std::string_view> out;
  while (true) {
    const size_t c = s.find(',');
    out.push_back(s.substr(0, c));
    if (c == std::string_view::npos) break;
    s.remove_prefix(c + 1);
  }
  return out;
}

bool is_int_at_least(std::string_view s, long long lo) {
  long long v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && v >= lo;
}

// A CLI11 validator: every item (one, or each of a comma list) passes `ok`;
// otherwise "expected <what>, got 'X'".
CLI::Validator item_check(bool one, bool (*ok)(std::string_view), std::string what) {
  return CLI::Validator(
      [one, ok, what](std::string& text) {
        for (const std::string_view item : items(text, one))
          if (!ok(item)) return "expected " + what + ", got '" + std::string(item) + "'";
        return std::string();
      },
      "");
}

bool gpu_layers_ok(std::string_view s) { return s == "all" || s == "auto" || is_int_at_least(s, -1); }
bool flash_attn_ok(std::string_view s) {
  for (const char* v : {"on", "off", "auto", "0", "1", "true", "false", "enabled", "disabled"})
    if (s == v) return true;
  return false;
}
bool positive_ok(std::string_view s) { return is_int_at_least(s, 1); }
bool non_negative_ok(std::string_view s) { return is_int_at_least(s, 0); }
bool split_mode_ok(std::string_view s) { return s == "none" || s == "layer" || s == "row"; }
bool bit_ok(std::string_view s) { return s == "0" || s == "1"; }

}  // namespace

std::vector<char*> rewrite_llama_args(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  const char* command = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (command == nullptr) {
      for (const char* c : {"run", "chat", "serve", "bench", "info", "pull"})
        if (std::strcmp(argv[i], c) == 0) command = c;
      continue;
    }
    // The value of a text flag is text, whatever it looks like
    // (`-p -ngl` asks about "-ngl"), as llama.cpp's parser takes it.
    bool is_value = false;
    for (const char* f : {"-p", "--prompt", "--system", "--system-prompt", "-sys", "--stop", "-a", "--alias"})
      is_value = is_value || std::strcmp(argv[i - 1], f) == 0;
    if (is_value) continue;
    for (const Rewrite& r : kRewrites) {
      if (std::strcmp(argv[i], r.from) != 0 || !has_word(r.commands, command)) continue;
      args[static_cast<size_t>(i)] = const_cast<char*>(r.to);
      if (r.to == nullptr) args[static_cast<size_t>(i)] = nullptr;
      break;
    }
  }
  std::erase(args, nullptr);
  return args;
}

void add_ignored_llama_flags(CLI::App* cmd, IgnoredLlamaFlags& f, LlamaCommand which) {
  const bool bench = which == LlamaCommand::kBench;
  const char* group = "llama.cpp compatibility (ignored: bonsai computes on the CPU)";
  auto add = [&](const std::string& names, std::vector<std::string>& into, const std::string& type,
                 const CLI::Validator& check, const std::string& help = "") {
    cmd->add_option(names, into, help)
        ->type_name(type)
        ->check(check)
        ->group(group)
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  const std::string list = bench ? " (a comma list)" : "";
  add("--n-gpu-layers,--gpu-layers", f.gpu_layers, "N", item_check(!bench, gpu_layers_ok, "N, all or auto" + list),
      "-ngl: layers on the GPU");
  cmd->add_option("--flash-attn", f.flash_attn, "-fa: flash attention")
      ->type_name("[on|off|auto]")
      ->expected(0, 1)
      ->check(item_check(!bench, flash_attn_ok, "on, off, auto, 0 or 1" + list))
      ->group(group);
  add("--ubatch-size", f.ubatch, "N", item_check(!bench, positive_ok, "a number of tokens >= 1" + list),
      "-ub: physical batch size");
  add("--split-mode", f.split_mode, "MODE", item_check(true, split_mode_ok, "none, layer or row"), "-sm");
  add("--main-gpu", f.main_gpu, "N", item_check(true, non_negative_ok, "a GPU index >= 0"), "-mg");
  add("--tensor-split", f.tensor_split, "N0,N1,...", CLI::Validator(), "-ts");
  add("--device", f.device, "DEVICES", CLI::Validator(), "-dev");
  cmd->add_flag("--no-kv-offload", f.no_kv_offload, "-nkvo")->group(group);
  cmd->add_flag("--mlock", f.mlock, "(the mapped weights stay in the page cache)")->group(group);
  if (bench) {
    add("--mmap", f.mmap, "0|1", item_check(false, bit_ok, "0 or 1 (a comma list)"), "-mmp (bonsai always maps)");
    add("-b,--batch-size", f.batch, "N", item_check(false, positive_ok, "a number of tokens >= 1 (a comma list)"));
  } else {
    cmd->add_flag("--no-mmap", f.no_mmap, "(bonsai always maps the file)")->group(group);
  }
  // Logging (llama.cpp's common flags): bonsai's log is its stderr (serve: and
  // its stdout), one level.
  const char* log_group = "Logging (llama.cpp's flags)";
  cmd->add_option("--log-file", f.log_file,
                  which == LlamaCommand::kServe ? "Append the log (stdout and stderr) to FILE"
                                                : "Append the log (stderr: notes, timings, errors) to FILE")
      ->type_name("FILE")
      ->group(log_group);
  cmd->add_flag("--log-disable", f.log_disable, "No log (stderr discarded)")->group(log_group);
  cmd->add_flag("-v,--verbose", f.verbose, "Accepted; bonsai logs at one level")->group(log_group);
  cmd->add_option("--log-verbosity", f.log_verbosity, "Accepted; bonsai logs at one level (also -lv)")
      ->type_name("N")
      ->check(item_check(true, non_negative_ok, "a level >= 0"))
      ->group(log_group);
  cmd->add_flag("--log-timestamps,--log-prefix", f.log_decor, "Accepted; bonsai's log lines are plain")
      ->group(log_group);
  if (which == LlamaCommand::kServe) {
    cmd->add_flag("--cont-batching", f.cont_batching, "-cb: always on")->group(group);
    cmd->add_flag("--no-cont-batching", f.no_cont_batching, "-nocb: refused (use -np 1)")->group(group);
    cmd->add_flag("--metrics", f.metrics, "/metrics is always served")->group(group);
    cmd->add_flag("--slots", f.slots, "/slots is always served")->group(group);
  }
}

bool report_ignored_llama_flags(std::string_view cmd, const CLI::App& app) {
  auto given = [&app](const char* name) {
    const CLI::Option* o = app.get_option_no_throw(name);
    return o != nullptr && o->count() > 0;
  };
  // The log goes where it is asked to before anything else is written.
  if (given("--log-file") && given("--log-disable")) {
    std::cerr << "bonsai " << cmd << ": --log-file and --log-disable cannot be used together\n";
    return false;
  }
  if (given("--log-file")) {
    const std::string file = app.get_option("--log-file")->as<std::string>();
    std::FILE* f = std::fopen(file.c_str(), "a");
    if (f == nullptr) {
      std::cerr << "bonsai " << cmd << ": --log-file " << file
                << ": cannot open for appending: " << std::strerror(errno) << "\n";
      return false;
    }
    std::fflush(stderr);
    ::dup2(::fileno(f), STDERR_FILENO);
    if (cmd == "serve") {
      std::fflush(stdout);
      ::dup2(::fileno(f), STDOUT_FILENO);
    }
    std::fclose(f);
  } else if (given("--log-disable")) {
    std::fflush(stderr);
    if (std::FILE* f = std::fopen("/dev/null", "w")) {
      ::dup2(::fileno(f), STDERR_FILENO);
      std::fclose(f);
    }
  }
  if (given("--no-cont-batching")) {
    std::cerr << "bonsai " << cmd
              << ": --no-cont-batching (-nocb): bonsai always batches concurrent requests; use --parallel 1 "
                 "(-np 1) to run one request at a time\n";
    return false;
  }
  // (llama.cpp's short name where it has one: what the user most likely typed.)
  const std::pair<const char*, const char*> kShown[] = {
      {"--n-gpu-layers", "-ngl"}, {"--flash-attn", "-fa"},      {"--ubatch-size", "-ub"}, {"--split-mode", "-sm"},
      {"--main-gpu", "-mg"},      {"--tensor-split", "-ts"},    {"--device", "-dev"},     {"--mmap", "-mmp"},
      {"--batch-size", "-b"},     {"--no-kv-offload", "-nkvo"}, {"--mlock", "--mlock"},   {"--no-mmap", "--no-mmap"}};
  std::string names;
  for (const auto& [name, shown] : kShown)
    if (given(name)) names += std::string(names.empty() ? " " : ", ") + shown;
  if (names.empty()) return true;
  std::cerr << "bonsai " << cmd << ": note: ignored" << names
            << " (llama.cpp's GPU and memory-placement flags: bonsai computes on the CPU from the mapped file)\n";
  return true;
}

}  // namespace bonsai::app
