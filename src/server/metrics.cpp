// Prometheus registry and text exposition. See metrics.h.
#include "server/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/model_pool.h"    // ModelPool::list / peek (refresh_model_gauges)
#include "engine/rate_tracker.h"  // RequestRateStats
#include "engine/scheduler.h"     // SchedulerStats, kStepBuckets

namespace bonsai::server {
namespace {

std::string render_labels(const Labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out += k + "=\"" + escape_label_value(v) + "\"";
  }
  return out;
}

std::string with_braces(const std::string& inner) { return inner.empty() ? "" : "{" + inner + "}"; }

std::string escape_help(const std::string& h) {
  std::string out;
  for (char c : h) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  char buf[64];  // shortest text that reads back as the same double
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void MetricsRegistry::declare(const std::string& name, const std::string& help, MetricType type,
                              std::vector<double> buckets) {
  std::lock_guard lock(mu_);
  if (families_.contains(name)) return;
  Family f;
  f.help = help;
  f.type = type;
  f.buckets = std::move(buckets);
  families_.emplace(name, std::move(f));
}

void MetricsRegistry::inc(const std::string& name, const Labels& labels, double v) {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || v < 0) return;
  std::string key = render_labels(labels);
  it->second.values[key] += v;
  it->second.label_sets.try_emplace(key, labels);
}

void MetricsRegistry::set(const std::string& name, const Labels& labels, double v) {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return;
  std::string key = render_labels(labels);
  it->second.values[key] = v;
  it->second.label_sets.try_emplace(key, labels);
}

void MetricsRegistry::clear(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return;
  it->second.values.clear();
  it->second.histograms.clear();
  it->second.label_sets.clear();
}

void MetricsRegistry::set_histogram(const std::string& name, const Labels& labels, const std::vector<uint64_t>& counts,
                                    double sum) {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.type != MetricType::kHistogram) return;
  Family& f = it->second;
  if (counts.size() != f.buckets.size() + 1) return;
  std::string key = render_labels(labels);
  Histogram& h = f.histograms[key];
  f.label_sets.try_emplace(key, labels);
  h.counts = counts;
  h.sum = sum;
  h.count = 0;
  for (uint64_t c : counts) h.count += c;
}

void MetricsRegistry::observe(const std::string& name, const Labels& labels, double v) {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.type != MetricType::kHistogram || std::isnan(v)) return;
  Family& f = it->second;
  std::string key = render_labels(labels);
  Histogram& h = f.histograms[key];
  f.label_sets.try_emplace(key, labels);
  if (h.counts.empty()) h.counts.assign(f.buckets.size() + 1, 0);
  size_t b = 0;
  while (b < f.buckets.size() && v > f.buckets[b]) ++b;
  ++h.counts[b];
  h.sum += v;
  ++h.count;
}

std::string MetricsRegistry::expose() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == MetricType::kCounter ? "counter"
                       : f.type == MetricType::kGauge ? "gauge"
                                                      : "histogram";
    out += "# HELP " + name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + name + " " + type + "\n";
    if (f.type != MetricType::kHistogram) {
      for (const auto& [key, v] : f.values) out += name + with_braces(key) + " " + format_metric_value(v) + "\n";
      continue;
    }
    for (const auto& [key, h] : f.histograms) {
      std::string prefix = key.empty() ? "" : key + ",";
      uint64_t cumulative = 0;
      for (size_t b = 0; b <= f.buckets.size(); ++b) {
        cumulative += h.counts[b];
        std::string le = b < f.buckets.size() ? format_metric_value(f.buckets[b]) : "+Inf";
        out += name + "_bucket{" + prefix + "le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
      }
      out += name + "_sum" + with_braces(key) + " " + format_metric_value(h.sum) + "\n";
      out += name + "_count" + with_braces(key) + " " + std::to_string(h.count) + "\n";
    }
  }
  return out;
}

double MetricsRegistry::value(const std::string& name, const Labels& labels) const {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto v = it->second.values.find(render_labels(labels));
  return v == it->second.values.end() ? 0 : v->second;
}

