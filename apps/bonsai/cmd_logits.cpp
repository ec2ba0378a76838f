// `bonsai logits -m FILE (-p TEXT [--special] | --ids 1,2,3) [--top-k K]
// [--json] [-t N] [--q2-layout L]`: runs the token sequence through the model
// as ONE batch (prefill) and prints, for every position, the top-K
// [id, logit] pairs of the next-token distribution — the tool for checking
// numerics against another implementation (e.g. llama.cpp's logits).
//   text:   one line per position: "<pos> <token>: [id, logit] [id, logit] ..."
//   --json: {"tokens":[...],"top":[[[id,logit],...], ...]}  (one list per position)
// -p tokenizes like llama.cpp (BOS when the GGUF says add_bos_token;
// --special: special-token text is recognised). Usage errors (BONSAI_KERNEL,
// --q2-layout, -p/--ids) exit 2, other errors 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/bonsai/cli_common.h"
#include "apps/bonsai/commands.h"
#include "core/ggml_types.h"      // parse_q2_layout
#include "core/thread_pool.h"     // ThreadPool
#include "kernels/kernels.h"      // init_tier_from_env
#include "model/model.h"          // Model, KvCache, Workspace, Batch
#include "tokenizer/tokenizer.h"  // Tokenizer

namespace bonsai::app {
namespace {

// Positions run through the model per forward() call: the model's own ubatch
// size, so the logits are bit-identical to one pass over the whole sequence,
// and the logits buffer is at most 512 x n_vocab floats (311 MB at 152k).
constexpr int64_t kSliceTokens = model::Model::kMaxUbatch;

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
  bool no_repack = false;  // --no-repack
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
  // BONSAI_KERNEL, --q2-layout, -t (this command's own pool): usage errors.
  const auto rt = init_runtime_or_report(
      "logits",
      RuntimeFlags{
          .threads = o.threads, .size_global_pool = false, .q2_layout = o.q2_layout, .no_repack = o.no_repack});
  if (!rt) return kExitUsage;
  auto model = load_model(o.model_path, *rt);
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
      return kExitUsage;
    }
  } else {
    auto ids = parse_ids(o.ids);
    if (!ids) {
      std::cerr << "bonsai logits: " << ids.error().message << "\n";
      return 2;
    }
    tokens = std::move(*ids);
  }

  // The sequence runs as one prefill through the KV cache, but in slices of
  // kSliceTokens so the logits buffer stays slices x n_vocab floats whatever
  // the sequence length (tokens x n_vocab would be tens of GB for a long
  // prompt on a 152k vocabulary). Each position's top-k is printed (streamed,
  // also for --json) as soon as its slice is done.
  // Checked up front (forward() checks each slice) so that nothing is
  // printed for a sequence that cannot run to the end.
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      std::cerr << "bonsai logits: token " << i << ": id " << tokens[i] << " is outside the vocabulary [0, " << n_vocab
                << ")\n";
      return kExitUsage;  // a flag value out of the model's range
    }
  }
  auto cache = model::KvCache::create(m.config(), static_cast<int64_t>(tokens.size()));
  if (!cache) {
    std::cerr << "bonsai logits: " << cache.error().message << "\n";
    return 1;
  }
  core::ThreadPool pool(rt->threads);
  model::Workspace ws;
  const size_t slice_max = static_cast<size_t>(kSliceTokens);
  std::vector<float> logits(std::min(tokens.size(), slice_max) * static_cast<size_t>(n_vocab));
  model::KvCache* caches[] = {&*cache};

  // Top-k per position: largest logit first, ties -> lower id.
  const size_t k = std::min<size_t>(static_cast<size_t>(o.top_k), static_cast<size_t>(n_vocab));
  std::vector<int32_t> idx(static_cast<size_t>(n_vocab));
  if (o.json) std::printf("{\"tokens\":%s,\"top\":[", nlohmann::json(tokens).dump().c_str());
  for (size_t start = 0; start < tokens.size(); start += slice_max) {
    const size_t n = std::min(slice_max, tokens.size() - start);
    const model::Batch batch =
        model::Batch::for_sequence(std::span<const int32_t>(tokens).subspan(start, n), static_cast<int32_t>(start), 0,
                                   /*all_logits=*/true);
    if (auto r = m.forward(batch, caches, ws, logits, pool); !r) {
      if (o.json) std::printf("]}\n");
      std::fflush(stdout);
      std::cerr << "bonsai logits: " << r.error().message << "\n";
      return 1;
    }
    for (size_t i = 0; i < n; ++i) {
      const size_t pos = start + i;
      const float* row = logits.data() + i * static_cast<size_t>(n_vocab);
      std::iota(idx.begin(), idx.end(), 0);
      // NaN logits (a broken model) sort last, so the order stays a strict weak ordering.
      auto key = [row](int32_t a) { return std::isnan(row[a]) ? -INFINITY : row[a]; };
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                        [&key](int32_t a, int32_t b) {
                          const float ka = key(a), kb = key(b);
                          return ka > kb || (ka == kb && a < b);
                        });
      if (o.json) {
        nlohmann::json entries = nlohmann::json::array();
        for (size_t j = 0; j < k; ++j) entries.push_back({idx[j], row[idx[j]]});
        std::printf("%s%s", pos ? "," : "", entries.dump().c_str());
      } else {
        std::printf("%zu %d:", pos, tokens[pos]);
        for (size_t j = 0; j < k; ++j) std::printf(" [%d, %.6f]", idx[j], row[idx[j]]);
        std::printf("\n");
      }
    }
  }
  if (o.json) std::printf("]}\n");
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
  cmd->add_option("-t,--threads", o->threads, "Compute threads (default, 0 or -1: physical cores)")
      ->check(CLI::Range(-1, core::ThreadPool::kMaxThreads));
  cmd->add_option("--q2-layout", o->q2_layout,
                  "Force the type-42 layout: g64, g128-d-first, g128-qs-first (env BONSAI_Q2_LAYOUT)");
  cmd->add_flag("--no-repack", o->no_repack, kNoRepackHelp);
  cmd->callback([o] { set_exit_code(run_logits(*o)); });
}

}  // namespace bonsai::app
