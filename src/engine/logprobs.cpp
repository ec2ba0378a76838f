// Log-softmax, top-n selection and embedding pooling; see logprobs.h.
#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>

namespace bonsai::engine {

double log_sum_exp(std::span<const float> logits) {
  double mx = -INFINITY;
  for (const float l : logits)
    if (l > mx) mx = l;               // NaN compares false: skipped
  if (!std::isfinite(mx)) return mx;  // empty / all -inf (or +inf: the answer is +inf)
  double sum = 0.0;
  for (const float l : logits)
    if (!std::isnan(l)) sum += std::exp(static_cast<double>(l) - mx);
  return mx + std::log(sum);
}

void log_softmax(std::span<const float> logits, std::span<float> out) {
  const double lse = log_sum_exp(logits);
  const size_t n = std::min(logits.size(), out.size());
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(logits[i]) - lse);
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t top_n) {
  TokenLogprob r;
  r.token = token;
  const double lse = log_sum_exp(logits);
  if (token >= 0 && static_cast<size_t>(token) < logits.size())
    r.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - lse);
  const auto n = static_cast<size_t>(std::clamp<int64_t>(top_n, 0, static_cast<int64_t>(logits.size())));
  if (n == 0) return r;
  // Insertion into a sorted list of n (n <= 20 in practice): one pass, and
  // most logits fail the first comparison against the current n-th best.
  // Order: logit descending, then id ascending (a strict total order); NaN
  // logits never enter.
  std::vector<std::pair<int32_t, float>>& top = r.top;
  top.reserve(n + 1);
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    if (std::isnan(l)) continue;
    if (top.size() == n && !(l > top.back().second)) continue;  // ties keep the lower id already in
    auto at = std::upper_bound(top.begin(), top.end(), l,
                               [](float v, const std::pair<int32_t, float>& e) { return v > e.second; });
    top.insert(at, {static_cast<int32_t>(i), l});
    if (top.size() > n) top.pop_back();
  }
  for (auto& e : top) e.second = static_cast<float>(static_cast<double>(e.second) - lse);
  return r;
}

void pool_add_rows(std::span<double> acc, std::span<const float> rows) {
  const size_t dim = acc.size();
  if (dim == 0) return;
  for (size_t r = 0; r + dim <= rows.size(); r += dim)
    for (size_t d = 0; d < dim; ++d) acc[d] += rows[r + d];
}

std::vector<float> pool_finish(std::span<double> acc, int64_t rows) {
  double norm2 = 0.0;
  for (double& v : acc) {
    v /= static_cast<double>(std::max<int64_t>(rows, 1));
    norm2 += v * v;
  }
  const double inv = norm2 > 0.0 ? 1.0 / std::sqrt(norm2) : 0.0;
  std::vector<float> out(acc.size());
  for (size_t d = 0; d < acc.size(); ++d) out[d] = static_cast<float>(acc[d] * inv);
  return out;
}

std::vector<float> mean_pool_l2(std::span<const float> hidden, int64_t rows, int64_t dim) {
  std::vector<double> acc(static_cast<size_t>(std::max<int64_t>(dim, 0)), 0.0);
  pool_add_rows(acc, hidden.first(static_cast<size_t>(std::max<int64_t>(rows, 0) * static_cast<int64_t>(acc.size()))));
  return pool_finish(acc, rows);
}

}  // namespace bonsai::engine