uint64_t MetricsRegistry::histogram_count(const std::string& name, const Labels& labels) const {
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto h = it->second.histograms.find(render_labels(labels));
  return h == it->second.histograms.end() ? 0 : h->second.count;
}

using namespace metric;

void declare_server_metrics(MetricsRegistry& m) {
  const std::vector<double> latency = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  m.declare(kRequests, "HTTP requests by route and status code.", MetricType::kCounter);
  m.declare(kPromptTokens, "Prompt tokens processed, by model.", MetricType::kCounter);
  m.declare(kCompletionTokens, "Completion tokens generated, by model.", MetricType::kCounter);
  m.declare(kTtft, "Time from admission to the first generated token.", MetricType::kHistogram, latency);
  m.declare(kItl, "Time between consecutive generated tokens.", MetricType::kHistogram, latency);
  m.declare(kQueueWait, "Time a request waited for an engine replica.", MetricType::kHistogram, latency);
  m.declare(kRejected, "Requests refused with 503 because the model's wait queue was full.", MetricType::kCounter);
  m.declare(kCancelled, "Generations cut short, by reason (client_gone, timeout, shutdown).", MetricType::kCounter);
  m.declare(kPoolSize, "Engine replicas (sequence slots: max of --pool-size and --parallel) of each loaded model.",
            MetricType::kGauge);
  m.declare(kPoolBusy, "Engine replicas leased right now, per model.", MetricType::kGauge);
  m.declare(kWaiting, "Requests queued for a sequence slot, per model.", MetricType::kGauge);
  m.declare(kModelsLoaded, "Models loaded and ready.", MetricType::kGauge);
  m.declare(kModelBytes, "Estimated bytes of each resident model (mapping + KV caches).", MetricType::kGauge);
  m.declare(kMemoryBytes, "Estimated bytes of all resident models.", MetricType::kGauge);
  m.declare(kBudgetBytes, "Memory budget for resident models in bytes (0 = unlimited).", MetricType::kGauge);
  m.declare(kEngineItlP50, "Median inter-token latency over the engine's recent requests, per model.",
            MetricType::kGauge);
  m.declare(kEngineItlP95, "95th percentile inter-token latency over recent requests, per model.", MetricType::kGauge);
  m.declare(kEngineTps, "Mean decode tokens/s per request over recent requests, per model.", MetricType::kGauge);
  m.declare(kRunning, "Sequences in the model's step loop right now.", MetricType::kGauge);
  m.declare(kKvUsage, "KV-cache positions held by running sequences / all positions (0..1).", MetricType::kGauge);
  std::vector<double> step_buckets;
  for (int64_t b : engine::kStepBuckets) step_buckets.push_back(static_cast<double>(b));
  m.declare(kStepTokens, "Tokens per forward step of the scheduler (batch size).", MetricType::kHistogram,
            step_buckets);
  m.declare(kCacheHits, "Sequences that reused a cached prompt prefix.", MetricType::kCounter);
  m.declare(kCachedTokens, "Prompt tokens reused from the prompt cache.", MetricType::kCounter);
  m.declare(kComputedPrompt, "Prompt tokens computed by forward steps (not cached).", MetricType::kCounter);
  m.declare(kEmbeddingSeqs, "Embedding inputs run as scheduler sequences (/v1/embeddings).", MetricType::kCounter);
  m.declare(kDecodeStep, "The scheduler's learned duration of a decode-only step, per model (0: not measured yet).",
            MetricType::kGauge);
  m.declare(kPromptTokenCost,
            "The scheduler's learned marginal seconds per prompt token in a step, per model (0: not measured yet).",
            MetricType::kGauge);
  m.declare(kPromptAllowance, "Prompt tokens the step-time budget allowed in the last step with a pending prompt.",
            MetricType::kGauge);
  m.declare(kParallel, "Sequences a model may run at once (-np/--parallel).", MetricType::kGauge);
  m.declare(kVllmRunning, "Requests running (vLLM-compatible name).", MetricType::kGauge);
  m.declare(kVllmWaiting, "Requests waiting (vLLM-compatible name).", MetricType::kGauge);
  m.declare(kVllmKvUsage, "KV-cache usage, 1 = full (vLLM-compatible name).", MetricType::kGauge);
  m.declare(kKvCachedRatio, "KV-cache positions held only as prompt cache (evictable) / all positions (0..1).",
            MetricType::kGauge);
  m.declare(kKvEvictions, "Cached KV blocks evicted to make room, per model.", MetricType::kCounter);
  m.declare(kPreemptions, "Sequences preempted for lack of KV (blocks freed, recomputed later).", MetricType::kCounter);
  m.declare(kVllmPreemptions, "Sequences preempted (vLLM-compatible name).", MetricType::kCounter);
  m.declare(kVllmPrefixQueries, "Prompt tokens looked up in the prefix cache (vLLM-compatible name).",
            MetricType::kCounter);
  m.declare(kVllmPrefixHits, "Prompt tokens found in the prefix cache (vLLM-compatible name).", MetricType::kCounter);
  m.declare(kVllmPromptTokens, "Prompt tokens processed (vLLM-compatible name).", MetricType::kCounter);
  m.declare(kVllmGenerationTokens, "Generated tokens (vLLM-compatible name).", MetricType::kCounter);
  m.declare(kSpecDraftTokens, "Tokens proposed for speculative decoding and verified, per model and proposer.",
            MetricType::kCounter);
  m.declare(kSpecAcceptedTokens, "Proposed tokens accepted by verification, per model and proposer.",
            MetricType::kCounter);
  m.declare(kSpecAcceptance, "Accepted / proposed tokens of speculative decoding, per model and proposer (0..1).",
            MetricType::kGauge);
  m.declare(kVllmSpecDraftTokens, "Proposed (draft) tokens verified (vLLM-compatible name).", MetricType::kCounter);
  m.declare(kVllmSpecAcceptedTokens, "Proposed (draft) tokens accepted (vLLM-compatible name).", MetricType::kCounter);
  m.declare(kStateBytes, "Bytes of recurrent state (qwen35 Gated DeltaNet layers) held by a model's sequences.",
            MetricType::kGauge);
  m.declare(kSnapshotBytes, "Bytes of recurrent-state snapshots kept at block boundaries for the prompt cache.",
            MetricType::kGauge);
  m.declare(kSnapshotHits, "Prompt-cache adoptions that restored a recurrent state from a snapshot.",
            MetricType::kCounter);
  m.declare(kSnapshotEvictions, "Recurrent-state snapshots evicted (least recently used) for room.",
            MetricType::kCounter);
}

