// InferenceEngine: one replica driving its Sequence; see inference_engine.h
// for the contract.
#include "engine/inference_engine.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <utility>

#include "core/thread_pool.h"       // ThreadPool, global_pool
#include "model/model.h"            // Model, KvCache, Workspace, Batch
#include "structured/vocab_trie.h"  // SharedTokenTrie
#include "tokenizer/tokenizer.h"    // Tokenizer

namespace bonsai::engine {

struct InferenceEngine::Impl {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  std::shared_ptr<structured::SharedTokenTrie> trie;  // the model's vocabulary trie (grammar requests)
  core::ThreadPool* pool = nullptr;                   // borrowed; nullptr: core::global_pool()
  Sequence seq;                                       // cache, tokens, sampler, the generation in progress
  model::Workspace ws;
  std::vector<float> logits;  // [n_vocab] of the last token run
  EngineStats stats;
  std::shared_ptr<RequestRateAggregator> metrics;
  int64_t n_vocab = 0;
  // Speculation's cost model (generate_request): moving averages (weight
  // 1/4) of a one-row decode step and of one more row's time, in seconds.
  double decode_s = 0, row_s = 0;
  // The most a greedy sequence proposes before row_s is measured: one token
  // (draft-min if larger; any number with a fixed SpecOptions::row_cost).
  int64_t first_draft = 1;
  // Whether a greedy sequence's proposals pay, measured (issue 29: never
  // slower); kept across requests, as the machine and model are.
  SpecGuard guard;

