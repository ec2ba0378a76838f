// Sequence: one stream's state and moves; see sequence.h for the contract.
#include "engine/sequence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "model/model.h"            // Model (config)
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

// The generation (or embedding) in progress, start .. finish; a fresh
// value is "none" (Sequence::State::clear_generation).
struct SequenceGeneration {
  bool active = false;
  bool done = false;
  std::vector<int32_t> prompt;  // copy of the request's prompt (or the embedding's input)
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
  // Constrained decoding (SamplingParams::grammar): the matcher state and
  // the model's trie (owned by SequenceModel::token_trie).
  std::optional<structured::GrammarState> grammar;
  const structured::TokenTrie* vocab = nullptr;
  std::vector<int32_t> replay;  // after suspend(): the tokens to recompute (positions 0..)
  // start_embedding: the prompt is the input; its hidden rows are pooled.
  bool embed = false;
  std::vector<double> emb_acc;  // [n_embd] sum of the rows of positions [0, emb_rows)
  int64_t emb_rows = 0;
  // Speculation: [last, proposed...] while a proposal is out (empty: none),
  // the acceptance estimate (exponential moving average over verified
  // proposed tokens, weight kAcceptWeight) and the first token of a
  // proposal that was not run (-1: none), compared with what is sampled.
  std::vector<int32_t> decode_in;
  double acceptance = kInitialAcceptance;
  int32_t shadow = -1;
  static constexpr double kInitialAcceptance = 0.6;
  static constexpr double kAcceptWeight = 0.15;
};

struct Sequence::State : SequenceGeneration {
  SequenceModel shared;
  int64_t n_vocab = 0;
  model::KvCache cache;
  Sampler sampler;
  std::vector<int32_t> history;  // the tokens in the cache, by position
  std::vector<uint32_t> mask;    // grammar mask scratch: bit id = allowed
  std::vector<float> masked;     // [n_vocab] logits with the grammar mask applied
  SpecOptions spec{.type = SpecType::kNone};
  // SpecType::kDraft: this sequence's proposer, made on its first proposal
  // (proposer_tried: made or failed, not tried again until set_spec), and
  // the decode steps left until a proposer that does not pay is probed.
  std::unique_ptr<Proposer> proposer;
  bool proposer_tried = false;
  int32_t probe_wait = 0;

  // One sampled position: takes the token of `logits` with the history's
  // first `hist_len` tokens as context (plain decoding: all of them), as
  // Sequence::accept_logits describes; `proposal` >= 0 verifies that token
  // (Sampler::verify). Returns the token taken (-1: none, the generation ended first).
  int32_t accept_row(Sequence& self, std::span<const float> logits, size_t hist_len, int32_t proposal);
  // Counts one observation of whether a proposed token was accepted.
  void observe(bool accepted) { acceptance += kAcceptWeight * ((accepted ? 1.0 : 0.0) - acceptance); }

  // Forgets the generation (not the cache, tokens or sampler).
  void clear_generation() { static_cast<SequenceGeneration&>(*this) = SequenceGeneration(); }
  // Samples under the grammar: the mask applied to a copy of `logits`, then
  // the sampler's chain (verifying `proposal` when >= 0). -1 when the grammar
  // allows no token (a dead end). `hist`: the penalties' history.
  int32_t sample_constrained(std::span<const float> logits, std::span<const int32_t> hist, int32_t proposal);
};

Sequence::Sequence(SequenceModel shared, model::KvCache cache, Sampler sampler, std::vector<int32_t> tokens)
    : s_(std::make_unique<State>()) {
  s_->n_vocab = shared.model->config().n_vocab;
  s_->shared = std::move(shared);
  s_->cache = std::move(cache);
  s_->sampler = std::move(sampler);
  s_->history = std::move(tokens);
  if (static_cast<int64_t>(s_->history.size()) > s_->cache.size())
    s_->history.resize(static_cast<size_t>(s_->cache.size()));
}
Sequence::Sequence(Sequence&&) noexcept = default;
Sequence& Sequence::operator=(Sequence&&) noexcept = default;
Sequence::~Sequence() = default;

// ---- A generation ---------------------------------------------------------------------

