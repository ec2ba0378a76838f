// Helpers for the model tests: load a model (failing the test on error) and
// run one sequence through forward().
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace bonsai::model::testing {

inline std::shared_ptr<const Model> load_or_fail(const std::string& path) {
  auto m = Model::load(path);
  EXPECT_TRUE(m.has_value()) << (m ? "" : m.error().message);
  return m ? *m : nullptr;
}

// Runs `ids` as one batch at positions pos0.. on sequence 0 of `cache`;
// returns logits for every token ([n][n_vocab]) if all_logits, else the last.
inline std::vector<float> run_sequence(const Model& m, std::span<const int32_t> ids, int32_t pos0, KvCache& cache,
                                       Workspace& ws, core::ThreadPool& pool, bool all_logits) {
  Batch b = Batch::for_sequence(ids, pos0, 0, all_logits);
  std::vector<float> logits(b.n_wanted() * static_cast<size_t>(m.config().n_vocab));
  KvCache* caches[] = {&cache};
  auto r = m.forward(b, caches, ws, logits, pool);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return logits;
}

// Index of the largest value; ties -> lowest index (as llama.cpp's greedy).
inline int32_t argmax(std::span<const float> v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

}  // namespace bonsai::model::testing
