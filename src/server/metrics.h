// A small Prometheus metrics registry and its text exposition format
// (prometheus.io/docs/instrumenting/exposition_formats, version 0.0.4):
// counters, gauges and histograms with labels. Families are declared once
// (name, help, type, histogram buckets); samples are keyed by label sets.
//
// Thread-safe: one mutex (mu_) guards every family; it is held only while a
// value is updated or the text is rendered.
//
// Below the registry: the server's metric families (names, help, types) and
// the per-model gauges refreshed from the ModelPool before each scrape.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace bonsai::engine {
class ModelPool;
}

namespace bonsai::server {

// Label pairs in the order they are written, e.g. {{"route","/v1/models"},{"status","200"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { kCounter, kGauge, kHistogram };

class MetricsRegistry {
 public:
  // Declares a family. `name` must match [a-zA-Z_:][a-zA-Z0-9_:]*; counters
  // should end in _total. `buckets`: histogram upper bounds, ascending (the
  // +Inf bucket is implicit). Re-declaring a name keeps the first declaration.
  void declare(const std::string& name, const std::string& help, MetricType type, std::vector<double> buckets = {});

  // Adds `v` (>= 0) to a counter.
  void inc(const std::string& name, const Labels& labels, double v = 1.0);
  // Sets a gauge.
  void set(const std::string& name, const Labels& labels, double v);
  // Drops every sample of a gauge family (before re-setting per-model gauges).
  void clear(const std::string& name);
  // Replaces a histogram sample wholesale (one kept elsewhere, e.g. by the
  // scheduler): `counts` per bucket, not cumulative, the last one +Inf
  // (size = buckets + 1; other sizes are ignored), with their sum and count.
  void set_histogram(const std::string& name, const Labels& labels, const std::vector<uint64_t>& counts, double sum);
  // Records one observation in a histogram.
  void observe(const std::string& name, const Labels& labels, double v);

  // The whole registry in the text format: "# HELP", "# TYPE", then samples
  // (histograms as _bucket{le=...} cumulative counts, _sum and _count).
  std::string expose() const;

  // Reads a counter or gauge sample (tests); 0 if absent.
  double value(const std::string& name, const Labels& labels) const;
  // Reads a histogram's _count (tests); 0 if absent.
  uint64_t histogram_count(const std::string& name, const Labels& labels) const;

