// Proposers for speculative decoding; see proposer.h for the contract.
#include "engine/proposer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "core/thread_pool.h"     // ThreadPool, global_pool
#include "engine/sequence.h"      // kPrefillChunk
#include "model/model.h"          // Model, Workspace, Batch
#include "tokenizer/tokenizer.h"  // Tokenizer

namespace bonsai::engine {

namespace {

// Greedy decoding of the draft model over its own cache.
class DraftModelProposer final : public Proposer {
 public:
  DraftModelProposer(std::shared_ptr<const model::Model> draft, model::KvCache cache, core::ThreadPool* pool)
      : draft_(std::move(draft)), cache_(std::move(cache)), pool_(pool) {
    logits_.resize(static_cast<size_t>(draft_->config().n_vocab));
  }

  std::vector<int32_t> propose(std::span<const int32_t> seq, int32_t max_draft, float p_min) override {
    std::vector<int32_t> out;
    if (seq.empty() || max_draft <= 0) return out;
    const auto t0 = std::chrono::steady_clock::now();
    // Room in the draft's cache: the sequence and the proposal but the last
    // proposed token (never run).
    const int64_t room = cache_.n_ctx() - static_cast<int64_t>(seq.size()) + 1;
    max_draft = static_cast<int32_t>(std::min<int64_t>(max_draft, room));
    if (max_draft <= 0) return out;
    // Keep what was computed for the longest common prefix (a rejected
    // proposal's positions go); the last token always runs, for its logits.
    size_t keep = 0;
    const size_t limit = std::min(history_.size(), seq.size() - 1);
    while (keep < limit && history_[keep] == seq[keep]) ++keep;
    keep = static_cast<size_t>(cache_.resumable(static_cast<int64_t>(keep)));
    cache_.truncate(static_cast<int64_t>(keep));
    history_.resize(std::min(keep, static_cast<size_t>(cache_.size())));
    if (!run(seq.subspan(history_.size()))) return out;
    for (;;) {
      const auto best = static_cast<int32_t>(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
      if (p_min > 0 && top_probability(best) < p_min) break;
      out.push_back(best);
      if (static_cast<int32_t>(out.size()) >= max_draft) break;
      const int32_t one[] = {best};
      if (!run(one)) break;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!out.empty()) {
      const double per = s / static_cast<double>(out.size());
      s_per_token_ = s_per_token_ > 0 ? s_per_token_ + 0.25 * (std::min(per, 3 * s_per_token_) - s_per_token_) : per;
    }
    return out;
  }

  double seconds_per_token() const override { return s_per_token_; }

  void release() override {
    cache_.truncate(0);
    history_.clear();
  }

 private:
  // Runs `tokens` at positions history_.size() on, in chunks; the logits of
  // the last one land in logits_. False (the cache rolled back) on an error.
  bool run(std::span<const int32_t> tokens) {
    model::KvCache* caches[] = {&cache_};
    core::ThreadPool& tp = pool_ != nullptr ? *pool_ : core::global_pool();
    for (size_t off = 0; off < tokens.size(); off += static_cast<size_t>(kPrefillChunk)) {
      const auto chunk = tokens.subspan(off, std::min(tokens.size() - off, static_cast<size_t>(kPrefillChunk)));
      const model::Batch b = model::Batch::for_sequence(chunk, static_cast<int32_t>(history_.size()));
      if (!draft_->forward(b, caches, ws_, logits_, tp)) {
        cache_.truncate(static_cast<int64_t>(history_.size()));
        return false;
      }
      history_.insert(history_.end(), chunk.begin(), chunk.end());
    }
    return true;
  }

  // softmax(logits_)[best] with best the arg-max: 1 / sum exp(l - l_best).
  double top_probability(int32_t best) const {
    const float top = logits_[static_cast<size_t>(best)];
    if (!std::isfinite(top)) return 0;
    double sum = 0;
    for (const float l : logits_) sum += std::exp(static_cast<double>(l - top));
    return 1.0 / sum;
  }

  std::shared_ptr<const model::Model> draft_;
  model::KvCache cache_;
  core::ThreadPool* pool_;
  model::Workspace ws_;
  std::vector<float> logits_;     // [n_vocab] of the last token run
  std::vector<int32_t> history_;  // the tokens in cache_, by position
  double s_per_token_ = 0;        // moving average (weight 1/4) of seconds per proposed token
};

}  // namespace

ProposerFactory draft_model_proposer(std::shared_ptr<const model::Model> draft, model::KvType kv_type_k,
                                     model::KvType kv_type_v, core::ThreadPool* pool) {
  return [draft = std::move(draft), kv_type_k, kv_type_v,
          pool](int64_t n_ctx) -> core::Expected<std::unique_ptr<Proposer>> {
    auto cache = model::KvCache::create(draft->config(), n_ctx, kv_type_k, kv_type_v);
    if (!cache) return std::unexpected(cache.error());
    return std::make_unique<DraftModelProposer>(draft, std::move(*cache), pool);
  };
}

size_t draft_kv_bytes(const model::Model& draft, int64_t n_ctx, model::KvType kv_type_k, model::KvType kv_type_v) {
  return static_cast<size_t>(model::KvCache::bytes_per_position(draft.config(), kv_type_k, kv_type_v) *
                                 static_cast<uint64_t>(std::max<int64_t>(0, n_ctx)) +
                             model::KvCache::recurrent_bytes(draft.config()));
}

core::Expected<void> check_draft_tokenizer(const tokenizer::Tokenizer& target, const std::string& target_path,
                                           const tokenizer::Tokenizer& draft, const std::string& draft_path) {
  const std::string tail = ": a draft model needs the target's tokenizer";
  if (draft.n_vocab() != target.n_vocab()) {
    return core::fail(core::Errc::kInvalidArgument,
                      "the draft model " + draft_path + " has " + std::to_string(draft.n_vocab()) +
                          " tokens but the target " + target_path + " has " + std::to_string(target.n_vocab()) + tail);
  }
  for (int32_t id = 0; id < target.n_vocab(); ++id) {
    if (draft.token_text(id) != target.token_text(id)) {
      return core::fail(core::Errc::kInvalidArgument, "the draft model " + draft_path + " and the target " +
                                                          target_path + " differ at token " + std::to_string(id) +
                                                          " ('" + std::string(draft.token_text(id)) + "' against '" +
                                                          std::string(target.token_text(id)) + "')" + tail);
    }
  }
  if (draft.bos_id() != target.bos_id() || draft.eos_id() != target.eos_id()) {
    return core::fail(core::Errc::kInvalidArgument,
                      "the draft model " + draft_path + " (BOS " + std::to_string(draft.bos_id()) + ", EOS " +
                          std::to_string(draft.eos_id()) + ") and the target " + target_path + " (BOS " +
                          std::to_string(target.bos_id()) + ", EOS " + std::to_string(target.eos_id()) +
                          ") have different special tokens" + tail);
  }
  return {};
}

}  // namespace bonsai::engine