core::Expected<void> Sequence::start(const GenerateRequest& req, const StartOptions& opt) {
  State& m = *s_;
  const Clock::time_point t_start = Clock::now();
  if (m.active) return core::fail(core::Errc::kInvalidArgument, "generate: a generation is in progress");
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
    auto t = m.shared.token_trie->get();
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
  claim();
  m.clear_generation();
  m.grammar = std::move(grammar);
  m.vocab = vocab;
  m.active = true;
  m.t_start = t_start;
  // Swap params / seed for this call; finish() restores them.
  if (req.params) {
    m.restore_params = m.sampler.params();
    m.sampler.set_params(*req.params);
  }
  if (req.seed) {
    if (!m.restore_params) m.restore_params = m.sampler.params();  // reseed writes params().seed
    m.restore_rng = m.sampler.rng().state();
    m.sampler.reseed(*req.seed);
  }
  m.prompt.assign(req.prompt.begin(), req.prompt.end());
  m.on_token = req.on_token;
  m.cancel = req.cancel;
  m.own_tracker = RequestRateTracker(t_start);
  m.tracker = req.tracker != nullptr ? req.tracker : &m.own_tracker;
  m.emitter = TextEmitter(m.sampler.params().stop);
  m.res.prompt_tokens = static_cast<int32_t>(m.prompt.size());
  m.res.finish_reason = FinishReason::kLength;

  const auto n_prompt = static_cast<int64_t>(m.prompt.size());
  int64_t keep = 0;
  const bool have_logits = static_cast<int64_t>(opt.prompt_logits.size()) == m.n_vocab;
  // Prompt logprobs need every prompt position's logits: nothing is reused
  // (unless the whole prompt's answer was given: a sibling choice).
  const bool prompt_rows = m.sampler.params().prompt_logprobs >= 0 && !have_logits;
  if (opt.reuse_prefix && !prompt_rows) {
    keep = cached_prefix(m.prompt);
    // The last prompt token is recomputed for its logits unless they were given.
    if (keep >= n_prompt && !have_logits) keep = m.cache.resumable(n_prompt - 1);
  }
  if (prompt_rows) {
    m.res.prompt_logprobs.reserve(m.prompt.size());
    m.res.prompt_logprobs.push_back(TokenLogprob{.token = m.prompt[0]});  // logprob NaN: no context
  }
  m.cache.truncate(keep);
  keep = std::min(keep, m.cache.size());  // (a recurrent cache keeps all or nothing; resumable said which)
  m.history.resize(static_cast<size_t>(keep));
  m.res.cached_tokens = static_cast<int32_t>(keep);
  if (keep == n_prompt) {
    m.prefilled = true;
    m.t_prefilled = Clock::now();
    accept_logits(opt.prompt_logits);
  }
  return {};
}

bool Sequence::active() const { return s_->active; }
bool Sequence::finished() const { return s_->active && s_->done; }

int64_t Sequence::pending_prompt() const {
  const State& m = *s_;
  if (!m.active) return 0;
  const auto& src = m.replay.empty() ? m.prompt : m.replay;
  return std::max<int64_t>(0, static_cast<int64_t>(src.size()) - static_cast<int64_t>(m.history.size()));
}

int64_t Sequence::next_pos() const { return static_cast<int64_t>(s_->history.size()); }

std::span<const int32_t> Sequence::next_input(int64_t max_prompt) const {
  const State& m = *s_;
  if (!m.active || m.done) return {};
  if (const int64_t pending = pending_prompt(); pending > 0) {
    const size_t at = m.history.size();
    const auto& src = m.replay.empty() ? m.prompt : m.replay;
    int64_t len = std::min(pending, std::max<int64_t>(1, max_prompt));
    if (m.cache.recurrent() && m.cache.paged()) {
      // A recurrent state can be snapshotted only where it stands: a chunk
      // ends at the next block boundary, so the state visits every one
      // (model::KvPool's snapshots; chunking invariance keeps the bits).
      const int64_t bs = m.cache.block_size();
      len = std::min(len, bs - static_cast<int64_t>(at) % bs);
    }
    return std::span<const int32_t>(src).subspan(at, static_cast<size_t>(len));
  }
  if (!m.decode_in.empty()) return m.decode_in;  // [last, proposed...]
  return std::span<const int32_t>(&m.last, 1);
}

bool Sequence::logits_wanted(int64_t n) const {
  const State& m = *s_;
  if (!m.active || m.done || m.embed) return false;
  if (!m.replay.empty()) return false;  // recomputing KV after suspend(): no sampling
  if (m.prefilled) return true;         // a decode token
  return n >= pending_prompt();
}

