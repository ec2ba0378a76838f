// EnginePool helpers: pool sizing and building a pool of replicas that share
// one mapping of a GGUF file. See engine_pool.h.
#include "engine/engine_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "engine/inference_engine.h"  // InferenceEngine, EngineOptions
#include "engine/sampling.h"          // SamplingParams
#include "gguf/gguf.h"                // File (estimate)
#include "model/config.h"             // ModelConfig (estimate)
#include "model/model.h"              // Model::load
#include "structured/vocab_trie.h"    // SharedTokenTrie
#include "tokenizer/tokenizer.h"      // Tokenizer::from_gguf

namespace bonsai::engine {

const char* pool_error_name(PoolError e) {
  switch (e) {
    case PoolError::kClosed:
      return "closed";
    case PoolError::kEmpty:
      return "empty";
    case PoolError::kPoisoned:
      return "poisoned";
    case PoolError::kTimeout:
      return "timeout";
  }
  return "unknown";
}

int default_cpu_pool_size() {
  unsigned hc = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(hc, 1u, 4u));
}

int resolve_pool_size(int requested, ComputeTier tier) {
  if (tier == ComputeTier::kGpu) return 1;
  return requested >= 1 ? requested : default_cpu_pool_size();
}

}  // namespace bonsai::engine

// ---- building pools from a GGUF ----

