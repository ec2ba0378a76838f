// Proposers for speculative decoding other than prompt lookup (issue 29;
// ../shared/DESIGN.md, "Scheduler"): a draft model (`-md FILE`, llama.cpp's
// --model-draft) and any source a benchmark plugs in (bench/spec_ceiling_bench.cpp's
// oracle). A Sequence owns one Proposer; Sequence::propose asks it for the
// tokens to verify as extra rows of the target's step, and the target
// verifies them (Sequence::accept_rows) exactly as it verifies prompt lookup's.
//
// A proposer is deterministic given the sequence (a draft model proposes its
// arg-max tokens), so the proposal distribution is a point mass and the
// rejection rule of Sampler::verify (accept x with probability p(x), else
// draw from p without x; Leviathan et al. 2023, "Fast Inference from
// Transformers via Speculative Decoding", https://arxiv.org/abs/2211.17192,
// section 2.3 with q a point mass) keeps a sampled sequence's distribution
// the target's, whatever the draft's probabilities.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"      // core::Expected
#include "model/kv_cache.h"  // KvType

namespace bonsai::core {
class ThreadPool;
}
namespace bonsai::model {
class Model;
}
namespace bonsai::tokenizer {
class Tokenizer;
}

namespace bonsai::engine {

// One sequence's source of proposed tokens. Not thread-safe (its sequence's driver only).
class Proposer {
 public:
  virtual ~Proposer() = default;
  // Up to `max_draft` (>= 1) tokens to follow `seq` (every token of the
  // sequence: the cache's and the last sampled one, which is the step's
  // first input). `p_min` (SpecOptions::draft_p_min): a proposer with
  // probabilities stops before a token it gives less than that. Empty when
  // it has nothing (or failed: a proposer never stops the generation).
  virtual std::vector<int32_t> propose(std::span<const int32_t> seq, int32_t max_draft, float p_min) = 0;
  // Measured seconds it spends per proposed token (a draft model's forward
  // passes), 0 for a free one; Sequence::propose adds it to the cost of a row.
  virtual double seconds_per_token() const { return 0; }
  // Frees what it holds for the sequence (a draft model's KV cache), e.g.
  // when the sequence is preempted; the next propose() starts over.
  virtual void release() {}
};

// Makes a sequence's proposer; `n_ctx`: the sequence's context (positions).
// Errors: what the proposer's allocation returns (kResourceExhausted).
using ProposerFactory = std::function<core::Expected<std::unique_ptr<Proposer>>(int64_t n_ctx)>;

// The draft-model proposer's factory: each proposer owns a standalone KV
// cache of `draft`'s dimensions (types kv_type_k / kv_type_v, n_ctx
// positions) and a workspace; `draft` is shared (immutable). The draft runs
// greedy on `pool` (nullptr: core::global_pool()): per propose() it first
// brings its cache to the sequence (keeps the longest common prefix of what
// it computed and `seq`, runs the rest in one forward: accepted tokens and
// the target's correction; a rejected proposal is rolled back this way),
// then decodes one token at a time while its top probability >= p_min.
ProposerFactory draft_model_proposer(std::shared_ptr<const model::Model> draft, model::KvType kv_type_k,
                                     model::KvType kv_type_v, core::ThreadPool* pool = nullptr);

// Bytes of one draft-model proposer's KV cache over n_ctx positions (for a
// memory budget that counts it beside the target's).
size_t draft_kv_bytes(const model::Model& draft, int64_t n_ctx, model::KvType kv_type_k, model::KvType kv_type_v);

// Whether a draft model can propose for a target: the same tokenizer, i.e.
// equal vocabulary size, every token's text (id by id), BOS and EOS ids.
// Errors: kInvalidArgument naming both files and the first difference
// (e.g. "the draft model d.gguf has 512 tokens but the target t.gguf has
// 151936: a draft model needs the target's tokenizer").
core::Expected<void> check_draft_tokenizer(const tokenizer::Tokenizer& target, const std::string& target_path,
                                           const tokenizer::Tokenizer& draft, const std::string& draft_path);

}  // namespace bonsai::engine
