// EnginePool helpers: pool sizing and building a pool of replicas that share
// one mapping of a GGUF file. See engine_pool.h.
#include "engine/engine_pool.h"

#include <algorithm>
#include <thread>

#include "engine/inference_engine.h"  // InferenceEngine, EngineOptions
#include "engine/sampling.h"          // SamplingParams
#include "gguf/gguf.h"                // File (estimate)
#include "model/config.h"             // ModelConfig (estimate)
#include "model/model.h"              // Model::load
#include "tokenizer/tokenizer.h"      // Tokenizer::from_gguf

namespace bonsai::engine {

const char* pool_error_name(PoolError e) {
  switch (e) {
    case PoolError::kClosed: return "closed";
    case PoolError::kEmpty: return "empty";
    case PoolError::kPoisoned: return "poisoned";
    case PoolError::kTimeout: return "timeout";
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

core::Expected<BuiltPool> build_pool_from_gguf(const std::string& path, const SamplingParams& params,
                                               uint64_t seed, int64_t max_seq_len, int requested_size,
                                               const gguf::OpenOptions& options) {
  auto model = model::Model::load(path, options);
  if (!model) return std::unexpected(model.error());
  auto tok = tokenizer::Tokenizer::from_gguf((*model)->file());
  if (!tok) return std::unexpected(tok.error());

  const ComputeTier tier = ComputeTier::kCpu;  // the only tier today
  const int size = resolve_pool_size(requested_size, tier);
  EngineOptions opts;
  opts.max_seq_len = effective_ctx(max_seq_len, (*model)->config().n_ctx_train);
  opts.params = params;
  opts.params.seed = seed;

  std::vector<InferenceEngine> engines;
  engines.reserve(size);
  uint64_t kv_bytes = 0;
  for (int i = 0; i < size; ++i) {
    auto e = InferenceEngine::create(*model, *tok, opts);
    if (!e) {
      return core::fail(e.error().code, path + ": replica " + std::to_string(i) + ": " + e.error().message);
    }
    kv_bytes += e->kv_cache_bytes();
    engines.push_back(std::move(*e));
  }
  BuiltPool out{.pool = EnginePool(std::move(engines))};
  out.tier = tier;
  out.size = size;
  out.model = *model;
  out.tokenizer = *tok;
  out.n_ctx = opts.max_seq_len;
  out.mapped_bytes = (*model)->file().mapping()->size();
  out.kv_bytes = kv_bytes;
  return out;
}

core::Expected<uint64_t> estimate_model_bytes(const std::string& path, int64_t max_seq_len, int pool_size,
                                              const gguf::OpenOptions& options) {
  auto file = gguf::File::open(path, options);
  if (!file) return std::unexpected(file.error());
  auto cfg = model::ModelConfig::from_gguf(**file);
  if (!cfg) return std::unexpected(cfg.error());
  const int64_t n_ctx = effective_ctx(max_seq_len, cfg->n_ctx_train);
  const int replicas = resolve_pool_size(pool_size, ComputeTier::kCpu);
  // F16 K and V for every layer and position: n_layer * n_ctx * (k_dim + v_dim) * 2 bytes.
  const uint64_t kv_one = static_cast<uint64_t>(cfg->n_layer) * static_cast<uint64_t>(n_ctx) *
                          static_cast<uint64_t>(cfg->k_dim() + cfg->v_dim()) * 2u;
  return static_cast<uint64_t>((*file)->mapping()->size()) + kv_one * static_cast<uint64_t>(replicas);
}

}  // namespace bonsai::engine