bool Sequence::inputs_done(int64_t n) {
  State& m = *s_;
  const std::span<const int32_t> in = next_input(n);
  m.history.insert(m.history.end(), in.begin(), in.begin() + n);
  if (!m.decode_in.empty() && static_cast<size_t>(n) < m.decode_in.size()) trim_proposal(n - 1);
  if (!m.replay.empty()) {
    if (m.history.size() >= m.replay.size()) m.replay.clear();  // caught up: decoding resumes
    return false;
  }
  if (m.prefilled) return true;  // a decode token
  if (pending_prompt() > 0) return false;
  m.prefilled = true;
  m.t_prefilled = Clock::now();
  if (m.embed) {
    // The whole input ran: the embedding is complete.
    if (m.emb_rows == static_cast<int64_t>(m.prompt.size())) m.res.finish_reason = FinishReason::kStop;
    m.done = true;
    return false;
  }
  return true;
}

void Sequence::suspend() {
  State& m = *s_;
  if (!m.active || m.done) return;
  // Prefilled: recompute prompt + generated tokens (not the last sampled one,
  // which is the next decode input). Still in the prompt: start it over.
  if (m.prefilled && m.replay.empty()) m.replay = m.history;
  m.history.clear();
  m.cache.clear();
  m.cache.release_recurrent();  // a waiting sequence holds no recurrent state
  if (m.proposer) m.proposer->release();
}

bool Sequence::replaying() const { return !s_->replay.empty(); }
bool Sequence::is_embedding() const { return s_->active && s_->embed; }

bool Sequence::poll_cancel() {
  State& m = *s_;
  if (!m.active || m.done) return m.done;
  if (m.cancel != nullptr && m.cancel->load(std::memory_order_relaxed)) {
    stop_now(FinishReason::kCancelled);
    return true;
  }
  return false;
}

void Sequence::stop_now(FinishReason reason, bool timed_out) {
  State& m = *s_;
  if (!m.active || m.done) return;
  m.done = true;
  m.res.finish_reason = reason;
  m.res.timed_out = timed_out;
}

void Sequence::accept_logits(std::span<const float> logits) {
  State& m = *s_;
  if (!m.active || m.done) return;
  const int32_t shadow = std::exchange(m.shadow, -1);
  const int32_t tok = m.accept_row(*this, logits, m.history.size(), -1);
  if (shadow >= 0 && tok >= 0) m.observe(tok == shadow);  // a proposal not run: was it right?
}

int32_t Sequence::State::accept_row(Sequence& self, std::span<const float> logits, size_t hist_len, int32_t proposal) {
  State& m = *this;
  const std::span<const int32_t> hist(m.history.data(), std::min(hist_len, m.history.size()));
  const SamplingParams& params = m.sampler.params();
  std::optional<TokenLogprob> lp;  // this token's, when params.logprobs >= 0
  auto emit = [&](int32_t token, int32_t index, const std::string& text) {
    if (!m.on_token) return true;
    return m.on_token(TokenEvent{token, index, text, lp ? &*lp : nullptr});
  };
  // The checks a driver's loop makes before each sample / decode.
  auto may_continue = [&] {
    if (params.max_tokens >= 0 && m.n_sampled >= params.max_tokens) {
      m.done = true;  // finish_reason stays kLength
      return false;
    }
    if (m.cancel != nullptr && m.cancel->load(std::memory_order_relaxed)) {
      self.stop_now(FinishReason::kCancelled);
      return false;
    }
    return true;
  };
  if (!may_continue()) return -1;
  int32_t tok;
  if (m.grammar) {
    tok = m.sample_constrained(logits, hist, proposal);
    if (tok < 0) {
      // Nothing may follow: a complete sentence is a stop, an incomplete one
      // (a dead end, e.g. a stack limit) ends like a truncation.
      m.res.finish_reason = m.grammar->can_end() ? FinishReason::kStop : FinishReason::kLength;
      m.done = true;
      return -1;
    }
  } else {
    tok = proposal >= 0 ? m.sampler.verify(logits, hist, proposal) : m.sampler.sample(logits, hist);
  }
  m.tracker->on_token();
  const int32_t index = m.n_sampled++;
  m.last = tok;
  if (m.grammar && !m.grammar->accept_token(*m.vocab, tok)) {
    // sample_constrained only returns allowed tokens; a matcher that still
    // refuses one (an internal limit) ends the answer as a dead end would.
    m.res.finish_reason = FinishReason::kLength;
    m.done = true;
    emit(tok, index, std::string());
    return tok;
  }
  // Log probabilities come from the raw logits (the sampler worked on a copy).
  if (params.logprobs >= 0) lp = token_logprob(logits, tok, params.logprobs);
  const bool grammar_ended = m.grammar && m.grammar->finished();
  const tokenizer::Tokenizer& tk = *m.shared.tokenizer;
  if ((!params.ignore_eos || grammar_ended) && tk.is_eog(tok)) {
    m.res.finish_reason = FinishReason::kStop;
    m.done = true;
    lp.reset();  // a terminating EOS is not part of the answer (nor of res.logprobs)
    emit(tok, index, std::string());
    return tok;
  }
  m.res.tokens.push_back(tok);
  if (lp) m.res.logprobs.push_back(*lp);
  const std::string piece = m.emitter.push(tk.token_to_bytes(tok));
  if (m.emitter.stopped()) {
    m.res.finish_reason = FinishReason::kStop;
    m.res.stop_sequence = m.emitter.stop()[static_cast<size_t>(m.emitter.matched_stop())];
    m.done = true;
    emit(tok, index, piece);
    return tok;
  }
  if (!emit(tok, index, piece)) {
    self.stop_now(FinishReason::kCancelled);
    return tok;
  }
  if (!may_continue()) return tok;
  if (static_cast<int64_t>(hist.size()) >= m.cache.n_ctx()) m.done = true;  // context full: length
  return tok;
}