 private:
  struct Histogram {
    std::vector<uint64_t> counts;  // per bucket (not cumulative); last = +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  struct Family {
    std::string help;
    MetricType type = MetricType::kCounter;
    std::vector<double> buckets;
    std::map<std::string, double> values;         // key: rendered label set
    std::map<std::string, Histogram> histograms;  // key: rendered label set
    std::map<std::string, Labels> label_sets;
  };

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

// Escapes a label value for the exposition format: backslash, double quote, newline.
std::string escape_label_value(const std::string& v);

// Prometheus's number formatting: integers without a fraction, +Inf, NaN.
std::string format_metric_value(double v);

// The server's metric families. Names follow Prometheus conventions
// (bonsai_..._total counters, _seconds histograms); the vllm: names are what
// scale-out routers (Gateway API Inference Extension) read unconfigured.
namespace metric {
inline constexpr const char* kRequests = "bonsai_http_requests_total";
inline constexpr const char* kPromptTokens = "bonsai_prompt_tokens_total";
inline constexpr const char* kCompletionTokens = "bonsai_completion_tokens_total";
inline constexpr const char* kTtft = "bonsai_time_to_first_token_seconds";
inline constexpr const char* kItl = "bonsai_inter_token_latency_seconds";
inline constexpr const char* kQueueWait = "bonsai_queue_wait_seconds";
inline constexpr const char* kRejected = "bonsai_admission_rejected_total";
inline constexpr const char* kCancelled = "bonsai_generations_cancelled_total";
inline constexpr const char* kPoolSize = "bonsai_pool_size";
inline constexpr const char* kPoolBusy = "bonsai_pool_busy";
inline constexpr const char* kWaiting = "bonsai_requests_waiting";
inline constexpr const char* kModelsLoaded = "bonsai_models_loaded";
inline constexpr const char* kModelBytes = "bonsai_model_bytes";
inline constexpr const char* kMemoryBytes = "bonsai_memory_bytes";
inline constexpr const char* kBudgetBytes = "bonsai_memory_budget_bytes";
inline constexpr const char* kEngineItlP50 = "bonsai_engine_itl_p50_seconds";
inline constexpr const char* kEngineItlP95 = "bonsai_engine_itl_p95_seconds";
inline constexpr const char* kEngineTps = "bonsai_engine_tokens_per_second";
// Scheduler (continuous batching) series, per model.
inline constexpr const char* kRunning = "bonsai_requests_running";
inline constexpr const char* kKvUsage = "bonsai_kv_cache_usage_ratio";
inline constexpr const char* kStepTokens = "bonsai_batch_tokens_per_step";
inline constexpr const char* kCacheHits = "bonsai_prompt_cache_hits_total";
inline constexpr const char* kCachedTokens = "bonsai_prompt_cache_tokens_total";
inline constexpr const char* kComputedPrompt = "bonsai_prompt_tokens_computed_total";
inline constexpr const char* kEmbeddingSeqs = "bonsai_embedding_sequences_total";
inline constexpr const char* kDecodeStep = "bonsai_decode_step_seconds";
inline constexpr const char* kPromptTokenCost = "bonsai_prompt_token_seconds";
inline constexpr const char* kPromptAllowance = "bonsai_step_prompt_tokens_allowed";
inline constexpr const char* kParallel = "bonsai_parallel_sequences";
inline constexpr const char* kVllmRunning = "vllm:num_requests_running";
inline constexpr const char* kVllmWaiting = "vllm:num_requests_waiting";
inline constexpr const char* kVllmKvUsage = "vllm:kv_cache_usage_perc";
inline constexpr const char* kKvCachedRatio = "bonsai_kv_cache_cached_ratio";
inline constexpr const char* kKvEvictions = "bonsai_kv_cache_evicted_blocks_total";
inline constexpr const char* kPreemptions = "bonsai_preemptions_total";
// vLLM's counters as its /metrics shows them (prometheus_client adds
// "_total" to a counter's samples): dashboards and routers query
// vllm:num_preemptions_total, vllm:prefix_cache_hits_total, ...
inline constexpr const char* kVllmPreemptions = "vllm:num_preemptions_total";
inline constexpr const char* kVllmPrefixQueries = "vllm:prefix_cache_queries_total";
inline constexpr const char* kVllmPrefixHits = "vllm:prefix_cache_hits_total";
inline constexpr const char* kVllmPromptTokens = "vllm:prompt_tokens_total";          // as kPromptTokens
inline constexpr const char* kVllmGenerationTokens = "vllm:generation_tokens_total";  // as kCompletionTokens
// Speculative decoding, per model and proposer (label proposer="ngram": prompt
// lookup): proposed tokens verified, accepted ones, and accepted / proposed;
// vLLM's names (model_name label) for the two counters.
inline constexpr const char* kSpecDraftTokens = "bonsai_spec_draft_tokens_total";
inline constexpr const char* kSpecAcceptedTokens = "bonsai_spec_accepted_tokens_total";
inline constexpr const char* kSpecAcceptance = "bonsai_spec_acceptance_ratio";
inline constexpr const char* kVllmSpecDraftTokens = "vllm:spec_decode_num_draft_tokens_total";
inline constexpr const char* kVllmSpecAcceptedTokens = "vllm:spec_decode_num_accepted_tokens_total";
// Recurrent state of hybrid models (qwen35), per model; absent for other models.
inline constexpr const char* kStateBytes = "bonsai_recurrent_state_bytes";
inline constexpr const char* kSnapshotBytes = "bonsai_state_snapshot_bytes";
inline constexpr const char* kSnapshotHits = "bonsai_state_snapshot_hits_total";
inline constexpr const char* kSnapshotEvictions = "bonsai_state_snapshot_evictions_total";
}  // namespace metric

// Declares every family of namespace metric in `m` (HELP, TYPE, buckets).
void declare_server_metrics(MetricsRegistry& m);

// Sets the per-model gauges (pool size / busy, bytes, rates, scheduler
// running / waiting / KV usage / cache counters / step histogram) and the
// global ones (models loaded, memory, budget) from `models`, dropping the
// series of models no longer loaded. Callers serialise it with the
// exposition (a concurrent scrape could otherwise miss series).
void refresh_model_gauges(MetricsRegistry& m, const engine::ModelPool& models);

}  // namespace bonsai::server
