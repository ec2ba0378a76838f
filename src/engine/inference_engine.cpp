// InferenceEngine: prefill, decode loop, sampling, stop handling; see
// inference_engine.h for the contract.
#include "engine/inference_engine.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "core/thread_pool.h"       // ThreadPool, global_pool
#include "engine/text_emitter.h"    // TextEmitter
#include "model/model.h"            // Model, KvCache, Workspace, Batch
#include "structured/token_mask.h"  // GrammarState, TokenTrie
#include "structured/vocab_trie.h"  // SharedTokenTrie
#include "tokenizer/tokenizer.h"    // Tokenizer

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
  std::shared_ptr<structured::SharedTokenTrie> trie;  // the model's vocabulary trie (grammar requests)
  std::vector<uint32_t> mask;                         // grammar mask scratch: bit id = allowed
  std::vector<float> masked;                          // [n_vocab] logits with the grammar mask applied

  // The stepwise generation in progress (start .. finish).
  struct Seq {
    bool active = false;
    bool done = false;
    std::vector<int32_t> prompt;  // copy of the request's prompt
    std::optional<SamplingParams> restore_params;
    std::optional<Rng::State> restore_rng;
    StreamCallback on_token;
    const std::atomic<bool>* cancel = nullptr;
    RequestRateTracker own_tracker;
    RequestRateTracker* tracker = nullptr;  // own_tracker or the request's
    TextEmitter emitter;
    GenerationResult res;
    int32_t n_sampled = 0;
    int32_t last = -1;
    Clock::time_point t_start{}, t_prefilled{};
    bool prefilled = false;
    // Constrained decoding (SamplingParams::grammar): this generation's
    // matcher state and the model's trie (owned by `trie` above).
    std::optional<structured::GrammarState> grammar;
    const structured::TokenTrie* vocab = nullptr;
    bool keep_tail = false;       // StartOptions::keep_tail
    std::vector<int32_t> replay;  // after suspend(): the tokens to recompute (positions 0..)
    // start_embedding: the prompt is the input; its hidden rows are pooled.
    bool embed = false;
    std::vector<double> emb_acc;  // [n_embd] sum of the rows of positions [0, emb_rows)
    int64_t emb_rows = 0;
  } seq;
  int32_t tail = -1;  // a finished generation's last sampled token, not yet in the cache (keep_tail)

  // Samples under the grammar: the mask applied to a copy of `logits`, then
  // the sampler's chain. -1 when the grammar allows no token (a dead end).
  int32_t sample_constrained(std::span<const float> logits);

  core::ThreadPool& compute_pool() const { return pool != nullptr ? *pool : core::global_pool(); }
  // Takes the cache back from the pool's prompt cache (it was parked while
  // idle and may have lost trailing blocks to eviction): the history follows.
  void claim() {
    if (!cache.paged()) return;
    cache.unpark();
    if (static_cast<int64_t>(history.size()) > cache.size()) history.resize(static_cast<size_t>(cache.size()));
  }
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

  auto impl = std::make_unique<Impl>();
  impl->model = std::move(model);
  impl->tok = std::move(tokenizer);
  impl->pool = options.pool;
  impl->cache = std::move(*cache);
  impl->sampler = Sampler(std::move(options.params));
  impl->n_vocab = cfg.n_vocab;
  impl->logits.assign(static_cast<size_t>(cfg.n_vocab), 0.0f);
  impl->trie =
      options.token_trie ? std::move(options.token_trie) : std::make_shared<structured::SharedTokenTrie>(impl->tok);
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
  if (m.tail >= 0) tail_done(false);
  m.claim();
  const auto held = static_cast<int64_t>(m.history.size());
  if (pos < 0 || pos > held) {
    return core::fail(core::Errc::kInvalidArgument, "prefill: position " + std::to_string(pos) + " is beyond the " +
                                                        std::to_string(held) + " positions in the cache");
  }
  const auto n = static_cast<int64_t>(tokens.size());
  if (pos + n > m.cache.n_ctx()) {
    return core::fail(core::Errc::kOutOfRange, "prefill: positions " + std::to_string(pos) + ".." +
                                                   std::to_string(pos + n - 1) + " exceed the context of " +
                                                   std::to_string(m.cache.n_ctx()) + " tokens");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= m.n_vocab) {
      return core::fail(core::Errc::kInvalidArgument, "prefill: token " + std::to_string(tokens[i]) + " at index " +
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

int32_t InferenceEngine::sample(std::span<const float> logits) { return impl_->sampler.sample(logits, impl_->history); }

void InferenceEngine::reset() {
  if (impl_->tail >= 0) tail_done(false);
  impl_->claim();
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

core::Expected<void> InferenceEngine::start(const GenerateRequest& req, const StartOptions& opt) {
  Impl& m = *impl_;
  const Clock::time_point t_start = Clock::now();
  if (m.seq.active) return core::fail(core::Errc::kInvalidArgument, "generate: a generation is in progress");
  if (req.prompt.empty()) return core::fail(core::Errc::kInvalidArgument, "generate: the prompt is empty");
  if (static_cast<int64_t>(req.prompt.size()) > m.cache.n_ctx()) {
    return core::fail(core::Errc::kOutOfRange, "generate: the prompt has " + std::to_string(req.prompt.size()) +
                                                   " tokens but the context holds " + std::to_string(m.cache.n_ctx()));
  }
  for (size_t i = 0; i < req.prompt.size(); ++i) {
    if (req.prompt[i] < 0 || req.prompt[i] >= m.n_vocab) {
      return core::fail(core::Errc::kInvalidArgument, "prefill: token " + std::to_string(req.prompt[i]) + " at index " +
                                                          std::to_string(i) + " is outside the vocabulary [0, " +
                                                          std::to_string(m.n_vocab) + ")");
    }
  }
  if (req.params) {
    if (auto ok = req.params->validate(); !ok) return std::unexpected(ok.error());
  }
  // The grammar's matcher state: built first, so an error leaves nothing to undo.
  std::optional<structured::GrammarState> grammar;
  const structured::TokenTrie* vocab = nullptr;
  if (const auto& g = req.params ? req.params->grammar : m.sampler.params().grammar; g) {
    auto t = m.trie->get();
    if (!t) return std::unexpected(t.error());
    auto st = structured::GrammarState::create(g);
    if (!st) return std::unexpected(st.error());
    vocab = *t;
    grammar.emplace(std::move(*st));
  }
  for (const auto& [id, bias] : (req.params ? *req.params : m.sampler.params()).logit_bias) {
    if (id < 0 || id >= m.n_vocab) {
      return core::fail(core::Errc::kInvalidArgument, "logit_bias: token " + std::to_string(id) +
                                                          " is outside the vocabulary [0, " +
                                                          std::to_string(m.n_vocab) + ")");
    }
  }
  if (m.tail >= 0) tail_done(false);
  m.claim();
  Impl::Seq& q = m.seq;
  q = Impl::Seq();
  q.grammar = std::move(grammar);
  q.vocab = vocab;
  q.active = true;
  q.t_start = t_start;
  // Swap params / seed for this call; finish() restores them.
  if (req.params) {
    q.restore_params = m.sampler.params();
    m.sampler.set_params(*req.params);
  }
  if (req.seed) {
    if (!q.restore_params) q.restore_params = m.sampler.params();  // reseed writes params().seed
    q.restore_rng = m.sampler.rng().state();
    m.sampler.reseed(*req.seed);
  }
  q.prompt.assign(req.prompt.begin(), req.prompt.end());
  q.keep_tail = opt.keep_tail;
  q.on_token = req.on_token;
  q.cancel = req.cancel;
  q.own_tracker = RequestRateTracker(t_start);
  q.tracker = req.tracker != nullptr ? req.tracker : &q.own_tracker;
  q.emitter = TextEmitter(m.sampler.params().stop);
  q.res.prompt_tokens = static_cast<int32_t>(q.prompt.size());
  q.res.finish_reason = FinishReason::kLength;

  const auto n_prompt = static_cast<int64_t>(q.prompt.size());
  int64_t keep = 0;
  const bool have_logits = static_cast<int64_t>(opt.prompt_logits.size()) == m.n_vocab;
  // Prompt logprobs need every prompt position's logits: nothing is reused
  // (unless the whole prompt's answer was given: a sibling choice).
  const bool prompt_rows = m.sampler.params().prompt_logprobs >= 0 && !have_logits;
  if (opt.reuse_prefix && !prompt_rows) {
    keep = cached_prefix(q.prompt);
    // The last prompt token is recomputed for its logits unless they were given.
    if (keep >= n_prompt && !have_logits) keep = n_prompt - 1;
  }
  if (prompt_rows) {
    q.res.prompt_logprobs.reserve(q.prompt.size());
    q.res.prompt_logprobs.push_back(TokenLogprob{.token = q.prompt[0]});  // logprob NaN: no context
  }
  m.cache.truncate(keep);
  m.history.resize(static_cast<size_t>(keep));
  q.res.cached_tokens = static_cast<int32_t>(keep);
  if (keep == n_prompt) {
    q.prefilled = true;
    q.t_prefilled = Clock::now();
    accept_logits(opt.prompt_logits);
  }
  return {};
}

bool InferenceEngine::active() const { return impl_->seq.active; }
bool InferenceEngine::finished() const { return impl_->seq.active && impl_->seq.done; }

int64_t InferenceEngine::pending_prompt() const {
  const Impl::Seq& q = impl_->seq;
  if (!q.active) return 0;
  const auto& src = q.replay.empty() ? q.prompt : q.replay;
  return std::max<int64_t>(0, static_cast<int64_t>(src.size()) - static_cast<int64_t>(impl_->history.size()));
}

int64_t InferenceEngine::next_pos() const { return static_cast<int64_t>(impl_->history.size()); }

std::span<const int32_t> InferenceEngine::next_input(int64_t max_prompt) const {
  const Impl::Seq& q = impl_->seq;
  if (!q.active || q.done) return {};
  if (const int64_t pending = pending_prompt(); pending > 0) {
    const size_t at = impl_->history.size();
    const auto& src = q.replay.empty() ? q.prompt : q.replay;
    return std::span<const int32_t>(src).subspan(
        at, static_cast<size_t>(std::min(pending, std::max<int64_t>(1, max_prompt))));
  }
  return std::span<const int32_t>(&q.last, 1);
}

bool InferenceEngine::logits_wanted(int64_t n) const {
  const Impl::Seq& q = impl_->seq;
  if (!q.active || q.done || q.embed) return false;
  if (!q.replay.empty()) return false;  // recomputing KV after suspend(): no sampling
  if (q.prefilled) return true;         // a decode token
  return n >= pending_prompt();
}

bool InferenceEngine::inputs_done(int64_t n) {
  Impl& m = *impl_;
  const std::span<const int32_t> in = next_input(n);
  m.history.insert(m.history.end(), in.begin(), in.begin() + n);
  if (!m.seq.replay.empty()) {
    if (m.history.size() >= m.seq.replay.size()) m.seq.replay.clear();  // caught up: decoding resumes
    return false;
  }
  if (m.seq.prefilled) return true;  // a decode token
  if (pending_prompt() > 0) return false;
  m.seq.prefilled = true;
  m.seq.t_prefilled = Clock::now();
  if (m.seq.embed) {
    // The whole input ran: the embedding is complete.
    if (m.seq.emb_rows == static_cast<int64_t>(m.seq.prompt.size())) m.seq.res.finish_reason = FinishReason::kStop;
    m.seq.done = true;
    return false;
  }
  return true;
}

// The checks embed() and start_embedding() share: no generation in
// progress, 1..n_ctx tokens, every id inside the vocabulary. Errors:
// kInvalidArgument (busy, empty, bad id), kOutOfRange (longer than n_ctx).
static core::Expected<void> check_embed_input(bool busy, int64_t n_ctx, int64_t n_vocab,
                                              std::span<const int32_t> tokens) {
  if (busy) return core::fail(core::Errc::kInvalidArgument, "embed: a generation is in progress");
  if (tokens.empty()) return core::fail(core::Errc::kInvalidArgument, "embed: no tokens");
  if (const auto n = static_cast<int64_t>(tokens.size()); n > n_ctx) {
    return core::fail(core::Errc::kOutOfRange, "embed: the input has " + std::to_string(n) +
                                                   " tokens but the context holds " + std::to_string(n_ctx));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      return core::fail(core::Errc::kInvalidArgument, "embed: token " + std::to_string(tokens[i]) + " at index " +
                                                          std::to_string(i) + " is outside the vocabulary [0, " +
                                                          std::to_string(n_vocab) + ")");
    }
  }
  return {};
}

core::Expected<void> InferenceEngine::start_embedding(std::span<const int32_t> tokens,
                                                      const std::atomic<bool>* cancel) {
  Impl& m = *impl_;
  const Clock::time_point t_start = Clock::now();
  if (auto ok = check_embed_input(m.seq.active, m.cache.n_ctx(), m.n_vocab, tokens); !ok)
    return std::unexpected(ok.error());
  const auto n = static_cast<int64_t>(tokens.size());
  reset();  // claims the cache, drops a pending tail
  Impl::Seq& q = m.seq;
  q = Impl::Seq();
  q.active = true;
  q.embed = true;
  q.t_start = t_start;
  q.prompt.assign(tokens.begin(), tokens.end());
  q.cancel = cancel;
  q.own_tracker = RequestRateTracker(t_start);
  q.tracker = &q.own_tracker;
  q.emb_acc.assign(static_cast<size_t>(m.model->config().n_embd), 0.0);
  q.res.prompt_tokens = static_cast<int32_t>(n);
  q.res.finish_reason = FinishReason::kLength;  // kStop once every row is pooled
  return {};
}

bool InferenceEngine::wants_hidden_rows() const {
  const Impl::Seq& q = impl_->seq;
  return q.active && !q.done && q.embed && pending_prompt() > 0;
}

void InferenceEngine::record_hidden_rows(std::span<const float> rows) {
  Impl& m = *impl_;
  Impl::Seq& q = m.seq;
  if (!wants_hidden_rows()) return;
  const size_t dim = q.emb_acc.size();
  const auto k = static_cast<int64_t>(rows.size() / dim);
  const auto pos0 = static_cast<int64_t>(m.history.size());
  // Rows of positions already pooled (replayed after a suspend()) are
  // skipped; the rest are added in position order, as mean_pool_l2 does.
  if (pos0 > q.emb_rows) return;  // a gap (never expected): the embedding stays incomplete (kLength)
  const int64_t skip = std::min<int64_t>(q.emb_rows - pos0, k);
  pool_add_rows(q.emb_acc, rows.subspan(static_cast<size_t>(skip) * dim, static_cast<size_t>(k - skip) * dim));
  q.emb_rows += k - skip;
}

bool InferenceEngine::wants_prompt_rows() const {
  const Impl::Seq& q = impl_->seq;
  return q.active && !q.done && q.replay.empty() && !q.res.prompt_logprobs.empty() && pending_prompt() > 0;
}

void InferenceEngine::record_prompt_rows(std::span<const float> rows) {
  Impl& m = *impl_;
  Impl::Seq& q = m.seq;
  if (!wants_prompt_rows()) return;
  const auto nv = static_cast<size_t>(m.n_vocab);
  const size_t k = rows.size() / nv;
  const int32_t top_n = m.sampler.params().prompt_logprobs;
  for (size_t j = 0; j < k; ++j) {
    // Row j ran the token at position next_pos() + j and predicts the next one.
    const size_t target = m.history.size() + j + 1;
    if (target >= q.prompt.size()) break;                  // the last prompt row predicts the first sampled token
    if (q.res.prompt_logprobs.size() != target) continue;  // already recorded (never expected)
    q.res.prompt_logprobs.push_back(token_logprob(rows.subspan(j * nv, nv), q.prompt[target], top_n));
  }
}

void InferenceEngine::suspend() {
  Impl& m = *impl_;
  Impl::Seq& q = m.seq;
  if (!q.active || q.done) return;
  // Prefilled: recompute prompt + generated tokens (not the last sampled one,
  // which is the next decode input). Still in the prompt: start it over.
  if (q.prefilled && q.replay.empty()) q.replay = m.history;
  m.history.clear();
  m.cache.clear();
}

bool InferenceEngine::replaying() const { return !impl_->seq.replay.empty(); }

std::span<const int32_t> InferenceEngine::tail_input() const {
  const Impl& m = *impl_;
  if (m.tail < 0) return {};
  return std::span<const int32_t>(&m.tail, 1);
}

void InferenceEngine::tail_done(bool ran) {
  Impl& m = *impl_;
  if (m.tail < 0) return;
  if (ran) m.history.push_back(m.tail);
  m.tail = -1;
  if (m.cache.size() < static_cast<int64_t>(m.history.size())) m.history.resize(static_cast<size_t>(m.cache.size()));
  m.cache.park();
}
const std::vector<TokenLogprob>& InferenceEngine::prompt_logprobs() const { return impl_->seq.res.prompt_logprobs; }

bool InferenceEngine::poll_cancel() {
  Impl::Seq& q = impl_->seq;
  if (!q.active || q.done) return q.done;
  if (q.cancel != nullptr && q.cancel->load(std::memory_order_relaxed)) {
    stop_now(FinishReason::kCancelled);
    return true;
  }
  return false;
}

void InferenceEngine::stop_now(FinishReason reason, bool timed_out) {
  Impl::Seq& q = impl_->seq;
  if (!q.active || q.done) return;
  q.done = true;
  q.res.finish_reason = reason;
  q.res.timed_out = timed_out;
}

void InferenceEngine::accept_logits(std::span<const float> logits) {
  Impl& m = *impl_;
  Impl::Seq& q = m.seq;
  if (!q.active || q.done) return;
  const SamplingParams& params = m.sampler.params();
  std::optional<TokenLogprob> lp;  // this token's, when params.logprobs >= 0
  auto emit = [&](int32_t token, int32_t index, const std::string& text) {
    if (!q.on_token) return true;
    return q.on_token(TokenEvent{token, index, text, lp ? &*lp : nullptr});
  };
  // The checks generate_request's loop makes before each sample / decode.
  auto may_continue = [&] {
    if (params.max_tokens >= 0 && q.n_sampled >= params.max_tokens) {
      q.done = true;  // finish_reason stays kLength
      return false;
    }
    if (q.cancel != nullptr && q.cancel->load(std::memory_order_relaxed)) {
      stop_now(FinishReason::kCancelled);
      return false;
    }
    return true;
  };
  if (!may_continue()) return;
  int32_t tok;
  if (q.grammar) {
    tok = m.sample_constrained(logits);
    if (tok < 0) {
      // Nothing may follow: a complete sentence is a stop, an incomplete one
      // (a dead end, e.g. a stack limit) ends like a truncation.
      q.res.finish_reason = q.grammar->can_end() ? FinishReason::kStop : FinishReason::kLength;
      q.done = true;
      return;
    }
  } else {
    tok = m.sampler.sample(logits, m.history);
  }
  q.tracker->on_token();
  const int32_t index = q.n_sampled++;
  q.last = tok;
  if (q.grammar && !q.grammar->accept_token(*q.vocab, tok)) {
    // sample_constrained only returns allowed tokens; a matcher that still
    // refuses one (an internal limit) ends the answer as a dead end would.
    q.res.finish_reason = FinishReason::kLength;
    q.done = true;
    emit(tok, index, std::string());
    return;
  }
  // Log probabilities come from the raw logits (the sampler worked on a copy).
  if (params.logprobs >= 0) lp = token_logprob(logits, tok, params.logprobs);
  const bool grammar_ended = q.grammar && q.grammar->finished();
  if ((!params.ignore_eos || grammar_ended) && m.tok->is_eog(tok)) {
    q.res.finish_reason = FinishReason::kStop;
    q.done = true;
    lp.reset();  // a terminating EOS is not part of the answer (nor of res.logprobs)
    emit(tok, index, std::string());
    return;
  }
  q.res.tokens.push_back(tok);
  if (lp) q.res.logprobs.push_back(*lp);
  const std::string piece = q.emitter.push(m.tok->token_to_bytes(tok));
  if (q.emitter.stopped()) {
    q.res.finish_reason = FinishReason::kStop;
    q.done = true;
    emit(tok, index, piece);
    return;
  }
  if (!emit(tok, index, piece)) {
    stop_now(FinishReason::kCancelled);
    return;
  }
  if (!may_continue()) return;
  if (static_cast<int64_t>(m.history.size()) >= m.cache.n_ctx()) q.done = true;  // context full: length
}

int32_t InferenceEngine::Impl::sample_constrained(std::span<const float> in) {
  structured::GrammarState& g = *seq.grammar;
  const structured::TokenTrie& trie = *seq.vocab;
  const SamplingParams& params = sampler.params();
  // Greedy: the unconstrained arg-max, when the grammar allows it, is also
  // the arg-max of the masked logits (masking only lowers logits to -inf,
  // which the bias and penalties keep at -inf), and greedy draws no random
  // number; so the full mask is needed only when it is refused.
  if (params.temperature <= 0.0f) {
    const int32_t t = sampler.sample(in, history);
    if (g.accepts_token(trie, t)) return t;
  }
  g.allowed(trie, mask);
  const size_t n = in.size();
  const auto n_trie = static_cast<size_t>(trie.n_vocab());
  auto ok = [&](size_t id) { return id < n_trie && ((mask[id >> 5] >> (id & 31)) & 1u) != 0; };
  masked.resize(n);
  const float ninf = -std::numeric_limits<float>::infinity();
  int32_t best = -1;  // the allowed id with the largest raw logit (lowest id on ties)
  for (size_t i = 0; i < n; ++i) {
    if (ok(i)) {
      masked[i] = in[i];
      if (best < 0 || in[i] > in[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
    } else {
      masked[i] = ninf;
    }
  }
  if (best < 0) return -1;
  const int32_t t = sampler.sample(masked, history);
  // Rounding in the chain (every allowed logit -inf or NaN, or a cumulative
  // sum short of 1) could land on a masked id: take the best allowed one.
  return ok(static_cast<size_t>(t)) ? t : best;
}

GenerationResult InferenceEngine::finish() {
  Impl& m = *impl_;
  Impl::Seq& q = m.seq;
  GenerationResult res = std::move(q.res);
  if (!q.active) return res;
  if (q.embed) {
    // No text, no sampling stats: the pooled rows, when complete.
    if (res.finish_reason == FinishReason::kStop) res.embedding = pool_finish(q.emb_acc, q.emb_rows);
    const Clock::time_point t_end = Clock::now();
    if (!q.prefilled) q.t_prefilled = t_end;
    res.prompt_ms = ms_since(q.t_start, q.t_prefilled);
    abandon();  // idle: the cache (holding the input) is parked, as after embed()
    return res;
  }
  if (const std::string rest = q.emitter.finish(); !rest.empty() && q.on_token)
    q.on_token(TokenEvent{-1, q.n_sampled, rest});
  const Clock::time_point t_end = Clock::now();
  if (!q.prefilled) q.t_prefilled = t_end;
  q.tracker->on_finish(t_end);
  res.text = q.emitter.released();
  res.completion_tokens = q.n_sampled;
  res.prompt_ms = ms_since(q.t_start, q.t_prefilled);
  res.gen_ms = ms_since(q.t_prefilled, t_end);
  res.rate = q.tracker->summary();

  EngineStats& st = m.stats;
  ++st.requests;
  st.prompt_tokens += static_cast<uint64_t>(res.prompt_tokens);
  st.generated_tokens += static_cast<uint64_t>(q.n_sampled);
  st.prompt_ms += res.prompt_ms;
  st.gen_ms += res.gen_ms;
  st.last_prompt_tokens = static_cast<uint64_t>(res.prompt_tokens);
  st.last_generated_tokens = static_cast<uint64_t>(q.n_sampled);
  st.last_prompt_ms = res.prompt_ms;
  st.last_gen_ms = res.gen_ms;
  if (m.metrics) m.metrics->record(res.rate);
  // The last sampled token never ran; with keep_tail it is kept for one more
  // forward (tail_input) so the cache holds prompt + the whole answer.
  const bool tail = q.keep_tail && q.last >= 0 && res.finish_reason != FinishReason::kCancelled && q.replay.empty() &&
                    static_cast<int64_t>(m.history.size()) < m.cache.n_ctx() &&
                    m.cache.size() == static_cast<int64_t>(m.history.size());
  const int32_t last = q.last;
  abandon();
  if (tail) {
    m.tail = last;
    m.cache.unpark();  // pinned until tail_done()
  }
  return res;
}

void InferenceEngine::abandon() {
  Impl& m = *impl_;
  Impl::Seq& q = m.seq;
  if (q.restore_params) m.sampler.set_params(std::move(*q.restore_params));
  if (q.restore_rng) m.sampler.rng().set_state(*q.restore_rng);
  q = Impl::Seq();
  // Idle now: the cache's blocks stay as a prompt cache the pool may evict.
  if (m.cache.size() < static_cast<int64_t>(m.history.size())) m.history.resize(static_cast<size_t>(m.cache.size()));
  m.cache.park();
}

int64_t InferenceEngine::cached_prefix(std::span<const int32_t> tokens) const {
  const auto& h = impl_->history;
  const size_t n = std::min(h.size(), tokens.size());
  size_t i = 0;
  while (i < n && h[i] == tokens[i]) ++i;
  return static_cast<int64_t>(i);
}

core::Expected<void> InferenceEngine::copy_prefix_from(const InferenceEngine& src, int64_t n) {
  Impl& m = *impl_;
  const Impl& s = *src.impl_;
  if (s.model != m.model || n < 0 || n > static_cast<int64_t>(s.history.size()) || n > s.cache.size() ||
      n > m.cache.n_ctx() || !m.cache.matches_cache(s.cache)) {
    return core::fail(core::Errc::kInvalidArgument, "copy_prefix_from: " + std::to_string(n) +
                                                        " positions do not fit (another model, cache "
                                                        "type or size, or more than the source holds)");
  }
  m.claim();
  // Same pool: the blocks are shared (copy-on-write); otherwise rows are copied.
  if (auto ok = m.cache.copy_prefix_from(s.cache, n); !ok) {
    m.history.resize(static_cast<size_t>(m.cache.size()));
    return ok;
  }
  m.history.assign(s.history.begin(), s.history.begin() + n);
  return {};
}

core::Expected<std::vector<float>> InferenceEngine::embed(std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  if (auto ok = check_embed_input(m.seq.active, m.cache.n_ctx(), m.n_vocab, tokens); !ok)
    return std::unexpected(ok.error());
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t dim = m.model->config().n_embd;
  std::vector<float> hidden(static_cast<size_t>(n * dim));
  reset();
  model::KvCache* caches[] = {&m.cache};
  for (int64_t off = 0; off < n; off += kPrefillChunk) {
    const int64_t len = std::min(kPrefillChunk, n - off);
    const auto chunk = tokens.subspan(static_cast<size_t>(off), static_cast<size_t>(len));
    const model::Batch batch = model::Batch::for_sequence(chunk, static_cast<int32_t>(off), 0, /*all_logits=*/true);
    auto ok = m.model->forward_hidden(
        batch, caches, m.ws, std::span<float>(hidden).subspan(static_cast<size_t>(off * dim)), m.compute_pool());
    if (!ok) {
      reset();
      m.cache.park();
      return std::unexpected(ok.error());
    }
    m.history.insert(m.history.end(), chunk.begin(), chunk.end());
  }
  // Idle again: the blocks stay as a prompt cache the pool may evict (as
  // after a generation), not pinned while the replica waits in its pool.
  m.cache.park();
  return mean_pool_l2(hidden, n, dim);
}

model::KvCache& InferenceEngine::kv_cache() { return impl_->cache; }
const model::KvCache& InferenceEngine::kv_cache() const { return impl_->cache; }
int64_t InferenceEngine::kv_cache_blocks() const { return impl_->cache.blocks(); }
const std::vector<int32_t>& InferenceEngine::history() const { return impl_->history; }

core::Expected<GenerationResult> InferenceEngine::generate_request(const GenerateRequest& req) {
  Impl& m = *impl_;
  if (auto ok = start(req); !ok) return std::unexpected(ok.error());
  // One sequence, prompt in chunks of kPrefillChunk, then one token per step.
  std::vector<float> rows;  // prompt logprobs: every fed token's logits
  while (!finished()) {
    if (poll_cancel()) break;
    const bool all_rows = wants_prompt_rows();
    const std::span<const int32_t> in = next_input(all_rows ? kPromptRowsChunk : kPrefillChunk);
    const int64_t pos = next_pos();
    const model::Batch batch = model::Batch::for_sequence(in, static_cast<int32_t>(pos), 0, all_rows);
    model::KvCache* caches[] = {&m.cache};
    const size_t nv = static_cast<size_t>(m.n_vocab);
    if (all_rows) rows.resize(in.size() * nv);
    auto ok = m.model->forward(batch, caches, m.ws, all_rows ? std::span<float>(rows) : std::span<float>(m.logits),
                               m.compute_pool());
    if (!ok) {
      m.cache.truncate(pos);
      abandon();
      return std::unexpected(ok.error());
    }
    if (all_rows) {
      record_prompt_rows(rows);
      std::copy(rows.end() - static_cast<std::ptrdiff_t>(nv), rows.end(), m.logits.begin());  // the last row
    }
    if (inputs_done(static_cast<int64_t>(in.size()))) accept_logits(m.logits);
  }
  return finish();
}

// ---- State ----------------------------------------------------------------------------

const SamplingParams& InferenceEngine::params() const { return impl_->sampler.params(); }
void InferenceEngine::set_params(SamplingParams params) { impl_->sampler.set_params(std::move(params)); }
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
std::shared_ptr<const tokenizer::Tokenizer> InferenceEngine::tokenizer_ptr() const { return impl_->tok; }
size_t InferenceEngine::kv_cache_bytes() const { return impl_->cache.bytes(); }

}  // namespace bonsai::engine