// ---- Speculative decoding -------------------------------------------------------------

const char* spec_type_name(SpecType t) {
  switch (t) {
    case SpecType::kNone:
      return "none";
    case SpecType::kNgram:
      return "ngram";
    case SpecType::kDraft:
      return "draft";
  }
  return "unknown";
}

core::Expected<SpecType> parse_spec_type(std::string_view name) {
  if (name == "none") return SpecType::kNone;
  if (name == "ngram") return SpecType::kNgram;
  if (name == "draft") return SpecType::kDraft;
  return core::fail(core::Errc::kInvalidArgument,
                    "spec-type: '" + std::string(name) + "' is not a speculation type (expected none, ngram or draft)");
}

core::Expected<void> SpecOptions::validate() const {
  if (draft_max < 0 || draft_max > kMaxDraft)
    return core::fail(core::Errc::kInvalidArgument,
                      "draft-max: " + std::to_string(draft_max) + " is outside [0, " + std::to_string(kMaxDraft) + "]");
  if (draft_min < 0 || draft_min > kMaxDraft)
    return core::fail(core::Errc::kInvalidArgument,
                      "draft-min: " + std::to_string(draft_min) + " is outside [0, " + std::to_string(kMaxDraft) + "]");
  if (!(draft_p_min >= 0.0f && draft_p_min <= 1.0f))
    return core::fail(core::Errc::kInvalidArgument,
                      "draft-p-min: " + std::to_string(draft_p_min) + " is outside [0, 1]");
  return {};
}

std::vector<int32_t> ngram_proposal(std::span<const int32_t> seq, int32_t ngram_min, int32_t ngram_max,
                                    int32_t max_draft) {
  const auto len = static_cast<int64_t>(seq.size());
  if (max_draft <= 0) return {};
  for (int64_t n = std::min<int64_t>(ngram_max, len - 1); n >= std::max<int32_t>(1, ngram_min); --n) {
    const std::span<const int32_t> tail = seq.subspan(static_cast<size_t>(len - n));
    // The latest earlier occurrence (start i < len - n), searched backwards.
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(tail.begin(), tail.end(), seq.begin() + i)) continue;
      const int64_t from = i + n;  // < len: what followed it
      const int64_t k = std::min<int64_t>(max_draft, len - from);
      return {seq.begin() + from, seq.begin() + from + k};
    }
  }
  return {};
}

int64_t draft_length(double acceptance, double row_cost, int64_t room) {
  // E(k) / (1 + k c) rises while the next token pays and falls after (the
  // added tokens shrink geometrically, the cost grows linearly): the greedy
  // stop is its maximum.
  int64_t k = 0;
  double reach = 1.0;     // a^(k+1) below: the chance the next token is reached and taken
  double expected = 1.0;  // E(k)
  while (k < room && std::isfinite(row_cost)) {
    reach *= acceptance;
    if (!(reach * (1.0 + static_cast<double>(k) * row_cost) > row_cost * expected)) break;
    expected += reach;
    ++k;
  }
  return k;
}

