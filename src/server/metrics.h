// A small Prometheus metrics registry and its text exposition format
// (prometheus.io/docs/instrumenting/exposition_formats, version 0.0.4):
// counters, gauges and histograms with labels. Families are declared once
// (name, help, type, histogram buckets); samples are keyed by label sets.
//
// Thread-safe: one mutex (mu_) guards every family; it is held only while a
// value is updated or the text is rendered.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace bonsai::server {

// Label pairs in the order they are written, e.g. {{"route","/v1/models"},{"status","200"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { kCounter, kGauge, kHistogram };

class MetricsRegistry {
 public:
  // Declares a family. `name` must match [a-zA-Z_:][a-zA-Z0-9_:]*; counters
  // should end in _total. `buckets`: histogram upper bounds, ascending (the
  // +Inf bucket is implicit). Re-declaring a name keeps the first declaration.
  void declare(const std::string& name, const std::string& help, MetricType type,
               std::vector<double> buckets = {});

  // Adds `v` (>= 0) to a counter.
  void inc(const std::string& name, const Labels& labels, double v = 1.0);
  // Sets a gauge.
  void set(const std::string& name, const Labels& labels, double v);
  // Drops every sample of a gauge family (before re-setting per-model gauges).
  void clear(const std::string& name);
  // Replaces a histogram sample wholesale (one kept elsewhere, e.g. by the
  // scheduler): `counts` per bucket, not cumulative, the last one +Inf
  // (size = buckets + 1; other sizes are ignored), with their sum and count.
  void set_histogram(const std::string& name, const Labels& labels, const std::vector<uint64_t>& counts,
                     double sum);
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

}  // namespace bonsai::server
