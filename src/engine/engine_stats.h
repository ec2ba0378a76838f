// Cumulative counters of one InferenceEngine replica.
#pragma once

#include <cstdint>

namespace bonsai::engine {

// Totals since the engine was created (reset() does not clear them; see
// InferenceEngine::reset_stats). Times in milliseconds of wall clock.
struct EngineStats {
  uint64_t requests = 0;          // generate* calls that ran
  uint64_t prompt_tokens = 0;     // tokens prefilled
  uint64_t generated_tokens = 0;  // tokens sampled (EOS included)
  double prompt_ms = 0;           // time in prefill (forward of prompt tokens)
  double gen_ms = 0;              // time in decode steps + sampling
  uint64_t spec_proposed = 0;     // speculative decoding: proposed tokens verified (engine::SpecCounts)
  uint64_t spec_accepted = 0;     // of which accepted
  // Last request only:
  uint64_t last_prompt_tokens = 0;
  uint64_t last_generated_tokens = 0;
  double last_prompt_ms = 0;
  double last_gen_ms = 0;

  double prompt_tokens_per_s() const { return prompt_ms > 0 ? prompt_tokens * 1000.0 / prompt_ms : 0; }
  double gen_tokens_per_s() const { return gen_ms > 0 ? generated_tokens * 1000.0 / gen_ms : 0; }
};

}  // namespace bonsai::engine