void Sequence::set_spec(const SpecOptions& spec) {
  State& m = *s_;
  m.spec = spec;
  m.proposer.reset();  // made again (from the new factory) on the next proposal
  m.proposer_tried = false;
  m.probe_wait = 0;
}

int64_t Sequence::proposed() const {
  return s_->decode_in.empty() ? 0 : static_cast<int64_t>(s_->decode_in.size()) - 1;
}

void Sequence::trim_proposal(int64_t n) {
  State& m = *s_;
  if (m.decode_in.empty()) return;
  n = std::max<int64_t>(0, n);
  if (n == 0) {
    if (m.shadow < 0) m.shadow = m.decode_in[1];
    m.decode_in.clear();
  } else if (n < proposed()) {
    m.decode_in.resize(static_cast<size_t>(n) + 1);
  }
}

int64_t Sequence::propose(int64_t max_draft, double row_cost, double step_s) {
  State& m = *s_;
  m.decode_in.clear();
  m.shadow = -1;
  if (!m.active || m.done || m.embed || !m.prefilled || !m.replay.empty() || m.spec.type == SpecType::kNone ||
      m.spec.draft_max <= 0 || m.cache.recurrent())
    return 0;
  const SamplingParams& params = m.sampler.params();
  // Room: the context (positions next_pos() .. next_pos() + k), and
  // max_tokens (k + 1 tokens at most come out of the step).
  int64_t room = std::min<int64_t>(max_draft, m.spec.draft_max);
  room = std::min(room, m.cache.n_ctx() - static_cast<int64_t>(m.history.size()) - 1);
  if (params.max_tokens >= 0) room = std::min<int64_t>(room, params.max_tokens - m.n_sampled - 1);
  if (room <= 0) return 0;
  Proposer* proposer = nullptr;
  if (m.spec.type == SpecType::kDraft) {
    if (!m.proposer_tried) {
      m.proposer_tried = true;
      if (m.spec.proposer) {
        auto made = m.spec.proposer(m.cache.n_ctx());
        if (made) m.proposer = std::move(*made);  // (failed: this sequence does not speculate)
      }
    }
    if (!m.proposer) return 0;
    proposer = m.proposer.get();
  }
  // What one more row costs relative to a plain step (a proposer's own time
  // per token included); infinite: a greedy sequence the driver's SpecGuard
  // holds back.
  double cost = m.spec.row_cost >= 0        ? m.spec.row_cost
                : params.temperature > 0.0f ? kSampledRowCost
                                            : std::max(0.0, row_cost);
  if (proposer != nullptr && step_s > 0 && m.spec.row_cost < 0 && params.temperature <= 0.0f)
    cost += proposer->seconds_per_token() / step_s;
  // Held back (the guard): no proposal, not even one to compare with what is
  // sampled (the n-gram search over the history would be wasted work; its
  // cost was below the noise of stories260K's step when measured); the
  // guard's probes keep the acceptance estimate.
  if (!std::isfinite(cost)) return 0;
  int64_t k = draft_length(m.acceptance, cost, room);
  // The sequence so far: the cache's tokens and the last sampled one.
  m.decode_in.assign(m.history.begin(), m.history.end());
  m.decode_in.push_back(m.last);
  std::vector<int32_t> p;
  if (proposer == nullptr) {
    p = ngram_proposal(m.decode_in, kNgramMin, kNgramMax, static_cast<int32_t>(room));
    k = std::min<int64_t>(k, static_cast<int64_t>(p.size()));
  } else if (k > 0) {
    p = proposer->propose(m.decode_in, static_cast<int32_t>(k), m.spec.draft_p_min);
    k = static_cast<int64_t>(p.size());
  } else if (--m.probe_wait <= 0) {
    // Not paying: one token now and then, to see whether it would.
    m.probe_wait = kProbeSteps;
    p = proposer->propose(m.decode_in, 1, 0.0f);
  }
  m.decode_in.clear();
  if (p.empty()) return 0;
  if (k == 0 || k < m.spec.draft_min) {
    m.shadow = p[0];  // not run: still compared with what is sampled next
    return 0;
  }
  m.decode_in.reserve(static_cast<size_t>(k) + 1);
  m.decode_in.push_back(m.last);
  m.decode_in.insert(m.decode_in.end(), p.begin(), p.begin() + k);
  return k;
}

