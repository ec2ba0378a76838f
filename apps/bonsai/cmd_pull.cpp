// `bonsai pull OWNER/NAME[:QUANT] [-hff FILE]`: downloads a model from the
// Hugging Face Hub into the Hugging Face cache (src/hub) and prints its path.
// `bonsai list [--json]`: the GGUF models in that cache (a split model's
// parts as one model).
// Also the -hf / -hff plumbing the model commands share (hub_cli.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/bonsai/cli_common.h"  // Progress, progress_enabled
#include "apps/bonsai/commands.h"
#include "apps/bonsai/hub_cli.h"
#include "hub/hub.h"

namespace bonsai::app {
namespace {

std::string size_text(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1u << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1u << 20));
  return buf;
}

// Fetches (or finds) the model; prints errors as "bonsai <cmd>: ...".
// `check_for_update`: ask the Hub even when the cache holds the model (pull).
std::optional<hub::ModelFiles> fetch(const char* cmd, const std::string& repo_arg, const std::string& file,
                                     bool check_for_update = false) {
  auto ref = hub::parse_repo_ref(repo_arg, file);
  if (!ref) {
    std::cerr << "bonsai " << cmd << ": " << ref.error().message << "\n";
    return std::nullopt;
  }
  auto options = hub::options_from_env();
  if (!options) {
    std::cerr << "bonsai " << cmd << ": " << options.error().message << "\n";
    return std::nullopt;
  }
  options->check_for_update = check_for_update;
  // One progress line per file, replaced by "downloaded FILE (SIZE)".
  std::unique_ptr<Progress> bar;
  std::string bar_file;
  uint64_t bar_total = 0;
  const bool show = progress_enabled();
  auto done_line = [&] { return "downloaded " + bar_file + " (" + size_text(bar_total) + ")"; };
  const hub::ProgressFn on_progress = [&](std::string_view f, uint64_t done, uint64_t total) {
    if (!bar || bar_file != f) {
      if (bar) bar->finish(done_line());
      bar_file = std::string(f);
      bar_total = total;
      bar = std::make_unique<Progress>("downloading " + bar_file, total, Progress::Unit::kBytes, show);
      if (!show) std::cerr << "bonsai " << cmd << ": downloading " << ref->repo << " " << bar_file << "\n";
    }
    bar->update(done);
  };
  auto files = hub::fetch_model(*ref, *options, on_progress);
  if (bar) {
    if (files)
      bar->finish(done_line());
    else
      bar->finish();
  }
  if (!files) {
    std::cerr << "bonsai " << cmd << ": " << files.error().message << "\n";
    return std::nullopt;
  }
  if (files->mmproj)
    std::cerr << "bonsai " << cmd << ": note: " << ref->repo << " also has the vision projector " << *files->mmproj
              << " (not fetched: bonsai runs text models)\n";
  return std::move(*files);
}

}  // namespace

void add_hf_flags(CLI::App* cmd, HfFlags& flags) {
  cmd->add_option("--hf-repo", flags.repo,
                  "Hugging Face model OWNER/NAME[:QUANT] (also -hf, as llama.cpp), e.g. prism-ml/Bonsai-8B-gguf:Q1_0; "
                  "downloaded into the Hugging Face cache on first use (HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE)")
      ->type_name("OWNER/NAME[:QUANT]");
  cmd->add_option("--hf-file", flags.file, "The exact file of the --hf-repo repository (also -hff)")->type_name("FILE");
}

bool hf_conflicts_with_m(const char* cmd, const HfFlags& flags, bool has_m) {
  if (flags.repo.empty() && !flags.file.empty()) {
    std::cerr << "bonsai " << cmd << ": -hff needs -hf OWNER/NAME\n";
    return true;
  }
  if (!flags.repo.empty() && has_m) {
    std::cerr << "bonsai " << cmd << ": give either -m FILE or -hf OWNER/NAME, not both\n";
    return true;
  }
  return false;
}

std::optional<std::string> resolve_hf_model(const char* cmd, const std::string& repo_arg, const std::string& file) {
  auto files = fetch(cmd, repo_arg, file);
  if (!files) return std::nullopt;
  // A split model's parts lie side by side in the snapshot; gguf::File::open
  // finds them from the first.
  return files->parts.front().string();
}

void register_pull(CLI::App& app) {
  struct Options {
    std::string repo;
    std::string file;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "pull", "Download a model from Hugging Face into its cache (HF_HOME, HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE)");
  cmd->add_option("repo", o->repo, "OWNER/NAME[:QUANT] (QUANT: Q1_0, Q2_0, PQ2_0, PTQ1_0, ...; or a file name)")
      ->required();
  cmd->add_option("--hf-file", o->file, "The exact file of the repository (also -hff)")->type_name("FILE");
  cmd->callback([o] {
    auto files = fetch("pull", o->repo, o->file, /*check_for_update=*/true);
    if (!files) return set_exit_code(1);
    for (const auto& p : files->parts) std::cout << p.string() << "\n";
    std::cerr << "bonsai pull: " << files->repo << " @ " << files->commit.substr(0, 12)
              << (files->from_cache ? " (from the cache, HF_HUB_OFFLINE=1)" : "") << "\n";
    set_exit_code(0);
  });
}

void register_list(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("list", "List the GGUF models in the Hugging Face cache (bonsai pull, -hf)");
  cmd->add_flag("--json", *json,
                "One JSON array: {repo, file, commit, size, path, current, parts, parts_present} (a split model is "
                "one entry: file and path its first part, size all its parts)");
  cmd->callback([json] {
    auto options = hub::options_from_env();
    if (!options) {
      std::cerr << "bonsai list: " << options.error().message << "\n";
      return set_exit_code(kExitUsage);
    }
    const auto files = hub::list_cached(*options);
    if (*json) {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const auto& f : files)
        out.push_back({{"repo", f.repo},
                       {"file", f.path},
                       {"commit", f.commit},
                       {"size", f.size},
                       {"path", f.local.string()},
                       {"current", f.current},
                       {"parts", f.parts},
                       {"parts_present", f.parts_present}});
      std::cout << out.dump(2) << "\n";
      return set_exit_code(0);
    }
    if (files.empty()) {
      std::cout << "no models in " << options->cache_dir.string()
                << " (bonsai pull OWNER/NAME, e.g. prism-ml/Bonsai-8B-gguf)\n";
      return set_exit_code(0);
    }
    for (const auto& f : files) {
      std::cout << f.repo << ":" << f.path << "  " << size_text(f.size) << "  " << f.local.string();
      if (f.parts > 1 && f.parts_present == f.parts) std::cout << "  (" << f.parts << " parts)";
      if (f.parts_present < f.parts)
        std::cout << "  (incomplete: " << f.parts_present << " of " << f.parts
                  << " parts; bonsai pull fetches the rest)";
      std::cout << (f.current ? "" : "  (not the current revision)") << "\n";
    }
    set_exit_code(0);
  });
}

}  // namespace bonsai::app
