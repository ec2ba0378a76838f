// `bonsai logits -m FILE (-p TEXT [--special] | --ids 1,2,3) [--top-k K]
// [--json] [-t N] [--q2-layout L]`: runs the token sequence through the model
// as ONE batch (prefill) and prints, for every position, the top-K
// [id, logit] pairs of the next-token distribution — the tool for checking
// numerics against another implementation (e.g. llama.cpp's logits).
//   text:   one line per position: "<pos> <token>: [id, logit] [id, logit] ..."
//   --json: {"tokens":[...],"top":[[[id,logit],...], ...]}  (one list per position)
// -p tokenizes like llama.cpp (BOS when the GGUF says add_bos_token;
// --special: special-token text is recognised). Exit 1 on any error.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "apps/bonsai/commands.h"
#include "core/ggml_types.h"      // parse_q2_layout
#include "core/thread_pool.h"     // ThreadPool
#include "kernels/kernels.h"      // init_tier_from_env
#include "model/model.h"          // Model, KvCache, Workspace, Batch
#include "tokenizer/tokenizer.h"  // Tokenizer

namespace bonsai::app {
namespace {

struct LogitsOptions {
  std::string model_path;
  std::string prompt;
  bool prompt_set = false;
  bool special = false;
  std::string ids;
  int top_k = 10;
  bool json = false;
  int threads = 0;
  std::string q2_layout;
};

// "1,2, 3" -> {1, 2, 3}. Errors name the bad item.
core::Expected<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return core::fail(core::Errc::kInvalidArgument, "--ids: empty item");
    item = item.substr(b, e - b + 1);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return core::fail(core::Errc::kInvalidArgument, "--ids: '" + item + "' is not a token id");
    }
    out.push_back(static_cast<int32_t>(v));
  }
  if (out.empty()) return core::fail(core::Errc::kInvalidArgument, "--ids: no token ids");
  return out;
}

int run_logits(const LogitsOptions& o) {
  if (o.prompt_set == !o.ids.empty()) {
    std::cerr << "bonsai logits: give exactly one of -p TEXT or --ids 1,2,3\n";
    return 2;
  }
  if (o.top_k < 1) {
    std::cerr << "bonsai logits: --top-k must be >= 1\n";
    return 2;
  }
  if (auto t = kernels::init_tier_from_env(); !t) {
    std::cerr << "bonsai logits: " << t.error().message << "\n";
    return 1;
  }
  gguf::OpenOptions open_options;
  std::string layout = o.q2_layout;
  if (layout.empty()) {
    if (const char* env = std::getenv("BONSAI_Q2_LAYOUT"); env != nullptr) layout = env;
  }
  if (!layout.empty()) {
    open_options.q2_layout = core::parse_q2_layout(layout);
    if (!open_options.q2_layout) {
      std::cerr << "bonsai logits: unknown Q2_0 layout '" << layout << "'\n";
      return 2;
    }
  }
  auto model = model::Model::load(o.model_path, open_options);
  if (!model) {
    std::cerr << "bonsai logits: " << model.error().message << "\n";
    return 1;
  }
  const model::Model& m = **model;
  const int64_t n_vocab = m.config().n_vocab;

  std::vector<int32_t> tokens;
  if (o.prompt_set) {
    auto tok = tokenizer::Tokenizer::from_gguf(m.file());
    if (!tok) {
      std::cerr << "bonsai logits: " << tok.error().message << "\n";
      return 1;
    }
    const auto ids = (*tok)->encode_prompt(o.prompt, o.special);
    tokens.assign(ids.begin(), ids.end());
    if (tokens.empty()) {
      std::cerr << "bonsai logits: the prompt tokenizes to nothing\n";
      return 1;
    }
  } else {
    auto ids = parse_ids(o.ids);
    if (!ids) {
      std::cerr << "bonsai logits: " << ids.error().message << "\n";
      return 2;
    }
    tokens = std::move(*ids);
  }

  // One batch, logits for every position.
  auto cache = model::KvCache::create(m.config(), static_cast<int64_t>(tokens.size()));
  if (!cache) {
    std::cerr << "bonsai logits: " << cache.error().message << "\n";
    return 1;
  }
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  core::ThreadPool pool(threads);
  model::Workspace ws;
  const model::Batch batch = model::Batch::for_sequence(tokens, 0, 0, /*all_logits=*/true);
  std::vector<float> logits(tokens.size() * static_cast<size_t>(n_vocab));
  model::KvCache* caches[] = {&*cache};
  if (auto r = m.forward(batch, caches, ws, logits, pool); !r) {
    std::cerr << "bonsai logits: " << r.error().message << "\n";
    return 1;
  }

  // Top-k per position: largest logit first, ties -> lower id.
  const size_t k = std::min<size_t>(static_cast<size_t>(o.top_k), static_cast<size_t>(n_vocab));
  std::vector<int32_t> idx(static_cast<size_t>(n_vocab));
  nlohmann::json top = nlohmann::json::array();
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    const float* row = logits.data() + pos * n_vocab;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                      [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    if (o.json) {
      nlohmann::json entries = nlohmann::json::array();
      for (size_t i = 0; i < k; ++i) entries.push_back({idx[i], row[idx[i]]});
      top.push_back(std::move(entries));
    } else {
      std::printf("%zu %d:", pos, tokens[pos]);
      for (size_t i = 0; i < k; ++i) std::printf(" [%d, %.6f]", idx[i], row[idx[i]]);
      std::printf("\n");
    }
  }
  if (o.json) {
    nlohmann::json out;
    out["tokens"] = tokens;
    out["top"] = std::move(top);
    std::cout << out.dump() << "\n";
  }
  return 0;
}

}  // namespace

void register_logits(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Print the top-k logits at every position of a sequence");
  cmd->add_option("-m,--model", o->model_path, "GGUF model file")->required();
  cmd->add_option_function<std::string>(
      "-p,--prompt",
      [o](const std::string& p) {
        o->prompt = p;
        o->prompt_set = true;
      },
      "Text to tokenize (with BOS when the model adds it)");
  cmd->add_flag("--special", o->special, "Recognise special-token text in -p");
  cmd->add_option("--ids", o->ids, "Comma-separated token ids instead of -p");
  cmd->add_option("--top-k", o->top_k, "Pairs per position")->capture_default_str();
  cmd->add_flag("--json", o->json, "Print {\"tokens\":[...],\"top\":[[[id,logit],...],...]}");
  cmd->add_option("-t,--threads", o->threads, "Compute threads (default: all cores)");
  cmd->add_option("--q2-layout", o->q2_layout,
                  "Force the type-42 layout: g64, g128-d-first, g128-qs-first (env BONSAI_Q2_LAYOUT)");
  cmd->callback([o] { set_exit_code(run_logits(*o)); });
}

}  // namespace bonsai::app
