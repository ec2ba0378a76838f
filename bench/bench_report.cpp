#include "bench_report.h"

#include <sys/mman.h>  // madvise

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

namespace bonsai::bench {

namespace {

// The value after the first "KEY ... :" line of `text`, trimmed; "" if none.
std::string field(const std::string& text, std::string_view key) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line(text.data() + pos, end - pos);
    const size_t colon = line.find(':');
    if (line.starts_with(key) && colon != std::string_view::npos) {
      std::string_view v = line.substr(colon + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
      return std::string(v);
    }
    pos = end + 1;
  }
  return "";
}

}  // namespace

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (std::string m = field(text, "model name"); !m.empty()) return m;
  text.clear();
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen("lscpu 2>/dev/null", "r"), ::pclose);
  if (p) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p.get())) > 0;) text.append(buf, n);
  }
  std::string m = field(text, "Model name");
  return m.empty() ? "unknown" : m;
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (i > 0) s += ' ';
    if (!a.empty() && a.find_first_of(" \t'\"\\$") == std::string::npos) {
      s += a;
      continue;
    }
    s += '\'';
    for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
    s += '\'';
  }
  return s;
}

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

void add_json_option(CLI::App& app, std::string& path) {
  app.add_option("--json", path, "Also write the figures as one JSON object (cpu, command, results) to FILE")
      ->type_name("FILE");
}

bool write_json(const std::string& path, std::string_view bench, int argc, char** argv, nlohmann::json results) {
  if (path.empty()) return true;
  nlohmann::json j;
  j["bench"] = bench;
  j["cpu"] = cpu_model();
  j["command"] = command_line(argc, argv);
  j["results"] = std::move(results);
  std::ofstream out(path);
  out << j.dump(2) << '\n';
  if (!out) {
    std::fprintf(stderr, "--json %s: cannot write the file\n", path.c_str());
    return false;
  }
  return true;
}

uint8_t* huge_alloc(size_t n, bool huge_pages) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t sz = (n + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, sz);
  if (p == nullptr) {
    std::fprintf(stderr, "bench: cannot allocate %zu MiB\n", sz >> 20);
    std::exit(1);
  }
  if (huge_pages) madvise(p, sz, MADV_HUGEPAGE);
  return static_cast<uint8_t*>(p);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bonsai::bench