void refresh_model_gauges(MetricsRegistry& reg, const engine::ModelPool& models) {
  auto rows = models.list();
  for (const char* g :
       {kPoolSize, kPoolBusy, kModelBytes, kWaiting, kEngineItlP50, kEngineItlP95, kEngineTps, kRunning, kKvUsage,
        kVllmRunning, kVllmWaiting, kVllmKvUsage, kKvCachedRatio, kStateBytes, kSnapshotBytes})
    reg.clear(g);
  size_t loaded = 0;
  for (const auto& m : rows) {
    if (m.state != engine::ModelState::kLoaded) continue;
    ++loaded;
    reg.set(kPoolSize, {{"model", m.id}}, m.pool_size);
    reg.set(kPoolBusy, {{"model", m.id}}, m.busy);
    reg.set(kModelBytes, {{"model", m.id}}, static_cast<double>(m.mem_bytes));
    if (auto lm = models.peek(m.id); lm && lm->rates) {
      const engine::RequestRateStats st = lm->rates->snapshot();
      reg.set(kEngineItlP50, {{"model", m.id}}, st.itl_p50_ms / 1000.0);
      reg.set(kEngineItlP95, {{"model", m.id}}, st.itl_p95_ms / 1000.0);
      reg.set(kEngineTps, {{"model", m.id}}, st.tokens_per_s_mean);
    }
    if (auto lm = models.peek(m.id); lm && lm->scheduler) {
      const engine::SchedulerStats ss = lm->scheduler->stats();
      const Labels l{{"model", m.id}};
      const double kv = ss.kv_capacity > 0 ? static_cast<double>(ss.kv_used) / static_cast<double>(ss.kv_capacity) : 0;
      reg.set(kRunning, l, static_cast<double>(ss.running));
      reg.set(kWaiting, l, static_cast<double>(ss.waiting));
      reg.set(kKvUsage, l, kv);
      reg.set(kVllmRunning, {{"model_name", m.id}}, static_cast<double>(ss.running));
      reg.set(kVllmWaiting, {{"model_name", m.id}}, static_cast<double>(ss.waiting));
      reg.set(kVllmKvUsage, {{"model_name", m.id}}, kv);
      reg.set(kCacheHits, l, static_cast<double>(ss.cache_hits));
      reg.set(kCachedTokens, l, static_cast<double>(ss.cached_tokens));
      reg.set(kComputedPrompt, l, static_cast<double>(ss.prompt_tokens));
      reg.set(kEmbeddingSeqs, l, static_cast<double>(ss.embeddings));
      reg.set_histogram(kStepTokens, l, ss.step_hist, static_cast<double>(ss.step_tokens));
      reg.set(kDecodeStep, l, ss.decode_step_seconds);
      reg.set(kPromptTokenCost, l, ss.prompt_token_seconds);
      reg.set(kPromptAllowance, l, static_cast<double>(ss.prompt_allowance));
      reg.set(kParallel, l, static_cast<double>(lm->scheduler->options().max_sequences));
      const double cached =
          ss.kv_capacity > 0 ? static_cast<double>(ss.kv_cached) / static_cast<double>(ss.kv_capacity) : 0;
      reg.set(kKvCachedRatio, l, cached);
      reg.set(kKvEvictions, l, static_cast<double>(ss.kv_evictions));
      reg.set(kPreemptions, l, static_cast<double>(ss.preemptions));
      const Labels vl{{"model_name", m.id}};
      reg.set(kVllmPreemptions, vl, static_cast<double>(ss.preemptions));
      reg.set(kVllmPrefixQueries, vl, static_cast<double>(ss.cache_queried_tokens));
      reg.set(kVllmPrefixHits, vl, static_cast<double>(ss.cached_tokens));
      // Per proposer (labels ngram and draft); vLLM's names carry the sum.
      const struct {
        const char* name;
        uint64_t proposed, accepted;
      } props[] = {{"ngram", ss.spec_ngram_proposed, ss.spec_ngram_accepted},
                   {"draft", ss.spec_draft_proposed, ss.spec_draft_accepted}};
      for (const auto& pr : props) {
        const Labels sl{{"model", m.id}, {"proposer", pr.name}};
        reg.set(kSpecDraftTokens, sl, static_cast<double>(pr.proposed));
        reg.set(kSpecAcceptedTokens, sl, static_cast<double>(pr.accepted));
        reg.set(kSpecAcceptance, sl,
                pr.proposed > 0 ? static_cast<double>(pr.accepted) / static_cast<double>(pr.proposed) : 0.0);
      }
      reg.set(kVllmSpecDraftTokens, vl, static_cast<double>(ss.spec_ngram_proposed + ss.spec_draft_proposed));
      reg.set(kVllmSpecAcceptedTokens, vl, static_cast<double>(ss.spec_ngram_accepted + ss.spec_draft_accepted));
      if (lm->kv_pool && lm->kv_pool->state_bytes() > 0) {
        reg.set(kStateBytes, l, static_cast<double>(ss.recurrent_state_bytes));
        reg.set(kSnapshotBytes, l, static_cast<double>(ss.state_snapshot_bytes));
        reg.set(kSnapshotHits, l, static_cast<double>(ss.state_snapshot_hits));
        reg.set(kSnapshotEvictions, l, static_cast<double>(ss.state_snapshot_evictions));
      }
    }
  }
  reg.set(kModelsLoaded, {}, static_cast<double>(loaded));
  reg.set(kMemoryBytes, {}, static_cast<double>(models.current_mem_bytes()));
  reg.set(kBudgetBytes, {}, static_cast<double>(models.mem_budget_bytes()));
}

}  // namespace bonsai::server