SpecCounts Sequence::accept_rows(std::span<const float> rows) {
  State& m = *s_;
  SpecCounts counts;
  const int64_t k = proposed();
  const auto nv = static_cast<size_t>(m.n_vocab);
  if (k == 0) {
    m.decode_in.clear();
    accept_logits(rows.first(nv));
    return counts;
  }
  const std::vector<int32_t> in = std::move(m.decode_in);
  m.decode_in.clear();
  if (!m.active || m.done || rows.size() < static_cast<size_t>(k + 1) * nv) return counts;
  // The step wrote positions pos0 .. pos0 + k: [last, proposed...].
  const size_t pos0 = m.history.size() - static_cast<size_t>(k) - 1;
  counts.proposed = k;
  int64_t j = 0;
  for (;; ++j) {
    const int32_t proposal = j < k ? in[static_cast<size_t>(j) + 1] : -1;
    const int32_t tok = m.accept_row(*this, rows.subspan(static_cast<size_t>(j) * nv, nv), pos0 + 1 + j, proposal);
    if (proposal >= 0 && tok >= 0) {
      m.observe(tok == proposal);
      if (tok == proposal) ++counts.accepted;
    }
    if (m.done || j == k || tok != proposal) break;
  }
  // Positions past the last one whose row was used (its input: the token
  // before the one just taken) held rejected or unused proposals.
  truncate(static_cast<int64_t>(pos0) + 1 + j);
  m.res.draft_tokens += static_cast<int32_t>(counts.proposed);
  m.res.draft_accepted += static_cast<int32_t>(counts.accepted);
  return counts;
}

