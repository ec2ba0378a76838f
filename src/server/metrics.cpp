// Prometheus registry and text exposition. See metrics.h.
#include "server/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

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
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
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

void MetricsRegistry::set_histogram(const std::string& name, const Labels& labels,
                                    const std::vector<uint64_t>& counts, double sum) {
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
    const char* type = f.type == MetricType::kCounter ? "counter" : f.type == MetricType::kGauge ? "gauge" : "histogram";
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

}  // namespace bonsai::server
