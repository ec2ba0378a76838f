// `bonsai validate -m FILE [--q2-layout L]`: exit 0 when FILE is a loadable
// Qwen3 (Bonsai) or llama model — the GGUF parses, every required key and
// tensor is present with the right shape and a type the kernels compute on,
// its tokenizer (if it declares one) builds and its Bonsai 2 Hadamard fold
// (`prism.hadamard.*`, if any) is valid, printed as "Hadamard fold: block B,
// sign widths [...], N folded matrices, ..." — else exit 1 with every
// problem listed on stderr, one per line.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "apps/bonsai/cli_common.h"
#include "apps/bonsai/commands.h"
#include "core/ggml_types.h"      // parse_q2_layout
#include "gguf/gguf.h"            // File
#include "model/hadamard.h"       // read_hadamard_fold, describe
#include "model/model.h"          // check_model, ModelConfig
#include "tokenizer/tokenizer.h"  // Tokenizer

namespace bonsai::app {
namespace {

struct ValidateOptions {
  std::string model_path;
  std::string q2_layout;  // --q2-layout, else env BONSAI_Q2_LAYOUT
};

int run_validate(const ValidateOptions& o) {
  // BONSAI_KERNEL, --q2-layout: usage errors (exit 2), as in every command.
  const auto rt = init_runtime_or_report("validate", RuntimeFlags{.size_global_pool = false, .q2_layout = o.q2_layout});
  if (!rt) return kExitUsage;
  auto file = gguf::File::open(o.model_path, rt->open_options.file);
  if (!file) {
    std::cerr << o.model_path << ": INVALID\n  " << file.error().message << "\n";
    return 1;
  }
  std::vector<std::string> problems = model::check_model(**file);
  if ((*file)->has("tokenizer.ggml.model")) {
    auto tok = tokenizer::Tokenizer::from_gguf(**file);
    if (!tok) problems.push_back("tokenizer: " + tok.error().message);
    if (tok && !(*tok)->load_warning().empty())
      std::cerr << o.model_path << ": warning: tokenizer: " << (*tok)->load_warning() << "\n";
  }
  // (check_model already lists a fold that does not validate; read here for the summary line.)
  auto fold = model::read_hadamard_fold(**file);
  if (!fold && problems.empty()) problems.push_back("Hadamard fold: " + fold.error().message);
  if (!problems.empty()) {
    std::cerr << o.model_path << ": INVALID (" << problems.size() << " problem" << (problems.size() == 1 ? "" : "s")
              << ")\n";
    for (const auto& p : problems) std::cerr << "  " << p << "\n";
    return 1;
  }
  // check_model passed, so the config parses.
  auto c = model::ModelConfig::from_gguf(**file);
  if (!c) {
    std::cerr << o.model_path << ": INVALID\n  " << c.error().message << "\n";
    return 1;
  }
  std::cout << o.model_path << ": OK: " << c->arch_name << ", " << c->n_layer << " layers, n_embd " << c->n_embd << ", "
            << c->n_head << "/" << c->n_head_kv << " heads, head_dim " << c->head_dim_k << ", n_ff " << c->n_ff
            << ", n_vocab " << c->n_vocab << ", context " << c->n_ctx_train
            << (c->tied_output ? ", tied output" : ", untied output") << ", " << (*file)->tensors().size()
            << " tensors";
  if (c->n_recurrent_layer() > 0) {
    std::cout << " (" << c->n_recurrent_layer() << " Gated DeltaNet, " << c->n_kv_layer()
              << " attention), recurrent state " << model::KvCache::recurrent_bytes(*c) << " bytes per sequence";
  }
  if (const auto l = (*file)->q2_layout()) std::cout << ", Q2_0 layout " << core::q2_layout_name(*l);
  if (!(*file)->has("tokenizer.ggml.model")) std::cout << " (no tokenizer)";
  if (*fold) std::cout << ", Hadamard fold: " << model::describe(**fold);
  std::cout << "\n";
  return 0;
}

}  // namespace

void register_validate(CLI::App& app) {
  auto opts = std::make_shared<ValidateOptions>();
  auto* cmd = app.add_subcommand("validate", "Check that a GGUF is a loadable Qwen3 / qwen35 / llama model");
  cmd->add_option("-m,--model", opts->model_path, "GGUF model file")->required();
  cmd->add_option("--q2-layout", opts->q2_layout,
                  "Force the type-42 layout: g64, g128-d-first, g128-qs-first (env BONSAI_Q2_LAYOUT)");
  cmd->callback([opts] { set_exit_code(run_validate(*opts)); });
}

}  // namespace bonsai::app
