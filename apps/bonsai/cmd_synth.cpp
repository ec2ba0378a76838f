// `bonsai synth -o FILE [--arch qwen3|qwen35] [--preset P] [--type T] [--seed N] [--hadamard] [--n-vocab N]`:
// writes a Qwen3- or Qwen3.5-architecture GGUF with deterministic random
// weights (see synth.h). Prints a one-line summary; errors print the message
// and exit 1. On a terminal, a progress line on stderr while the tensors are
// written.
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
    std::string arch = "qwen3";
    std::string preset = "tiny";
    std::string type = "q1_0";
    uint64_t seed = 1;
    bool hadamard = false;
    uint32_t n_vocab = 0;  // 0: the preset's
  };
  auto opt = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "synth", "Write a Qwen3 or Qwen3.5 GGUF with deterministic random weights and a small BPE tokenizer");
  cmd->add_option("-o,--output", opt->out, "Output GGUF file")->required();
  cmd->add_option("--arch", opt->arch,
                  "Architecture: qwen3 (Bonsai 1.7B/4B/8B) | qwen35 (the 27B family: Gated DeltaNet + gated "
                  "attention) (default qwen3)");
  cmd->add_option("--preset", opt->preset,
                  "Model shape: qwen3 tiny | 1.7b | 4b | 8b; qwen35 tiny | 27b (about 6 GB in ptq1_0) (default tiny)");
  cmd->add_option("--type", opt->type,
                  "Matrix weight type: q1_0 | q2_0 | f16; qwen35 also pq2_0 | ptq1_0 (default q1_0)");
  cmd->add_option("--seed", opt->seed, "Random seed (default 1)");
  cmd->add_option("--n-vocab", opt->n_vocab,
                  "Vocabulary size instead of the preset's (the tokenizer depends on it alone: a tiny draft model "
                  "for speculative decoding with the 1.7b preset's tokenizer is --preset tiny --n-vocab 151669)");
  cmd->add_flag("--hadamard", opt->hadamard,
                "qwen35 with q2_0 | pq2_0 | ptq1_0: add the Bonsai 2 prism.hadamard.* keys (the weights stay random)");
  cmd->callback([opt] {
    auto arch = synth::parse_arch(opt->arch);
    if (!arch) {
      std::cerr << "bonsai synth: unknown --arch '" << opt->arch << "' (expected qwen3 or qwen35)\n";
      set_exit_code(kExitUsage);
      return;
    }
    auto preset = synth::preset(opt->preset, *arch);
    if (!preset) {
      std::cerr << "bonsai synth: " << preset.error().message << "\n";
      set_exit_code(kExitUsage);
      return;
    }
    if (opt->n_vocab > 0) {
      if (preset->first_special != 0) {
        std::cerr << "bonsai synth: --n-vocab is for presets whose special tokens come last (qwen3)\n";
        set_exit_code(kExitUsage);
        return;
      }
      preset->n_vocab = opt->n_vocab;  // (build_vocab checks that it holds the bytes and the specials)
    }
    auto type = synth::parse_weight_type(opt->type);
    if (!type) {
      std::cerr << "bonsai synth: unknown --type '" << opt->type << "' (expected q1_0, q2_0, f16, pq2_0 or ptq1_0)\n";
      set_exit_code(kExitUsage);
      return;
    }
    // BONSAI_KERNEL is checked as in every command (usage error, exit 2).
    const auto rt = init_runtime_or_report("synth", RuntimeFlags{.size_global_pool = false});
    if (!rt) {
      set_exit_code(kExitUsage);
      return;
    }
    synth::Options o{*preset, *type, opt->seed, {}, opt->hadamard};
    Progress progress("synth: writing " + opt->out, 0, Progress::Unit::kBytes, rt->progress);
    o.on_progress = [&progress](uint64_t done, uint64_t total) {
      progress.set_total(total);
      progress.update(done);
    };
    auto w = synth::build(o);
    if (!w) {
      std::cerr << "bonsai synth: " << w.error().message << "\n";
      // kInvalidArgument: flags the architecture or type does not take (a usage error).
      set_exit_code(w.error().code == core::Errc::kInvalidArgument ? kExitUsage : 1);
      return;
    }
    auto written = w->write(opt->out);
    progress.finish();
    if (auto& r = written; !r) {
      std::cerr << "bonsai synth: " << r.error().message << "\n";
      set_exit_code(1);
      return;
    }
    std::cout << "wrote " << opt->out << ": arch " << synth::arch_name(*arch) << ", preset " << preset->name
              << ", type " << synth::weight_type_name(*type) << (opt->hadamard ? " + hadamard" : "") << ", seed "
              << opt->seed << ", " << w->n_tensors() << " tensors\n";
  });
}

}  // namespace bonsai::app