  Impl(SequenceModel shared, model::KvCache cache, Sampler sampler)
      : model(shared.model),
        tok(shared.tokenizer),
        trie(shared.token_trie),
        seq(std::move(shared), std::move(cache), std::move(sampler)) {}
  core::ThreadPool& compute_pool() const { return pool != nullptr ? *pool : core::global_pool(); }
};

core::Expected<InferenceEngine> InferenceEngine::create(std::shared_ptr<const model::Model> model,
                                                        std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
                                                        EngineOptions options) {
  if (model == nullptr) return core::fail(core::Errc::kInvalidArgument, "InferenceEngine: model is null");
  if (tokenizer == nullptr) {
    return core::fail(core::Errc::kInvalidArgument, "InferenceEngine: tokenizer is null");
  }
  if (auto ok = options.params.validate(); !ok) return std::unexpected(ok.error());
  if (options.max_seq_len < 0) {
    return core::fail(core::Errc::kInvalidArgument,
                      "InferenceEngine: max_seq_len must be >= 0, got " + std::to_string(options.max_seq_len));
  }
  const model::ModelConfig& cfg = model->config();
  int64_t n_ctx = options.max_seq_len;
  if (n_ctx == 0) n_ctx = std::min(cfg.n_ctx_train > 0 ? cfg.n_ctx_train : kDefaultMaxSeqLen, kDefaultMaxSeqLen);
  const model::KvType tk = options.kv_f32 ? model::KvType::kF32 : options.kv_type_k;
  const model::KvType tv = options.kv_f32 ? model::KvType::kF32 : options.kv_type_v;
  if (options.kv_pool != nullptr &&
      (!options.kv_pool->matches(cfg) || options.kv_pool->type_k() != tk || options.kv_pool->type_v() != tv)) {
    return core::fail(core::Errc::kInvalidArgument,
                      "InferenceEngine: the KV pool was made for another model or cache type");
  }
  auto cache = options.kv_pool != nullptr ? model::KvCache::create(options.kv_pool, n_ctx)
                                          : model::KvCache::create(cfg, n_ctx, tk, tv);
  if (!cache) return std::unexpected(cache.error());

  auto trie =
      options.token_trie ? std::move(options.token_trie) : std::make_shared<structured::SharedTokenTrie>(tokenizer);
  auto impl = std::make_unique<Impl>(SequenceModel{std::move(model), std::move(tokenizer), std::move(trie)},
                                     std::move(*cache), Sampler(std::move(options.params)));
  impl->pool = options.pool;
  if (auto ok = options.spec.validate(); !ok) return std::unexpected(ok.error());
  impl->seq.set_spec(options.spec);
  impl->first_draft = options.spec.row_cost >= 0 ? kMaxDraft : std::max<int64_t>(1, options.spec.draft_min);
  impl->n_vocab = cfg.n_vocab;
  impl->logits.assign(static_cast<size_t>(cfg.n_vocab), 0.0f);
  return InferenceEngine(std::move(impl));
}

InferenceEngine::InferenceEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InferenceEngine::InferenceEngine(InferenceEngine&&) noexcept = default;
InferenceEngine& InferenceEngine::operator=(InferenceEngine&&) noexcept = default;
InferenceEngine::~InferenceEngine() = default;

// ---- Low-level steps ----------------------------------------------------------

core::Expected<std::span<const float>> InferenceEngine::prefill_from_pos(std::span<const int32_t> tokens, int64_t pos) {
  Impl& m = *impl_;
  if (tokens.empty()) return core::fail(core::Errc::kInvalidArgument, "prefill: no tokens");
  m.seq.claim();
  const int64_t held = m.seq.next_pos();
  if (pos < 0 || pos > held) {
    return core::fail(core::Errc::kInvalidArgument, "prefill: position " + std::to_string(pos) + " is beyond the " +
                                                        std::to_string(held) + " positions in the cache");
  }
  const auto n = static_cast<int64_t>(tokens.size());
  if (pos + n > m.seq.n_ctx()) {
    return core::fail(core::Errc::kOutOfRange, "prefill: positions " + std::to_string(pos) + ".." +
                                                   std::to_string(pos + n - 1) + " exceed the context of " +
                                                   std::to_string(m.seq.n_ctx()) + " tokens");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= m.n_vocab) {
      return core::fail(core::Errc::kInvalidArgument, "prefill: token " + std::to_string(tokens[i]) + " at index " +
                                                          std::to_string(i) + " is outside the vocabulary [0, " +
                                                          std::to_string(m.n_vocab) + ")");
    }
  }
  m.seq.truncate(pos);
  model::KvCache* caches[] = {&m.seq.kv_cache()};
  for (int64_t off = 0; off < n; off += kPrefillChunk) {
    const int64_t len = std::min(kPrefillChunk, n - off);
    const auto chunk = tokens.subspan(static_cast<size_t>(off), static_cast<size_t>(len));
    const model::Batch batch = model::Batch::for_sequence(chunk, static_cast<int32_t>(pos + off));
    auto ok = m.model->forward(batch, caches, m.ws, m.logits, m.compute_pool());
    if (!ok) {
      m.seq.truncate(pos + off);
      return std::unexpected(ok.error());
    }
    m.seq.append_tokens(chunk);
  }
  return std::span<const float>(m.logits);
}

core::Expected<std::span<const float>> InferenceEngine::decode_step(int32_t token) {
  const int32_t one[] = {token};
  return prefill_from_pos(one, impl_->seq.next_pos());
}

int32_t InferenceEngine::sample(std::span<const float> logits) {
  return impl_->seq.sampler().sample(logits, impl_->seq.tokens());
}

void InferenceEngine::reset() { impl_->seq.truncate(0); }

int64_t InferenceEngine::position() const { return impl_->seq.next_pos(); }

// ---- Generation -------------------------------------------------------------------

core::Expected<GenerationResult> InferenceEngine::generate(std::span<const int32_t> prompt) {
  GenerateRequest r;
  r.prompt = prompt;
  return generate_request(r);
}

core::Expected<GenerationResult> InferenceEngine::generate_with_params(std::span<const int32_t> prompt,
                                                                       const SamplingParams& params) {
  GenerateRequest r;
  r.prompt = prompt;
  r.params = params;
  return generate_request(r);
}

core::Expected<GenerationResult> InferenceEngine::generate_with_seed(std::span<const int32_t> prompt, uint64_t seed) {
  GenerateRequest r;
  r.prompt = prompt;
  r.seed = seed;
  return generate_request(r);
}

