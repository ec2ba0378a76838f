// `bonsai synth -o FILE --preset tiny|1.7b|4b|8b [--type q1_0|q2_0|f16] [--seed N]`:
// writes a Qwen3-architecture GGUF with deterministic random weights (see
// synth.h). Prints a one-line summary; errors print the message and exit 1.
// On a terminal, a progress line on stderr while the tensors are written.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>

#include "apps/bonsai/cli_common.h"  // init_runtime, Progress
#include "apps/bonsai/commands.h"
#include "apps/bonsai/synth.h"

namespace bonsai::app {

void register_synth(CLI::App& app) {
  struct Options {
    std::string out;
    std::string preset = "tiny";
    std::string type = "q1_0";
    uint64_t seed = 1;
  };
  auto opt = std::make_shared<Options>();
  auto* cmd =
      app.add_subcommand("synth", "Write a Qwen3 GGUF with deterministic random weights and a small BPE tokenizer");
  cmd->add_option("-o,--output", opt->out, "Output GGUF file")->required();
  cmd->add_option("--preset", opt->preset, "Model shape: tiny | 1.7b | 4b | 8b (default tiny)");
  cmd->add_option("--type", opt->type, "Matrix weight type: q1_0 | q2_0 | f16 (default q1_0)");
  cmd->add_option("--seed", opt->seed, "Random seed (default 1)");
  cmd->callback([opt] {
    auto preset = synth::preset(opt->preset);
    if (!preset) {
      std::cerr << "bonsai synth: " << preset.error().message << "\n";
      set_exit_code(1);
      return;
    }
    auto type = synth::parse_weight_type(opt->type);
    if (!type) {
      std::cerr << "bonsai synth: unknown --type '" << opt->type << "' (expected q1_0, q2_0 or f16)\n";
      set_exit_code(1);
      return;
    }
    // BONSAI_KERNEL is checked as in every command (usage error, exit 2).
    const auto rt = init_runtime_or_report("synth", RuntimeFlags{.size_global_pool = false});
    if (!rt) {
      set_exit_code(kExitUsage);
      return;
    }
    synth::Options o{*preset, *type, opt->seed, {}};
    Progress progress("synth: writing " + opt->out, 0, Progress::Unit::kBytes, rt->progress);
    o.on_progress = [&progress](uint64_t done, uint64_t total) {
      progress.set_total(total);
      progress.update(done);
    };
    auto w = synth::build(o);
    if (!w) {
      std::cerr << "bonsai synth: " << w.error().message << "\n";
      set_exit_code(1);
      return;
    }
    auto written = w->write(opt->out);
    progress.finish();
    if (auto& r = written; !r) {
      std::cerr << "bonsai synth: " << r.error().message << "\n";
      set_exit_code(1);
      return;
    }
    std::cout << "wrote " << opt->out << ": preset " << preset->name << ", type " << synth::weight_type_name(*type)
              << ", seed " << opt->seed << ", " << w->n_tensors() << " tensors\n";
  });
}

}  // namespace bonsai::app