int32_t Sequence::State::sample_constrained(std::span<const float> in, std::span<const int32_t> hist,
                                            int32_t proposal) {
  structured::GrammarState& g = *grammar;
  const structured::TokenTrie& trie = *vocab;
  const SamplingParams& params = sampler.params();
  // Greedy: the unconstrained arg-max, when the grammar allows it, is also
  // the arg-max of the masked logits (masking only lowers logits to -inf,
  // which the bias and penalties keep at -inf), and greedy draws no random
  // number; so the full mask is needed only when it is refused.
  if (params.temperature <= 0.0f) {
    const int32_t t = sampler.sample(in, hist);
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
  const int32_t t = proposal >= 0 ? sampler.verify(masked, hist, proposal) : sampler.sample(masked, hist);
  // Rounding in the chain (every allowed logit -inf or NaN, or a cumulative
  // sum short of 1) could land on a masked id: take the best allowed one.
  return ok(static_cast<size_t>(t)) ? t : best;
}

GenerationResult Sequence::finish() {
  State& m = *s_;
  GenerationResult res = std::move(m.res);
  if (!m.active) return res;
  const Clock::time_point t_end = Clock::now();
  if (!m.prefilled) m.t_prefilled = t_end;
  res.prompt_ms = ms_since(m.t_start, m.t_prefilled);
  if (m.embed) {
    // No text, no sampling stats: the pooled rows, when complete.
    if (res.finish_reason == FinishReason::kStop) res.embedding = pool_finish(m.emb_acc, m.emb_rows);
    abandon();  // idle: the cache (holding the input) is parked, as after InferenceEngine::embed
    return res;
  }
  if (const std::string rest = m.emitter.finish(); !rest.empty() && m.on_token)
    m.on_token(TokenEvent{-1, m.n_sampled, rest});
  m.tracker->on_finish(t_end);
  res.text = m.emitter.released();
  res.completion_tokens = m.n_sampled;
  res.gen_ms = ms_since(m.t_prefilled, t_end);
  res.rate = m.tracker->summary();
  abandon();
  return res;
}

void Sequence::abandon() {
  State& m = *s_;
  if (m.restore_params) m.sampler.set_params(std::move(*m.restore_params));
  if (m.restore_rng) m.sampler.rng().set_state(*m.restore_rng);
  m.clear_generation();
  // Idle now: the cache's blocks stay as a prompt cache the pool may evict.
  if (m.cache.size() < static_cast<int64_t>(m.history.size())) m.history.resize(static_cast<size_t>(m.cache.size()));
  m.cache.park();
}

// ---- Prompt logprobs ----------------------------------------------------------------

bool Sequence::wants_prompt_rows() const {
  const State& m = *s_;
  return m.active && !m.done && m.replay.empty() && !m.res.prompt_logprobs.empty() && pending_prompt() > 0;
}

void Sequence::record_prompt_rows(std::span<const float> rows) {
  State& m = *s_;
  if (!wants_prompt_rows()) return;
  const auto nv = static_cast<size_t>(m.n_vocab);
  const size_t k = rows.size() / nv;
  const int32_t top_n = m.sampler.params().prompt_logprobs;
  for (size_t j = 0; j < k; ++j) {
    // Row j ran the token at position next_pos() + j and predicts the next one.
    const size_t target = m.history.size() + j + 1;
    if (target >= m.prompt.size()) break;                  // the last prompt row predicts the first sampled token
    if (m.res.prompt_logprobs.size() != target) continue;  // already recorded (never expected)
    m.res.prompt_logprobs.push_back(token_logprob(rows.subspan(j * nv, nv), m.prompt[target], top_n));
  }
}

const std::vector<TokenLogprob>& Sequence::prompt_logprobs() const { return s_->res.prompt_logprobs; }

// ---- An embedding ---------------------------------------------------------------------

core::Expected<void> check_embedding_input(std::span<const int32_t> tokens, int64_t n_ctx, int64_t n_vocab) {
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

core::Expected<void> Sequence::start_embedding(std::span<const int32_t> tokens, const std::atomic<bool>* cancel) {
  State& m = *s_;
  const Clock::time_point t_start = Clock::now();
  if (m.active) return core::fail(core::Errc::kInvalidArgument, "embed: a generation is in progress");
  if (auto ok = check_embedding_input(tokens, m.cache.n_ctx(), m.n_vocab); !ok) return ok;
  truncate(0);
  m.clear_generation();
  m.active = true;
  m.embed = true;
  m.t_start = t_start;
  m.prompt.assign(tokens.begin(), tokens.end());
  m.cancel = cancel;
  m.own_tracker = RequestRateTracker(t_start);
  m.tracker = &m.own_tracker;
  m.emb_acc.assign(static_cast<size_t>(m.shared.model->config().n_embd), 0.0);
  m.res.prompt_tokens = static_cast<int32_t>(tokens.size());
  m.res.finish_reason = FinishReason::kLength;  // kStop once every row is pooled
  return {};
}

bool Sequence::wants_hidden_rows() const {
  const State& m = *s_;
  return m.active && !m.done && m.embed && pending_prompt() > 0;
}

void Sequence::record_hidden_rows(std::span<const float> rows) {
  State& m = *s_;
  if (!wants_hidden_rows()) return;
  const size_t dim = m.emb_acc.size();
  const auto k = static_cast<int64_t>(rows.size() / dim);
  const auto pos0 = static_cast<int64_t>(m.history.size());
  // Rows of positions already pooled (replayed after a suspend()) are
  // skipped; the rest are added in position order, as mean_pool_l2 does.
  if (pos0 > m.emb_rows) return;  // a gap (never expected): the embedding stays incomplete (kLength)
  const int64_t skip = std::min<int64_t>(m.emb_rows - pos0, k);
  pool_add_rows(m.emb_acc, rows.subspan(static_cast<size_t>(skip) * dim, static_cast<size_t>(k - skip) * dim));
  m.emb_rows += k - skip;
}

// ---- The cache and its tokens ------------------------------------------------------

int64_t Sequence::cached_prefix(std::span<const int32_t> tokens) const {
  const auto& h = s_->history;
  const size_t n = std::min(h.size(), tokens.size());
  size_t i = 0;
  while (i < n && h[i] == tokens[i]) ++i;
  // A recurrent (qwen35) cache continues only from its end.
  return s_->cache.resumable(static_cast<int64_t>(i));
}

core::Expected<void> Sequence::copy_prefix_from(const Sequence& src, int64_t n) {
  State& m = *s_;
  const State& s = *src.s_;
  if (s.shared.model != m.shared.model || n < 0 || n > static_cast<int64_t>(s.history.size()) || n > s.cache.size() ||
      n > m.cache.n_ctx() || !m.cache.matches_cache(s.cache)) {
    return core::fail(core::Errc::kInvalidArgument, "copy_prefix_from: " + std::to_string(n) +
                                                        " positions do not fit (another model, cache "
                                                        "type or size, or more than the source holds)");
  }
  claim();
  // Same pool: the blocks are shared (copy-on-write); otherwise rows are copied.
  if (auto ok = m.cache.copy_prefix_from(s.cache, n); !ok) {
    m.history.resize(std::min(m.history.size(), static_cast<size_t>(m.cache.size())));
    return ok;
  }
  m.history.assign(s.history.begin(), s.history.begin() + n);
  return {};
}

int64_t Sequence::adopt_cached_prefix() {
  State& m = *s_;
  if (!m.history.empty() || m.cache.size() > 0 || m.embed) return 0;
  const bool replay = !m.replay.empty();
  const std::vector<int32_t>& src = replay ? m.replay : m.prompt;
  if (src.empty()) return 0;
  // A prompt's last token runs for its logits; a replay wants none.
  const auto limit = static_cast<int64_t>(src.size()) - (replay ? 0 : 1);
  if (limit <= 0) return 0;
  claim();
  const int64_t n = m.cache.adopt_prefix(src, limit);
  m.history.assign(src.begin(), src.begin() + n);
  if (!replay) m.res.cached_tokens = static_cast<int32_t>(n);
  if (replay && n >= static_cast<int64_t>(m.replay.size())) m.replay.clear();  // caught up: decoding resumes
  return n;
}

void Sequence::publish(bool partial_last) {
  State& m = *s_;
  if (m.cache.paged()) m.cache.publish(m.history, partial_last, static_cast<int64_t>(m.prompt.size()));
}

void Sequence::truncate(int64_t n) {
  State& m = *s_;
  claim();
  n = std::clamp<int64_t>(n, 0, static_cast<int64_t>(m.history.size()));
  m.cache.truncate(n);
  m.history.resize(static_cast<size_t>(std::min(n, m.cache.size())));  // a recurrent cache may drop to 0
}

void Sequence::append_tokens(std::span<const int32_t> tokens) {
  s_->history.insert(s_->history.end(), tokens.begin(), tokens.end());
}

void Sequence::claim() {
  State& m = *s_;
  if (!m.cache.paged()) return;
  m.cache.unpark();
  if (static_cast<int64_t>(m.history.size()) > m.cache.size()) m.history.resize(static_cast<size_t>(m.cache.size()));
}

model::KvCache& Sequence::kv_cache() { return s_->cache; }
const model::KvCache& Sequence::kv_cache() const { return s_->cache; }
const std::vector<int32_t>& Sequence::tokens() const { return s_->history; }
Sampler& Sequence::sampler() { return s_->sampler; }
const Sampler& Sequence::sampler() const { return s_->sampler; }
int64_t Sequence::n_ctx() const { return s_->cache.n_ctx(); }

// ---- SpecGuard ------------------------------------------------------------------------

size_t SpecGuard::width_of(int64_t rows) {
  size_t w = 0;
  while (rows > 1 && w + 1 < kWidths) {
    rows >>= 1;
    ++w;
  }
  return w;
}

bool SpecGuard::allow(int64_t rows) {
  Width& g = widths_[width_of(rows)];
  ++g.spec.since;
  ++g.plain.since;
  // Warm-up: the modes take turns (plain first), so both see the same
  // conditions (the first steps of a process are slower).
  if (g.spec.n < kWarmup || g.plain.n < kWarmup) return g.spec.n < g.plain.n;
  // Speculation must win by kMargin: where the two are about even, plain
  // decoding (the side "never slower" is about) keeps the step.
  const bool spec = g.spec.rate() > g.plain.rate() * (1 + kMargin);
  if (spec != g.spec_wins) {
    g.spec_wins = spec;
    g.gap = kProbeEvery;
  }
  // The mode not chosen gets a step when it has had no sample for `gap`
  // steps, to see whether it still loses; the gap doubles with every probe
  // (up to kProbeMax) while the same mode keeps winning.
  if ((spec ? g.plain : g.spec).since > g.gap) {
    g.gap = std::min(2 * g.gap, kProbeMax);
    return !spec;
  }
  return spec;
}

void SpecGuard::record(int64_t rows, bool speculated, int64_t tokens, double seconds) {
  if (!(seconds > 0) || tokens <= 0 || rows <= 0) return;
  Width& g = widths_[width_of(rows)];
  Mode& m = speculated ? g.spec : g.plain;
  // The plain mean of the first 1 / kWeight samples, then the moving
  // average (so the first sample does not weigh on it for long).
  const double w = std::max(kWeight, 1.0 / static_cast<double>(m.n + 1));
  // A step far above the average (the thread descheduled, the process
  // stopped) counts as 3x the average, so one stall does not decide.
  if (m.n > 0) seconds = std::min(seconds, 3 * m.seconds);
  m.tokens += w * (static_cast<double>(tokens) - m.tokens);
  m.seconds += w * (seconds - m.seconds);
  ++m.n;
  m.since = 0;
}

}  // namespace bonsai::engine
