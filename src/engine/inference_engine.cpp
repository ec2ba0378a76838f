// InferenceEngine: prefill, decode loop, sampling, stop handling; see
// inference_engine.h for the contract.
#include "engine/inference_engine.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/thread_pool.h"     // ThreadPool, global_pool
#include "engine/text_emitter.h"  // TextEmitter
#include "model/model.h"          // Model, KvCache, Workspace, Batch
#include "tokenizer/tokenizer.h"  // Tokenizer

namespace bonsai::engine {

namespace {
double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

struct InferenceEngine::Impl {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  core::ThreadPool* pool = nullptr;  // borrowed; nullptr: core::global_pool()
  model::KvCache cache;
  model::Workspace ws;
  Sampler sampler;
  std::vector<int32_t> history;  // the tokens in the cache, by position
  std::vector<float> logits;     // [n_vocab] of the last token run
  EngineStats stats;
  std::shared_ptr<RequestRateAggregator> metrics;
  int64_t n_vocab = 0;

  core::ThreadPool& compute_pool() const { return pool != nullptr ? *pool : core::global_pool(); }
};

core::Expected<InferenceEngine> InferenceEngine::create(
    std::shared_ptr<const model::Model> model,
    std::shared_ptr<const tokenizer::Tokenizer> tokenizer, EngineOptions options) {
  if (model == nullptr)
    return core::fail(core::Errc::kInvalidArgument, "InferenceEngine: model is null");
  if (tokenizer == nullptr) {
    return core::fail(core::Errc::kInvalidArgument, "InferenceEngine: tokenizer is null");
  }
  if (auto ok = options.params.validate(); !ok) return std::unexpected(ok.error());
  if (options.max_seq_len < 0) {
    return core::fail(
        core::Errc::kInvalidArgument,
        "InferenceEngine: max_seq_len must be >= 0, got " + std::to_string(options.max_seq_len));
  }
  const model::ModelConfig& cfg = model->config();
  int64_t n_ctx = options.max_seq_len;
  if (n_ctx == 0)
    n_ctx = std::min(cfg.n_ctx_train > 0 ? cfg.n_ctx_train : kDefaultMaxSeqLen, kDefaultMaxSeqLen);
  auto cache = model::KvCache::create(cfg, n_ctx,
                                      options.kv_f32 ? model::KvType::kF32 : model::KvType::kF16);
  if (!cache) return std::unexpected(cache.error());

  auto impl = std::make_unique<Impl>();
  impl->model = std::move(model);
  impl->tok = std::move(tokenizer);
  impl->pool = options.pool;
  impl->cache = std::move(*cache);
  impl->sampler = Sampler(std::move(options.params));
  impl->n_vocab = cfg.n_vocab;
  impl->logits.assign(static_cast<size_t>(cfg.n_vocab), 0.0f);
  return InferenceEngine(std::move(impl));
}

InferenceEngine::InferenceEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InferenceEngine::InferenceEngine(InferenceEngine&&) noexcept = default;
InferenceEngine& InferenceEngine::operator=(InferenceEngine&&) noexcept = default;
InferenceEngine::~InferenceEngine() = default;

// ---- Low-level steps ----------------------------------------------------------

core::Expected<std::span<const float>> InferenceEngine::prefill_from_pos(
    std::span<const int32_t> tokens, int64_t pos) {
  Impl& m = *impl_;
  if (tokens.empty()) return core::fail(core::Errc::kInvalidArgument, "prefill: no tokens");
  const auto held = static_cast<int64_t>(m.history.size());
  if (pos < 0 || pos > held) {
    return core::fail(core::Errc::kInvalidArgument, "prefill: position " + std::to_string(pos) +
                                                        " is beyond the " + std::to_string(held) +
                                                        " positions in the cache");
  }
  const auto n = static_cast<int64_t>(tokens.size());
  if (pos + n > m.cache.n_ctx()) {
    return core::fail(core::Errc::kOutOfRange, "prefill: positions " + std::to_string(pos) + ".." +
                                                   std::to_string(pos + n - 1) +
                                                   " exceed the context of " +
                                                   std::to_string(m.cache.n_ctx()) + " tokens");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= m.n_vocab) {
      return core::fail(core::Errc::kInvalidArgument,
                        "prefill: token " + std::to_string(tokens[i]) + " at index " +
                            std::to_string(i) + " is outside the vocabulary [0, " +
                            std::to_string(m.n_vocab) + ")");
    }
  }
  m.cache.truncate(pos);
  m.history.resize(static_cast<size_t>(pos));
  model::KvCache* caches[] = {&m.cache};
  for (int64_t off = 0; off < n; off += kPrefillChunk) {
    const int64_t len = std::min(kPrefillChunk, n - off);
    const auto chunk = tokens.subspan(static_cast<size_t>(off), static_cast<size_t>(len));
    const model::Batch batch = model::Batch::for_sequence(chunk, static_cast<int32_t>(pos + off));
    auto ok = m.model->forward(batch, caches, m.ws, m.logits, m.compute_pool());
    if (!ok) {
      m.cache.truncate(pos + off);
      return std::unexpected(ok.error());
    }
    m.history.insert(m.history.end(), chunk.begin(), chunk.end());
  }
  return std::span<const float>(m.logits);
}

core::Expected<std::span<const float>> InferenceEngine::decode_step(int32_t token) {
  const int32_t one[] = {token};
  return prefill_from_pos(one, static_cast<int64_t>(impl_->history.size()));
}

int32_t InferenceEngine::sample(std::span<const float> logits) {
  return impl_->sampler.sample(logits, impl_->history);
}

void InferenceEngine::reset() {
  impl_->cache.clear();
  impl_->history.clear();
}

int64_t InferenceEngine::position() const { return static_cast<int64_t>(impl_->history.size()); }

// ---- Generation -------------------------------------------------------------------

core::Expected<GenerationResult> InferenceEngine::generate(std::span<const int32_t> prompt) {
  GenerateRequest r;
  r.prompt = prompt;
  return generate_request(r);
}

core::Expected<GenerationResult> InferenceEngine::generate_with_params(
    std::span<const int32_t> prompt, const SamplingParams& params) {
  GenerateRequest r;
  r.prompt = prompt;
  r.params = params;
  return generate_request(r);
}

core::Expected<GenerationResult> InferenceEngine::generate_with_seed(
    std::span<const int32_t> prompt, uint64_t seed) {
  GenerateRequest r;
  r.prompt = prompt;
  r.seed = seed;
  return generate_request(r);
}

core::Expected<GenerationResult> InferenceEngine::generate_streaming(
    std::span<const int32_t> prompt, const StreamCallback& on_token) {
  GenerateRequest r;
  r.prompt = prompt;
  r.on_token = on_token;
  return generate_request(r);
}

core::Expected<std::vector<GenerationResult>> InferenceEngine::batch_generate(
    std::span<const std::vector<int32_t>> prompts) {
  std::vector<GenerationResult> out;
  out.reserve(prompts.size());
  for (const auto& p : prompts) {
    auto r = generate(p);
    if (!r) return std::unexpected(r.error());
    out.push_back(std::move(*r));
  }
  return out;
}

core::Expected<GenerationResult> InferenceEngine::generate_request(const GenerateRequest& req) {
  Impl& m = *impl_;
  const Clock::time_point t_start = Clock::now();
  if (req.prompt.empty())
    return core::fail(core::Errc::kInvalidArgument, "generate: the prompt is empty");
  if (static_cast<int64_t>(req.prompt.size()) > m.cache.n_ctx()) {
    return core::fail(core::Errc::kOutOfRange,
                      "generate: the prompt has " + std::to_string(req.prompt.size()) +
                          " tokens but the context holds " + std::to_string(m.cache.n_ctx()));
  }
  if (req.params) {
    if (auto ok = req.params->validate(); !ok) return std::unexpected(ok.error());
  }

  // Swap params / seed for this call; the guard restores them on every exit.
  struct Restore {
    Sampler& s;
    std::optional<SamplingParams> params;
    std::optional<Rng::State> rng;
    ~Restore() {
      if (params) s.set_params(std::move(*params));
      if (rng) s.rng().set_state(*rng);
    }
  } restore{m.sampler, std::nullopt, std::nullopt};
  if (req.params) {
    restore.params = m.sampler.params();
    m.sampler.set_params(*req.params);
  }
  if (req.seed) {
    if (!restore.params) restore.params = m.sampler.params();  // reseed writes params().seed
    restore.rng = m.sampler.rng().state();
    m.sampler.reseed(*req.seed);
  }
  const SamplingParams& params = m.sampler.params();

  RequestRateTracker own_tracker(t_start);
  RequestRateTracker& tracker = req.tracker != nullptr ? *req.tracker : own_tracker;

  reset();
  auto first = prefill_from_pos(req.prompt, 0);
  if (!first) return std::unexpected(first.error());
  const Clock::time_point t_prefilled = Clock::now();

  GenerationResult res;
  res.prompt_tokens = static_cast<int32_t>(req.prompt.size());
  res.finish_reason = FinishReason::kLength;
  TextEmitter emitter(params.stop);
  std::span<const float> logits = *first;
  const int64_t n_ctx = m.cache.n_ctx();
  int32_t n_sampled = 0;
  int32_t last = -1;

  auto emit = [&](int32_t token, int32_t index, const std::string& text) {
    if (!req.on_token) return true;
    return req.on_token(TokenEvent{token, index, text});
  };

  while (params.max_tokens < 0 || n_sampled < params.max_tokens) {
    if (req.cancel != nullptr && req.cancel->load(std::memory_order_relaxed)) {
      res.finish_reason = FinishReason::kCancelled;
      break;
    }
    if (n_sampled > 0) {
      if (static_cast<int64_t>(m.history.size()) >= n_ctx) break;  // context full: length
      auto next = decode_step(last);
      if (!next) return std::unexpected(next.error());
      logits = *next;
    }
    const int32_t tok = sample(logits);
    tracker.on_token();
    const int32_t index = n_sampled++;
    last = tok;
    if (!params.ignore_eos && m.tok->is_eog(tok)) {
      res.finish_reason = FinishReason::kStop;
      emit(tok, index, std::string());
      break;
    }
    res.tokens.push_back(tok);
    const std::string piece = emitter.push(m.tok->token_to_bytes(tok));
    if (emitter.stopped()) {
      res.finish_reason = FinishReason::kStop;
      emit(tok, index, piece);
      break;
    }
    if (!emit(tok, index, piece)) {
      res.finish_reason = FinishReason::kCancelled;
      break;
    }
  }
  if (const std::string rest = emitter.finish(); !rest.empty()) emit(-1, n_sampled, rest);

  const Clock::time_point t_end = Clock::now();
  tracker.on_finish(t_end);
  res.text = emitter.released();
  res.completion_tokens = n_sampled;
  res.prompt_ms = ms_since(t_start, t_prefilled);
  res.gen_ms = ms_since(t_prefilled, t_end);
  res.rate = tracker.summary();

  EngineStats& st = m.stats;
  ++st.requests;
  st.prompt_tokens += static_cast<uint64_t>(res.prompt_tokens);
  st.generated_tokens += static_cast<uint64_t>(n_sampled);
  st.prompt_ms += res.prompt_ms;
  st.gen_ms += res.gen_ms;
  st.last_prompt_tokens = static_cast<uint64_t>(res.prompt_tokens);
  st.last_generated_tokens = static_cast<uint64_t>(n_sampled);
  st.last_prompt_ms = res.prompt_ms;
  st.last_gen_ms = res.gen_ms;
  if (m.metrics) m.metrics->record(res.rate);
  return res;
}

// ---- State ----------------------------------------------------------------------------

const SamplingParams& InferenceEngine::params() const { return impl_->sampler.params(); }
void InferenceEngine::set_params(SamplingParams params) {
  impl_->sampler.set_params(std::move(params));
}
void InferenceEngine::reseed(uint64_t seed) { impl_->sampler.reseed(seed); }
Rng::State InferenceEngine::rng_state() const { return impl_->sampler.rng().state(); }
void InferenceEngine::set_rng_state(const Rng::State& s) { impl_->sampler.rng().set_state(s); }
const EngineStats& InferenceEngine::stats() const { return impl_->stats; }
void InferenceEngine::reset_stats() { impl_->stats = EngineStats{}; }
void InferenceEngine::set_metrics(std::shared_ptr<RequestRateAggregator> metrics) {
  impl_->metrics = std::move(metrics);
}
kernels::Tier InferenceEngine::kernel_tier() const { return kernels::active_tier(); }
int64_t InferenceEngine::max_seq_len() const { return impl_->cache.n_ctx(); }
int64_t InferenceEngine::n_vocab() const { return impl_->n_vocab; }
const model::Model& InferenceEngine::model() const { return *impl_->model; }
const tokenizer::Tokenizer& InferenceEngine::tokenizer() const { return *impl_->tok; }
std::shared_ptr<const model::Model> InferenceEngine::model_ptr() const { return impl_->model; }
std::shared_ptr<const tokenizer::Tokenizer> InferenceEngine::tokenizer_ptr() const {
  return impl_->tok;
}
size_t InferenceEngine::kv_cache_bytes() const { return impl_->cache.bytes(); }

}  // namespace bonsai::engine