namespace bonsai::engine {
namespace {

int64_t effective_ctx(int64_t requested, int64_t n_ctx_train) {
  if (requested > 0) return requested;
  return std::min<int64_t>(n_ctx_train > 0 ? n_ctx_train : kDefaultMaxSeqLen, kDefaultMaxSeqLen);
}

}  // namespace

int64_t max_supported_ctx(const model::ModelConfig& cfg) {
  int64_t max_ctx = cfg.n_ctx_train;
  if (cfg.n_ctx_train > 0 && cfg.rope_scaling != model::RopeScaling::kNone) {
    const int64_t orig = cfg.rope_orig_ctx > 0 ? cfg.rope_orig_ctx : cfg.n_ctx_train;
    const double scaled = static_cast<double>(orig) * static_cast<double>(cfg.rope_scaling_factor);
    if (scaled > static_cast<double>(max_ctx)) max_ctx = scaled >= 9.0e18 ? INT64_MAX : static_cast<int64_t>(scaled);
  }
  return max_ctx;
}

core::Expected<void> check_ctx_supported(const std::string& path, int64_t ctx, const model::ModelConfig& cfg) {
  const int64_t max_ctx = max_supported_ctx(cfg);
  if (ctx <= 0 || max_ctx <= 0 || ctx <= max_ctx) return {};
  const float factor = cfg.rope_scaling == model::RopeScaling::kNone ? 1.0f : cfg.rope_scaling_factor;
  char f[32];
  std::snprintf(f, sizeof f, "%g", static_cast<double>(factor));
  return core::fail(core::Errc::kInvalidArgument,
                    path + ": a context of " + std::to_string(ctx) + " tokens (-c / ctx-size) is more than the model " +
                        "supports: at most " + std::to_string(max_ctx) + " (training context " +
                        std::to_string(cfg.n_ctx_train) + " x RoPE scaling factor " + f +
                        "); positions past it give garbage. Use -c " + std::to_string(max_ctx) +
                        " or less (0: the default)");
}

int64_t kv_block_size_for(int64_t n_ctx) {
  return std::clamp<int64_t>((n_ctx + 31) / 32 * 32, 32, model::kKvBlockSize);
}

int64_t kv_budget_positions(int64_t n_ctx, int replicas, int64_t kv_budget_tokens) {
  const int64_t bs = kv_block_size_for(n_ctx);
  if (kv_budget_tokens > 0) return (kv_budget_tokens + bs - 1) / bs * bs;
  return static_cast<int64_t>(std::max(replicas, 1)) * ((std::max<int64_t>(n_ctx, 1) + bs - 1) / bs) * bs;
}

int64_t state_snapshot_count(const model::ModelConfig& cfg, int64_t n_ctx, int64_t kv_positions) {
  if (cfg.n_recurrent_layer() <= 0) return 0;
  const int64_t ctx = std::max<int64_t>(n_ctx, 1);
  const int64_t contexts = std::max<int64_t>(1, (std::max<int64_t>(kv_positions, 0) + ctx - 1) / ctx);
  return 2 * contexts;
}

uint64_t state_snapshot_budget_bytes(const model::ModelConfig& cfg, int64_t n_ctx, int64_t kv_positions) {
  uint64_t r = 0;
  return __builtin_mul_overflow(static_cast<uint64_t>(state_snapshot_count(cfg, n_ctx, kv_positions)),
                                model::KvCache::recurrent_bytes(cfg), &r)
             ? UINT64_MAX
             : r;
}

core::Expected<BuiltPool> build_pool_from_gguf(const std::string& path, const SamplingParams& params, uint64_t seed,
                                               int64_t max_seq_len, int requested_size,
                                               const model::LoadOptions& options, model::KvType type_k,
                                               model::KvType type_v, int64_t kv_budget_tokens, int sequences,
                                               const tokenizer::ChatTemplateOptions& chat) {
  auto model = model::Model::load(path, options);
  if (!model) return std::unexpected(model.error());
  auto tok = tokenizer::Tokenizer::from_gguf((*model)->file(), chat);
  if (!tok) return std::unexpected(tok.error());

  if (auto ok = check_ctx_supported(path, max_seq_len, (*model)->config()); !ok) return std::unexpected(ok.error());
  const ComputeTier tier = ComputeTier::kCpu;  // the only tier today
  const int size = resolve_pool_size(requested_size, tier);
  EngineOptions opts;
  opts.max_seq_len = effective_ctx(max_seq_len, (*model)->config().n_ctx_train);
  opts.params = params;
  opts.params.seed = seed;
  opts.kv_type_k = type_k;
  opts.kv_type_v = type_v;
  opts.token_trie = std::make_shared<structured::SharedTokenTrie>(*tok);  // one per model, built on first grammar use

  // One KV block pool for every replica: the model's KV budget.
  const int64_t bs = kv_block_size_for(opts.max_seq_len);
  const int64_t budget = kv_budget_positions(opts.max_seq_len, size, kv_budget_tokens);
  if (budget < opts.max_seq_len) {
    return core::fail(core::Errc::kInvalidArgument, path + ": the KV budget of " + std::to_string(kv_budget_tokens) +
                                                        " tokens is smaller than one sequence's context of " +
                                                        std::to_string(opts.max_seq_len));
  }
  auto kv_pool = model::KvPool::create((*model)->config(), budget, opts.kv_type_k, opts.kv_type_v, bs);
  if (!kv_pool) return core::fail(kv_pool.error().code, path + ": " + kv_pool.error().message);
  const uint64_t snapshot_bytes = state_snapshot_budget_bytes((*model)->config(), opts.max_seq_len, budget);
  (*kv_pool)->set_snapshot_budget(snapshot_bytes);  // the prompt cache of a hybrid model (qwen35)
  opts.kv_pool = *kv_pool;

  const int replicas = std::max(size, sequences);
  std::vector<InferenceEngine> engines;
  engines.reserve(static_cast<size_t>(replicas));
  for (int i = 0; i < replicas; ++i) {
    auto e = InferenceEngine::create(*model, *tok, opts);
    if (!e) {
      return core::fail(e.error().code, path + ": replica " + std::to_string(i) + ": " + e.error().message);
    }
    engines.push_back(std::move(*e));
  }
  BuiltPool out{.pool = EnginePool(std::move(engines))};
  out.tier = tier;
  out.size = replicas;
  out.model = *model;
  out.tokenizer = *tok;
  out.n_ctx = opts.max_seq_len;
  out.mapped_bytes = (*model)->file().total_bytes();
  out.kv_pool = *kv_pool;
  out.kv_bytes = (*kv_pool)->capacity_bytes();
  out.recurrent_state_bytes = model::KvCache::recurrent_bytes((*model)->config());
  out.snapshot_bytes = snapshot_bytes;
  return out;
}

namespace {

uint64_t mul_sat(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

}  // namespace

uint64_t ModelFootprint::cache_bytes() const {
  uint64_t r = 0, t = 0;
  if (__builtin_add_overflow(kv_bytes, states_bytes, &r) || __builtin_add_overflow(r, snapshot_bytes, &t))
    return UINT64_MAX;
  return t;
}

uint64_t ModelFootprint::total_bytes() const {
  uint64_t r = 0;
  return __builtin_add_overflow(mapped_bytes, cache_bytes(), &r) ? UINT64_MAX : r;
}

core::Expected<ModelFootprint> model_footprint(const std::string& path, int64_t max_seq_len, int pool_size,
                                               const model::LoadOptions& options, model::KvType type_k,
                                               model::KvType type_v, int64_t kv_budget_tokens, int parallel) {
  auto file = gguf::File::open(path, options.file);
  if (!file) return std::unexpected(file.error());
  auto cfg = model::ModelConfig::from_gguf(**file);
  if (!cfg) return std::unexpected(cfg.error());
  ModelFootprint f;
  f.mapped_bytes = (*file)->total_bytes();
  f.n_ctx = effective_ctx(max_seq_len, cfg->n_ctx_train);
  f.replicas = resolve_pool_size(pool_size, ComputeTier::kCpu);
  f.type_k = type_k;
  f.type_v = type_v;
  f.kv_bytes_per_position = model::KvCache::bytes_per_position(*cfg, type_k, type_v);
  f.kv_block_size = kv_block_size_for(f.n_ctx);
  f.kv_budget_tokens = kv_budget_positions(f.n_ctx, f.replicas, kv_budget_tokens);
  f.kv_bytes = mul_sat(f.kv_bytes_per_position, static_cast<uint64_t>(f.kv_budget_tokens));
  f.recurrent_state_bytes = model::KvCache::recurrent_bytes(*cfg);
  if (f.recurrent_state_bytes > 0) {
    f.sequences = parallel > 0 ? parallel : f.replicas;
    f.states_bytes = mul_sat(f.recurrent_state_bytes, static_cast<uint64_t>(f.sequences));
    f.snapshot_bytes = state_snapshot_budget_bytes(*cfg, f.n_ctx, f.kv_budget_tokens);
  }
  f.n_ctx_train = cfg->n_ctx_train;
  f.rope_scaling_factor = cfg->rope_scaling == model::RopeScaling::kNone ? 1.0f : cfg->rope_scaling_factor;
  f.max_ctx = max_supported_ctx(*cfg);
  return f;
}

core::Expected<uint64_t> estimate_model_bytes(const std::string& path, int64_t max_seq_len, int pool_size,
                                              const model::LoadOptions& options, model::KvType type_k,
                                              model::KvType type_v, int64_t kv_budget_tokens, int parallel) {
  auto f = model_footprint(path, max_seq_len, pool_size, options, type_k, type_v, kv_budget_tokens, parallel);
  if (!f) return std::unexpected(f.error());
  return f->total_bytes();
}

}  // namespace bonsai::engine