core::Expected<GenerationResult> InferenceEngine::generate_streaming(std::span<const int32_t> prompt,
                                                                     const StreamCallback& on_token) {
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

// ---- Stepwise generation: the replica's Sequence -------------------------------------

core::Expected<void> InferenceEngine::start(const GenerateRequest& req, const StartOptions& opt) {
  return impl_->seq.start(req, opt);
}
bool InferenceEngine::active() const { return impl_->seq.active(); }
bool InferenceEngine::finished() const { return impl_->seq.finished(); }
std::span<const int32_t> InferenceEngine::next_input(int64_t max_prompt) const {
  return impl_->seq.next_input(max_prompt);
}
int64_t InferenceEngine::next_pos() const { return impl_->seq.next_pos(); }
int64_t InferenceEngine::pending_prompt() const { return impl_->seq.pending_prompt(); }
bool InferenceEngine::inputs_done(int64_t n) { return impl_->seq.inputs_done(n); }
bool InferenceEngine::logits_wanted(int64_t n) const { return impl_->seq.logits_wanted(n); }
void InferenceEngine::suspend() { impl_->seq.suspend(); }
bool InferenceEngine::replaying() const { return impl_->seq.replaying(); }
void InferenceEngine::accept_logits(std::span<const float> logits) { impl_->seq.accept_logits(logits); }
void InferenceEngine::stop_now(FinishReason reason, bool timed_out) { impl_->seq.stop_now(reason, timed_out); }
bool InferenceEngine::poll_cancel() { return impl_->seq.poll_cancel(); }
void InferenceEngine::abandon() { impl_->seq.abandon(); }
bool InferenceEngine::wants_prompt_rows() const { return impl_->seq.wants_prompt_rows(); }
void InferenceEngine::record_prompt_rows(std::span<const float> rows) { impl_->seq.record_prompt_rows(rows); }
const std::vector<TokenLogprob>& InferenceEngine::prompt_logprobs() const { return impl_->seq.prompt_logprobs(); }
core::Expected<void> InferenceEngine::start_embedding(std::span<const int32_t> tokens,
                                                      const std::atomic<bool>* cancel) {
  return impl_->seq.start_embedding(tokens, cancel);
}
bool InferenceEngine::wants_hidden_rows() const { return impl_->seq.wants_hidden_rows(); }
void InferenceEngine::record_hidden_rows(std::span<const float> rows) { impl_->seq.record_hidden_rows(rows); }
int64_t InferenceEngine::cached_prefix(std::span<const int32_t> tokens) const {
  return impl_->seq.cached_prefix(tokens);
}
core::Expected<void> InferenceEngine::copy_prefix_from(const InferenceEngine& src, int64_t n) {
  return impl_->seq.copy_prefix_from(src.impl_->seq, n);
}

GenerationResult InferenceEngine::finish() {
  Impl& m = *impl_;
  const bool embedding = m.seq.is_embedding();
  const bool was_active = m.seq.active();
  GenerationResult res = m.seq.finish();
  if (!was_active || embedding) return res;
  EngineStats& st = m.stats;
  ++st.requests;
  st.prompt_tokens += static_cast<uint64_t>(res.prompt_tokens);
  st.generated_tokens += static_cast<uint64_t>(res.completion_tokens);
  st.prompt_ms += res.prompt_ms;
  st.gen_ms += res.gen_ms;
  st.last_prompt_tokens = static_cast<uint64_t>(res.prompt_tokens);
  st.last_generated_tokens = static_cast<uint64_t>(res.completion_tokens);
  st.last_prompt_ms = res.prompt_ms;
  st.last_gen_ms = res.gen_ms;
  if (m.metrics) m.metrics->record(res.rate);
  return res;
}

core::Expected<std::vector<float>> InferenceEngine::embed(std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  if (m.seq.active()) return core::fail(core::Errc::kInvalidArgument, "embed: a generation is in progress");
  if (auto ok = check_embedding_input(tokens, m.seq.n_ctx(), m.n_vocab); !ok) return std::unexpected(ok.error());
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t dim = m.model->config().n_embd;
  std::vector<float> hidden(static_cast<size_t>(n * dim));
  reset();
  model::KvCache* caches[] = {&m.seq.kv_cache()};
  for (int64_t off = 0; off < n; off += kPrefillChunk) {
    const int64_t len = std::min(kPrefillChunk, n - off);
    const auto chunk = tokens.subspan(static_cast<size_t>(off), static_cast<size_t>(len));
    const model::Batch batch = model::Batch::for_sequence(chunk, static_cast<int32_t>(off), 0, /*all_logits=*/true);
    auto ok = m.model->forward_hidden(
        batch, caches, m.ws, std::span<float>(hidden).subspan(static_cast<size_t>(off * dim)), m.compute_pool());
    if (!ok) {
      reset();
      m.seq.kv_cache().park();
      return std::unexpected(ok.error());
    }
    m.seq.append_tokens(chunk);
  }
  // Idle again: the blocks stay as a prompt cache the pool may evict (as
  // after a generation), not pinned while the replica waits in its pool.
  m.seq.kv_cache().park();
  return mean_pool_l2(hidden, n, dim);
}

model::KvCache& InferenceEngine::kv_cache() { return impl_->seq.kv_cache(); }
const model::KvCache& InferenceEngine::kv_cache() const { return impl_->seq.kv_cache(); }
int64_t InferenceEngine::kv_cache_blocks() const { return impl_->seq.kv_cache().blocks(); }
const std::vector<int32_t>& InferenceEngine::history() const { return impl_->seq.tokens(); }

core::Expected<GenerationResult> InferenceEngine::generate_request(const GenerateRequest& req) {
  Impl& m = *impl_;
  if (auto ok = start(req); !ok) return std::unexpected(ok.error());
  // One sequence, prompt in chunks of kPrefillChunk, then one token per step
  // (with the tokens its proposer offers, when speculating: every row wanted).
  std::vector<float> rows;  // prompt logprobs or a proposal: every fed token's logits
  while (!finished()) {
    if (poll_cancel()) break;
    const int64_t pos = next_pos();
    // One more row's cost relative to a decode step (until measured: kSampledRowCost).
    // One more row's cost relative to a decode step; before a plain decode
    // step was timed, too much for a greedy sequence to propose (a sampled
    // one uses kSampledRowCost whatever is measured: Sequence::propose).
    double row_cost = !(m.decode_s > 0) ? std::numeric_limits<double>::infinity()
                      : m.row_s > 0     ? m.row_s / m.decode_s
                                        : kSampledRowCost;
    const bool decoding = m.seq.pending_prompt() == 0;
    // Where proposing yields fewer tokens per second than not (measured),
    // a greedy sequence does not propose (SpecGuard; sampled ones ignore row_cost).
    if (decoding && m.decode_s > 0 && !m.guard.allow(1)) row_cost = std::numeric_limits<double>::infinity();
    // Until a wider step was timed, a greedy sequence proposes one token at
    // most: where a row costs as much as a step (a compute-bound kernel) the
    // first measurement then wastes one row, not draft-max of them. (A
    // sampled one proposes by its own acceptance only, so a seeded request
    // draws the same numbers on any driver: Sequence::propose.)
    const bool greedy = !(m.seq.sampler().params().temperature > 0.0f);
    const int64_t max_draft = m.row_s > 0 || !greedy ? kMaxDraft : m.first_draft;
    if (decoding && m.seq.propose(max_draft, row_cost, m.decode_s) > 0) {
      // The proposal's positions need blocks (a pooled cache): as many as it gives.
      if (!m.seq.kv_cache().prepare(pos, pos + 1 + m.seq.proposed()))
        m.seq.trim_proposal(m.seq.kv_cache().blocks() * m.seq.kv_cache().block_size() - pos - 1);
    }
    const bool speculating = m.seq.proposed() > 0;
    const bool all_rows = wants_prompt_rows() || speculating;
    const std::span<const int32_t> in = next_input(all_rows && !speculating ? kPromptRowsChunk : kPrefillChunk);
    const model::Batch batch = model::Batch::for_sequence(in, static_cast<int32_t>(pos), 0, all_rows);
    model::KvCache* caches[] = {&m.seq.kv_cache()};
    const size_t nv = static_cast<size_t>(m.n_vocab);
    if (all_rows) rows.resize(in.size() * nv);
    const Clock::time_point t0 = Clock::now();
    auto ok = m.model->forward(batch, caches, m.ws, all_rows ? std::span<float>(rows) : std::span<float>(m.logits),
                               m.compute_pool());
    if (decoding && ok) {
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      // A sample far above the average (the thread descheduled on a loaded
      // machine) counts as 3x the average, so one stall does not skew it.
      const auto blend = [](double& avg, double x) { avg = avg > 0 ? avg + 0.25 * (std::min(x, 3 * avg) - avg) : x; };
      if (!speculating) {
        blend(m.decode_s, t);
      } else if (m.decode_s > 0) {
        blend(m.row_s, std::max(t - m.decode_s, 0.01 * m.decode_s) / static_cast<double>(in.size() - 1));
      }
    }
    if (!ok) {
      m.seq.truncate(pos);
      abandon();
      return std::unexpected(ok.error());
    }
    if (speculating) {
      inputs_done(static_cast<int64_t>(in.size()));
      const SpecCounts c = m.seq.accept_rows(rows);
      m.stats.spec_proposed += static_cast<uint64_t>(c.proposed);
      m.stats.spec_accepted += static_cast<uint64_t>(c.accepted);
      // What the step yielded, verification included (greedy: SpecGuard).
      if (greedy) m.guard.record(1, true, 1 + c.accepted, std::chrono::duration<double>(Clock::now() - t0).count());
      continue;
    }
    if (all_rows) {
      record_prompt_rows(rows);
      std::copy(rows.end() - static_cast<std::ptrdiff_t>(nv), rows.end(), m.logits.begin());  // the last row
    }
    if (inputs_done(static_cast<int64_t>(in.size()))) accept_logits(m.logits);
    if (decoding && greedy && m.decode_s > 0)
      m.guard.record(1, false, 1, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return finish();
}

// ---- State ----------------------------------------------------------------------------

const SamplingParams& InferenceEngine::params() const { return impl_->seq.sampler().params(); }
void InferenceEngine::set_params(SamplingParams params) { impl_->seq.sampler().set_params(std::move(params)); }
void InferenceEngine::reseed(uint64_t seed) { impl_->seq.sampler().reseed(seed); }
Rng::State InferenceEngine::rng_state() const { return impl_->seq.sampler().rng().state(); }
void InferenceEngine::set_rng_state(const Rng::State& s) { impl_->seq.sampler().rng().set_state(s); }
const EngineStats& InferenceEngine::stats() const { return impl_->stats; }
void InferenceEngine::reset_stats() { impl_->stats = EngineStats{}; }
void InferenceEngine::set_metrics(std::shared_ptr<RequestRateAggregator> metrics) {
  impl_->metrics = std::move(metrics);
}
kernels::Tier InferenceEngine::kernel_tier() const { return kernels::active_tier(); }
int64_t InferenceEngine::max_seq_len() const { return impl_->seq.n_ctx(); }
int64_t InferenceEngine::n_vocab() const { return impl_->n_vocab; }
const model::Model& InferenceEngine::model() const { return *impl_->model; }
const tokenizer::Tokenizer& InferenceEngine::tokenizer() const { return *impl_->tok; }
std::shared_ptr<const model::Model> InferenceEngine::model_ptr() const { return impl_->model; }
std::shared_ptr<const tokenizer::Tokenizer> InferenceEngine::tokenizer_ptr() const { return impl_->tok; }
size_t InferenceEngine::kv_cache_bytes() const { return impl_->seq.kv_cache().bytes(); }
SequenceModel InferenceEngine::sequence_model() const { return SequenceModel{impl_->model, impl_->tok, impl_->trie}; }
const std::shared_ptr<RequestRateAggregator>& InferenceEngine::metrics() const { return impl_->metrics; }

}  // namespace bonsai::engine
