// The OpenAI-compatible HTTP server. See server.h.
#include "server/server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/ggml_types.h"            // parse_q2_layout (admin load)
#include "engine/engine_pool.h"       // model_footprint
#include "engine/inference_engine.h"  // GenerationResult, finish_reason_name
#include "engine/scheduler.h"         // Scheduler, CompletionJob, JobHandle
#include "gguf/gguf.h"                // OpenOptions
#include "engine/chat_output.h"       // reasoning / tool-call split of chat answers
#include "engine/rate_tracker.h"      // RequestRateTracker
#include "server/openai.h"            // request parsing, response builders, ApiError
#include "server/web_ui.h"            // GET /: the embedded web chat page
#include "tokenizer/tokenizer.h"      // Tokenizer::encode_chat / encode_prompt

namespace bonsai::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Pending connections the kernel queues before accept (listen(2) backlog).
constexpr int kListenBacklog = 1024;

namespace {

// Metric family names (the exposition lists them with HELP and TYPE).
constexpr const char* kRequests = "bonsai_http_requests_total";
constexpr const char* kPromptTokens = "bonsai_prompt_tokens_total";
constexpr const char* kCompletionTokens = "bonsai_completion_tokens_total";
constexpr const char* kTtft = "bonsai_time_to_first_token_seconds";
constexpr const char* kItl = "bonsai_inter_token_latency_seconds";
constexpr const char* kQueueWait = "bonsai_queue_wait_seconds";
constexpr const char* kRejected = "bonsai_admission_rejected_total";
constexpr const char* kCancelled = "bonsai_generations_cancelled_total";
constexpr const char* kPoolSize = "bonsai_pool_size";
constexpr const char* kPoolBusy = "bonsai_pool_busy";
constexpr const char* kWaiting = "bonsai_requests_waiting";
constexpr const char* kModelsLoaded = "bonsai_models_loaded";
constexpr const char* kModelBytes = "bonsai_model_bytes";
constexpr const char* kMemoryBytes = "bonsai_memory_bytes";
constexpr const char* kBudgetBytes = "bonsai_memory_budget_bytes";
constexpr const char* kEngineItlP50 = "bonsai_engine_itl_p50_seconds";
constexpr const char* kEngineItlP95 = "bonsai_engine_itl_p95_seconds";
constexpr const char* kEngineTps = "bonsai_engine_tokens_per_second";
// Scheduler (continuous batching) series, per model; the vllm: names are what
// scale-out routers (Gateway API Inference Extension) read unconfigured.
constexpr const char* kRunning = "bonsai_requests_running";
constexpr const char* kKvUsage = "bonsai_kv_cache_usage_ratio";
constexpr const char* kStepTokens = "bonsai_batch_tokens_per_step";
constexpr const char* kCacheHits = "bonsai_prompt_cache_hits_total";
constexpr const char* kCachedTokens = "bonsai_prompt_cache_tokens_total";
constexpr const char* kComputedPrompt = "bonsai_prompt_tokens_computed_total";
constexpr const char* kVllmRunning = "vllm:num_requests_running";
constexpr const char* kVllmWaiting = "vllm:num_requests_waiting";
constexpr const char* kVllmKvUsage = "vllm:kv_cache_usage_perc";

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// `t` + `seconds`, saturated: a huge or infinite timeout (--timeout inf,
// 1e10: "no timeout") means 10^9 s (~31 years). Converting it unclamped to
// nanoseconds overflowed int64 into a deadline in the past, and every
// request timed out at once.
Clock::time_point deadline_after(Clock::time_point t, double seconds) {
  constexpr double kMaxSeconds = 1e9;
  if (!(seconds < kMaxSeconds)) seconds = kMaxSeconds;  // also NaN
  if (seconds < 0) seconds = 0;
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Calls fn(fd, peer_host, peer_port) for each connected TCP socket of this
// process whose local port is `local_port` (the server side of every
// connection to the listener), until fn returns false. Hosts are numeric,
// as getnameinfo(NI_NUMERICHOST) writes them (httplib's remote_addr too).
template <class Fn>
void for_each_connection(int local_port, Fn fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd < 0) continue;
    sockaddr_storage self{};
    socklen_t len = sizeof self;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &len) != 0) continue;
    if (self.ss_family != AF_INET && self.ss_family != AF_INET6) continue;
    const int port = self.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&self)->sin6_port)
                                                : ntohs(reinterpret_cast<sockaddr_in*>(&self)->sin_port);
    if (port != local_port) continue;
    sockaddr_storage peer{};
    len = sizeof peer;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;  // the listener
    char host[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      continue;
    if (!fn(static_cast<int>(fd), std::string(host), std::atoi(serv))) break;
  }
  closedir(dir);
}

// The server-side socket of the connection that sent `req`, or -1.
// httplib 0.11 gives handlers no access to it (later versions added
// Request::is_connection_closed for this), so it is found by its addresses:
// the socket in /proc/self/fd whose peer is req's remote address and port
// and whose local port is `local_port`. A TCP connection's address pair is
// unique, and the connection (so the fd) stays open while its handler runs.
int find_client_socket(const httplib::Request& req, int local_port) {
  int found = -1;
  for_each_connection(local_port, [&](int fd, const std::string& host, int port) {
    if (host != req.remote_addr || port != req.remote_port) return true;
    found = fd;
    return false;
  });
  return found;
}

// True when the peer of `fd` has closed the connection (an orderly FIN or an
// error). Data waiting to be read (a pipelined next request) is not a close.
bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
  if ((p.revents & POLLIN) != 0) {
    char c = 0;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

// The route a path belongs to (bounded label values for /metrics).
std::string route_label(const std::string& path) {
  static const std::set<std::string> known = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                              "/health",              "/metrics",        "/admin/models",
                                              "/admin/models/load",   "/admin/models/unload"};
  if (known.contains(path)) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

ApiError from_core_error(const core::Error& e, int default_status = 400) {
  ApiError a;
  a.message = e.message;
  switch (e.code) {
    case core::Errc::kInvalidArgument:
    case core::Errc::kOutOfRange:
      a.status = 400;
      break;
    case core::Errc::kNotFound:
      a.status = 404;
      break;
    case core::Errc::kResourceExhausted:
    case core::Errc::kTimeout:
    case core::Errc::kCancelled:
      a = overloaded(e.message, "overloaded", 1);
      break;
    default:
      a.status = default_status;
      if (default_status >= 500) a.type = "server_error";
      break;
  }
  return a;
}

// One admitted request: what the handler prepared and the stream provider
// (which runs after the handler returns) still needs. Dropping it cancels
// the job if it is still running (its slot comes back within a step), then
// releases the model.
struct Job {
  std::shared_ptr<engine::ModelPool> pool;
  std::shared_ptr<engine::LoadedModel> model;
  std::shared_ptr<engine::JobHandle> handle;  // set once submitted to the model's scheduler
  std::vector<int32_t> prompt;
  engine::SamplingParams params;
  uint64_t seed = 0;
  int n = 1;
  bool include_usage = false;
  // Chat: how the generated text splits into reasoning / content / tool calls.
  engine::ChatOutputParser::Options output;
  ResponseMeta meta;
  Clock::time_point admitted;
  Clock::time_point deadline;
  int client_fd = -1;  // the connection's socket (disconnect checks), -1 unknown

  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    if (handle) handle->cancel();
    handle.reset();
    if (model) pool->release(model);
  }
};

// "1.5 GiB", "160.0 KiB": sizes in error messages, with enough precision for small models.
std::string size_text(uint64_t bytes) {
  const char* unit = "KiB";
  double v = static_cast<double>(bytes) / 1024.0;
  if (bytes >= (1ull << 30)) {
    unit = "GiB";
    v = static_cast<double>(bytes) / static_cast<double>(1ull << 30);
  } else if (bytes >= (1ull << 20)) {
    unit = "MiB";
    v = static_cast<double>(bytes) / static_cast<double>(1ull << 20);
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, unit);
  return buf;
}

// Largest pool_size an admin load accepts (each replica holds its own KV
// caches; 1'000'000 replicas would exhaust memory long before the budget
// check could help when no budget is set).
constexpr int64_t kMaxAdminPoolSize = 256;
constexpr size_t kMaxModelIdBytes = 256;  // longest model id an admin load accepts

// Why a generation was cut short (kCancelled from the engine).
enum class CutReason { kNone, kClientGone, kShutdown };

// A fresh random seed for a request that names none (and no --seed default):
// two users at temperature > 0 get different text, and a restart does not replay it.
uint64_t fresh_seed() {
  static std::mutex mu;
  static std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
                             static_cast<uint64_t>(Clock::now().time_since_epoch().count())};
  std::lock_guard lock(mu);
  return rng();
}

}  // namespace

struct Server::Impl {
  std::shared_ptr<engine::ModelPool> models;
  ServerOptions opt;
  httplib::Server http;
  MetricsRegistry metrics;
  std::atomic<bool> stopping{false};
  std::atomic<bool> run_entered{false};   // run() called (set before it checks `stopping`)
  std::atomic<bool> run_returned{false};  // run() returned
  int64_t started_unix = unix_now();
  std::mutex scrape_mu;               // one /metrics refresh + exposition at a time
  int bound_port = -1;                // set by Server::bind()
  int listen_fd = -1;                 // the listening socket (set_socket_options), for its backlog
  // Connections with a request being handled or answered, by peer (host,
  // port): counted from pre-routing until httplib's logger, which runs after
  // the response (a stream's last chunk included) is written. The others are
  // idle keep-alive connections, which stop() closes.
  std::mutex conn_mu;
  std::map<std::pair<std::string, int>, int> busy_peers;  // guarded by conn_mu

  Impl(std::shared_ptr<engine::ModelPool> m, ServerOptions o) : models(std::move(m)), opt(std::move(o)) {
    declare_metrics();
    setup();
  }

  void declare_metrics() {
    const std::vector<double> latency = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25,  0.5,    1,     2.5,  5,     10,   30};
    metrics.declare(kRequests, "HTTP requests by route and status code.", MetricType::kCounter);
    metrics.declare(kPromptTokens, "Prompt tokens processed, by model.", MetricType::kCounter);
    metrics.declare(kCompletionTokens, "Completion tokens generated, by model.", MetricType::kCounter);
    metrics.declare(kTtft, "Time from admission to the first generated token.", MetricType::kHistogram, latency);
    metrics.declare(kItl, "Time between consecutive generated tokens.", MetricType::kHistogram, latency);
    metrics.declare(kQueueWait, "Time a request waited for an engine replica.", MetricType::kHistogram, latency);
    metrics.declare(kRejected, "Requests refused with 503 because the model's wait queue was full.",
                    MetricType::kCounter);
    metrics.declare(kCancelled, "Generations cut short, by reason (client_gone, timeout, shutdown).",
                    MetricType::kCounter);
    metrics.declare(kPoolSize, "Engine replicas of each loaded model.", MetricType::kGauge);
    metrics.declare(kPoolBusy, "Engine replicas leased right now, per model.", MetricType::kGauge);
    metrics.declare(kWaiting, "Requests queued for a sequence slot, per model.", MetricType::kGauge);
    metrics.declare(kModelsLoaded, "Models loaded and ready.", MetricType::kGauge);
    metrics.declare(kModelBytes, "Estimated bytes of each resident model (mapping + KV caches).",
                    MetricType::kGauge);
    metrics.declare(kMemoryBytes, "Estimated bytes of all resident models.", MetricType::kGauge);
    metrics.declare(kBudgetBytes, "Memory budget for resident models in bytes (0 = unlimited).",
                    MetricType::kGauge);
    metrics.declare(kEngineItlP50, "Median inter-token latency over the engine's recent requests, per model.",
                    MetricType::kGauge);
    metrics.declare(kEngineItlP95, "95th percentile inter-token latency over recent requests, per model.",
                    MetricType::kGauge);
    metrics.declare(kEngineTps, "Mean decode tokens/s per request over recent requests, per model.",
                    MetricType::kGauge);
    metrics.declare(kRunning, "Sequences in the model's step loop right now.", MetricType::kGauge);
    metrics.declare(kKvUsage, "KV-cache positions held by running sequences / all positions (0..1).",
                    MetricType::kGauge);
    std::vector<double> step_buckets;
    for (int64_t b : engine::kStepBuckets) step_buckets.push_back(static_cast<double>(b));
    metrics.declare(kStepTokens, "Tokens per forward step of the scheduler (batch size).", MetricType::kHistogram,
                    step_buckets);
    metrics.declare(kCacheHits, "Sequences that reused a cached prompt prefix.", MetricType::kCounter);
    metrics.declare(kCachedTokens, "Prompt tokens reused from the prompt cache.", MetricType::kCounter);
    metrics.declare(kComputedPrompt, "Prompt tokens computed by forward steps (not cached).", MetricType::kCounter);
    metrics.declare(kVllmRunning, "Requests running (vLLM-compatible name).", MetricType::kGauge);
    metrics.declare(kVllmWaiting, "Requests waiting (vLLM-compatible name).", MetricType::kGauge);
    metrics.declare(kVllmKvUsage, "KV-cache usage, 1 = full (vLLM-compatible name).", MetricType::kGauge);
  }

  // ---- plumbing ---------------------------------------------------------

  static void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  static void send_error(httplib::Response& res, const ApiError& e) {
    if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
    send_json(res, e.status, e.to_json());
  }

  bool authorized(const httplib::Request& req) const {
    if (opt.api_key.empty()) return true;
    std::string h = req.get_header_value("Authorization");
    // RFC 7235 section 2.1: the auth scheme is case-insensitive ("bearer KEY" is valid).
    constexpr std::string_view kScheme = "bearer ";
    if (h.size() < kScheme.size()) return false;
    for (size_t i = 0; i < kScheme.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(h[i])) != kScheme[i]) return false;
    const std::string_view key = std::string_view(h).substr(kScheme.size());
    const std::string& want = opt.api_key;
    if (key.size() != want.size()) return false;
    unsigned diff = 0;  // constant time in the key's length
    for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(key[i] ^ want[i]);
    return diff == 0;
  }

  void setup() {
    http.new_task_queue = [n = opt.http_threads > 0 ? opt.http_threads : 64] {
      return new httplib::ThreadPool(static_cast<size_t>(n));
    };
    // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second
    // server bind the same port and silently share its connections.
    http.set_socket_options([this](int sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      listen_fd = sock;  // bind() widens its backlog once httplib listens
    });
    http.set_payload_max_length(opt.max_body_bytes);
    http.set_tcp_nodelay(true);
    http.set_keep_alive_timeout(5);

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard lock(conn_mu);
        ++busy_peers[{req.remote_addr, req.remote_port}];
      }
      const bool protected_route = req.path.rfind("/v1/", 0) == 0 || req.path.rfind("/admin/", 0) == 0;
      if (protected_route && !authorized(req)) {
        ApiError e;
        e.status = 401;
        e.code = "invalid_api_key";
        e.message = req.has_header("Authorization")
                        ? "Incorrect API key provided."
                        : "You didn't provide an API key. Provide it in the Authorization header (Authorization: "
                          "Bearer YOUR_KEY).";
        send_error(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });

    // Fills in OpenAI-shaped bodies for errors httplib produces itself (404
    // unknown route, 413 body too large, 400 unreadable request).
    httplib::Server::HandlerWithResponse on_error = [](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      ApiError e;
      e.status = res.status;
      if (res.status == 413) {
        e.message = "Request body too large.";
        e.code = "request_too_large";
      } else if (res.status == 404) {
        e.message = "Unknown request URL: " + req.method + " " + req.path + ".";
        e.code = "unknown_url";
      } else if (res.status >= 500) {
        e.type = "server_error";
        e.message = "The server had an error while processing your request.";
      } else {
        e.message = "The request could not be read (HTTP " + std::to_string(res.status) + ").";
      }
      send_error(res, e);
      return httplib::Server::HandlerResponse::Handled;
    };
    http.set_error_handler(std::move(on_error));

    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = "Internal error: " + what;
      send_error(res, e);
    });

    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics.inc(kRequests, {{"route", route_label(req.path)}, {"status", std::to_string(res.status)}});
      std::lock_guard lock(conn_mu);
      // Absent for a request refused before routing (an unreadable request line).
      if (auto it = busy_peers.find({req.remote_addr, req.remote_port}); it != busy_peers.end() && --it->second <= 0)
        busy_peers.erase(it);
    });

    post_json("/v1/chat/completions", [this](const httplib::Request& req, const std::string& body,
                                             httplib::Response& res) { handle_completion(req, body, res, Endpoint::kChat); });
    post_json("/v1/completions",
              [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
                handle_completion(req, body, res, Endpoint::kCompletion);
              });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { handle_models(res); });
    http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      handle_model(req.matches[1].str(), res);
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) { handle_health(res); });
    // The web chat page (web_ui.h): public like /health; the API calls it
    // makes carry the key the user enters in its settings.
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Content-Type-Options", "nosniff");
      const std::string_view page = web_ui_html();
      res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::string text;
      {
        // refresh_gauges clears the per-model gauges and sets them again: a
        // concurrent scrape exposing in between would miss those series.
        std::lock_guard lock(scrape_mu);
        refresh_gauges();
        text = metrics.expose();
      }
      res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
    });
    http.Get("/admin/models", [this](const httplib::Request&, httplib::Response& res) { handle_admin_list(res); });
    post_json("/admin/models/load", [this](const httplib::Request&, const std::string& body,
                                           httplib::Response& res) { handle_admin_load(body, res); });
    post_json("/admin/models/unload", [this](const httplib::Request&, const std::string& body,
                                             httplib::Response& res) { handle_admin_unload(body, res); });
  }

  // Registers a POST route whose body is read as JSON whatever its
  // Content-Type says (OpenAI's API does the same). The body is read here,
  // through httplib's content reader, rather than by httplib itself: httplib
  // caps application/x-www-form-urlencoded bodies at 8 KiB (413) — the type
  // `curl -d` sends by default — and parses them as a query string. The
  // limit is opt.max_body_bytes for every type (413 above it); a multipart
  // body is drained and refused with 400; no Content-Length and no
  // Transfer-Encoding means an empty body.
  void post_json(const std::string& pattern,
                 std::function<void(const httplib::Request&, const std::string&, httplib::Response&)> handler) {
    auto read_body = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                            std::string& body) {
      if (req.is_multipart_form_data()) {
        reader([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; });
        send_error(res, bad_request("The request body must be JSON (got multipart/form-data).", {}, "invalid_json"));
        return false;
      }
      // RFC 7230 section 3.3.3: a request with neither Content-Length nor
      // Transfer-Encoding has an empty body. httplib would read until the
      // client closes, i.e. hang for its read timeout (5 s) and then 400.
      std::string te = req.get_header_value("Transfer-Encoding");
      std::transform(te.begin(), te.end(), te.begin(), [](unsigned char ch) { return std::tolower(ch); });
      if (!req.has_header("Content-Length") && te.find("chunked") == std::string::npos) return true;
      bool too_large = false;
      const bool ok = reader([&](const char* data, size_t n) {
        if (body.size() + n > opt.max_body_bytes) {
          too_large = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (ok) return true;
      if (too_large) res.status = 413;
      if (res.status < 400) res.status = 400;  // unreadable (httplib sets 413 above its own limit)
      return false;  // the error handler writes the body
    };
    http.Post(pattern, [read_body, handler](const httplib::Request& req, httplib::Response& res,
                                            const httplib::ContentReader& reader) {
      std::string body;
      if (read_body(req, res, reader, body)) handler(req, body, res);
    });
    // A POST that httplib does not treat as having content comes here.
    http.Post(pattern, [handler](const httplib::Request& req, httplib::Response& res) { handler(req, req.body, res); });
  }

  // ---- completions --------------------------------------------------------

  void handle_completion(const httplib::Request& req, const std::string& body_text, httplib::Response& res,
                         Endpoint endpoint) {
    if (stopping) return send_error(res, overloaded("The server is shutting down.", "shutting_down", 5));
    const Clock::time_point admitted = Clock::now();
    CompletionRequest cr;
    if (auto e = parse_completion_request(body_text, endpoint, cr)) return send_error(res, *e);

    auto job = std::make_shared<Job>();
    job->pool = models;
    job->admitted = admitted;
    job->deadline = deadline_after(admitted, opt.timeout_s);
    const std::string model_id = cr.model.empty() ? opt.default_model : cr.model;
    if (model_id.empty()) return send_error(res, bad_request("You must provide a model parameter.", "model"));

    // The model: 404 unknown, 503 loading; a registered model loads on demand here.
    auto model = models->acquire(model_id);
    if (!model) {
      const core::Error& err = model.error();
      // 404 only for an id that names no model: a registered model whose
      // file fails to load (e.g. a missing GGUF key, also kNotFound) is a
      // server-side failure.
      if (err.code == core::Errc::kNotFound && !models->is_registered(model_id)) {
        ApiError e;
        e.status = 404;
        e.message = "The model '" + model_id + "' does not exist or you do not have access to it.";
        e.param = "model";
        e.code = "model_not_found";
        return send_error(res, e);
      }
      if (err.code == core::Errc::kResourceExhausted) {
        // Loading elsewhere (retry soon), or no room in the budget / slots right now.
        bool loading = false;
        for (const auto& m : models->list())
          loading = loading || (m.id == model_id && m.state == engine::ModelState::kLoading);
        return send_error(res, loading ? overloaded(err.message, "model_loading", 2)
                                       : overloaded(err.message, "insufficient_capacity", 5));
      }
      ApiError e;  // the file, not the request, is at fault: 500 whatever the loader's code
      e.status = 500;
      e.type = "server_error";
      e.code = "model_load_failed";
      e.message = "Model '" + model_id + "' could not be loaded: " + err.message;
      return send_error(res, e);
    }
    job->model = *model;
    const engine::LoadedModel& lm = *job->model;
    if (!lm.pool || !lm.tokenizer) return send_error(res, overloaded("Model '" + model_id + "' is not ready.", "model_loading"));
    const tokenizer::Tokenizer& tok = *lm.tokenizer;

    // Prompt tokens.
    if (endpoint == Endpoint::kChat) {
      tokenizer::ChatOptions copts;
      copts.enable_thinking = cr.enable_thinking;
      copts.tools = cr.tools;
      auto rendered = tok.chat_template().render(cr.messages, copts);
      if (!rendered) return send_error(res, bad_request(rendered.error().message, "messages"));
      job->prompt = tok.encode_chat(*rendered);
    } else if (!cr.prompt_ids.empty()) {
      for (int32_t id : cr.prompt_ids)
        if (id >= tok.n_vocab())
          return send_error(res, bad_request("Invalid 'prompt': token id " + std::to_string(id) +
                                                 " is outside the vocabulary (size " + std::to_string(tok.n_vocab()) + ").",
                                             "prompt", "invalid_value"));
      job->prompt = cr.prompt_ids;
    } else {
      // As llama.cpp's server: special-token text in a raw completion prompt is recognised.
      job->prompt = tok.encode_prompt(cr.prompt, /*parse_special=*/true);
    }
    if (job->prompt.empty()) return send_error(res, bad_request("The prompt is empty.", endpoint == Endpoint::kChat ? "messages" : "prompt"));

    // Context: prompt + max_tokens must fit.
    const int64_t n_ctx = lm.n_ctx;
    const int64_t n_prompt = static_cast<int64_t>(job->prompt.size());
    const int64_t max_tokens = cr.max_tokens ? *cr.max_tokens : n_ctx - n_prompt;
    if (n_prompt + max_tokens > n_ctx || n_prompt >= n_ctx) {
      return send_error(res, bad_request("This model's maximum context length is " + std::to_string(n_ctx) +
                                             " tokens. However, you requested " + std::to_string(n_prompt + std::max<int64_t>(max_tokens, 0)) +
                                             " tokens (" + std::to_string(n_prompt) + " in the " +
                                             (endpoint == Endpoint::kChat ? "messages" : "prompt") + ", " +
                                             std::to_string(std::max<int64_t>(max_tokens, 0)) +
                                             " in the completion). Please reduce the length of the " +
                                             (endpoint == Endpoint::kChat ? "messages" : "prompt") + " or completion.",
                                         endpoint == Endpoint::kChat ? "messages" : "prompt", "context_length_exceeded"));
    }

    // Sampling: the model's defaults, overridden by what the request says.
    engine::SamplingParams p = lm.spec.defaults;
    if (cr.temperature) p.temperature = *cr.temperature;
    if (cr.top_p) p.top_p = *cr.top_p;
    if (cr.top_k) p.top_k = *cr.top_k;
    if (cr.min_p) p.min_p = *cr.min_p;
    if (cr.repeat_penalty) p.repeat_penalty = *cr.repeat_penalty;
    if (cr.presence_penalty) p.presence_penalty = *cr.presence_penalty;
    if (cr.frequency_penalty) p.frequency_penalty = *cr.frequency_penalty;
    p.max_tokens = static_cast<int32_t>(max_tokens);
    p.stop = cr.stop;
    p.ignore_eos = cr.ignore_eos;
    for (const auto& [id, bias] : cr.logit_bias) {
      if (id >= tok.n_vocab())
        return send_error(res, bad_request("Invalid key in 'logit_bias': token " + std::to_string(id) +
                                               " is outside the vocabulary (size " + std::to_string(tok.n_vocab()) + ").",
                                           "logit_bias", "invalid_value"));
    }
    p.logit_bias = cr.logit_bias;
    if (auto v = p.validate(); !v) return send_error(res, bad_request(v.error().message));
    job->params = std::move(p);
    job->seed = cr.seed ? *cr.seed : opt.default_seed ? *opt.default_seed : fresh_seed();
    job->n = cr.n;
    job->include_usage = cr.include_usage;
    job->output.parse_reasoning = endpoint == Endpoint::kChat && opt.parse_reasoning;
    job->output.parse_tool_calls = endpoint == Endpoint::kChat && cr.tools.is_array() && !cr.tools.empty() &&
                                   !cr.tool_choice_none;
    job->meta = ResponseMeta{new_response_id(endpoint), unix_now(), model_id, endpoint};

    // Bounded admission: the model's scheduler queues the job (503 +
    // Retry-After when queue_factor x pool size jobs already wait).
    if (!lm.scheduler) return send_error(res, overloaded("Model '" + model_id + "' is not ready.", "model_loading"));
    engine::CompletionJob cj;
    cj.prompt = job->prompt;
    cj.params = job->params;
    cj.seed = job->seed;
    cj.n = job->n;
    cj.deadline = job->deadline;
    cj.submitted = admitted;
    auto handle = lm.scheduler->submit(std::move(cj), static_cast<size_t>(std::max(1, opt.queue_factor)) *
                                                         static_cast<size_t>(lm.pool->size()));
    if (!handle) {
      if (handle.error().code == core::Errc::kResourceExhausted) {
        metrics.inc(kRejected, {{"model", model_id}});
        return send_error(res, overloaded("Model '" + model_id + "' is overloaded: " + handle.error().message +
                                              ". Retry later.",
                                          "overloaded", 1));
      }
      return send_error(res, from_core_error(handle.error(), 500));
    }
    job->handle = std::move(*handle);
    job->client_fd = find_client_socket(req, bound_port);
    metrics.inc(kPromptTokens, {{"model", model_id}}, static_cast<double>(n_prompt) * job->n);

    if (cr.stream) return start_stream(res, job);
    run_blocking(res, *job);
  }

  // What one job's events came to, choice by choice.
  struct Progress {
    std::vector<std::optional<engine::GenerationResult>> done;  // per choice
    int n_done = 0;
    std::optional<core::Error> failed;
    CutReason cut = CutReason::kNone;
    bool started = false;  // a choice produced an event (it left the queue)
  };

  // Pumps `job`'s events until every choice is done, the job failed, or
  // `on_text` (per released piece: choice, text) returns false (the client is
  // gone). Between events it checks the client's socket, shutdown and the
  // deadline every 20 ms and cancels the job when needed: it stops within
  // one scheduler step.
  void pump(Job& job, Progress& pr, const std::function<bool(int, std::string_view)>& on_text) {
    pr.done.assign(static_cast<size_t>(job.n), std::nullopt);
    std::vector<engine::JobEvent> evs;
    bool cancelled = false;
    while (pr.n_done < job.n && !pr.failed) {
      evs.clear();
      job.handle->wait(evs, Clock::now() + std::chrono::milliseconds(20));
      for (auto& e : evs) {
        pr.started = true;
        switch (e.kind) {
          case engine::JobEvent::Kind::kText:
            if (!cancelled && !on_text(e.choice, e.text)) {
              pr.cut = CutReason::kClientGone;
              cancelled = true;
              job.handle->cancel();
            }
            break;
          case engine::JobEvent::Kind::kDone:
            if (!pr.done[static_cast<size_t>(e.choice)]) ++pr.n_done;
            pr.done[static_cast<size_t>(e.choice)] = std::move(e.result);
            break;
          case engine::JobEvent::Kind::kFailed:
            pr.failed = e.error;
            break;
        }
      }
      if (cancelled) continue;
      if (stopping) {
        pr.cut = CutReason::kShutdown;
        cancelled = true;
        job.handle->cancel();
      } else if (peer_closed(job.client_fd)) {
        pr.cut = CutReason::kClientGone;
        cancelled = true;
        job.handle->cancel();
      }
    }
    // Metrics of what ran.
    const std::string& model = job.meta.model;
    for (size_t i = 0; i < pr.done.size(); ++i) {
      if (!pr.done[i]) continue;
      const engine::GenerationResult& r = *pr.done[i];
      metrics.inc(kCompletionTokens, {{"model", model}}, r.completion_tokens);
      if (i == 0 && r.rate.tokens > 0) metrics.observe(kTtft, {{"model", model}}, r.rate.ttft_ms / 1000.0);
      if (i == 0) metrics.observe(kQueueWait, {{"model", model}}, r.rate.queue_ms / 1000.0);
      for (double gap : r.rate.itl_ms) metrics.observe(kItl, {{"model", model}}, gap / 1000.0);
      if (r.timed_out) metrics.inc(kCancelled, {{"reason", "timeout"}});
    }
    if (pr.failed && pr.failed->code == core::Errc::kCancelled && pr.cut == CutReason::kNone)
      pr.cut = stopping ? CutReason::kShutdown : CutReason::kClientGone;
    bool any_cancelled = pr.failed && pr.failed->code == core::Errc::kCancelled;
    for (const auto& d : pr.done) any_cancelled = any_cancelled || (d && d->finish_reason == engine::FinishReason::kCancelled);
    if (any_cancelled) {
      if (pr.cut == CutReason::kNone) pr.cut = stopping ? CutReason::kShutdown : CutReason::kClientGone;
      metrics.inc(kCancelled, {{"reason", pr.cut == CutReason::kClientGone ? "client_gone" : "shutdown"}});
    }
  }

  // The error for a job that failed before it produced an answer.
  ApiError failure_error(const core::Error& e, CutReason cut) const {
    switch (e.code) {
      case core::Errc::kTimeout:
        return overloaded("The request timed out waiting for an engine replica.", "timeout", 1);
      case core::Errc::kCancelled:
        return cut_error(cut);
      case core::Errc::kResourceExhausted:
        return stopping ? overloaded("The server is shutting down.", "shutting_down", 5)
                        : overloaded("No engine replica became free: " + e.message + ".", "overloaded", 1);
      default:
        return from_core_error(e, 500);
    }
  }

  static ApiError cut_error(CutReason cut) {
    if (cut == CutReason::kClientGone) {
      ApiError e;  // nobody reads it; the status labels the request in /metrics (nginx's 499)
      e.status = 499;
      e.type = "client_closed_request";
      e.message = "The client closed the connection before the answer was ready.";
      return e;
    }
    return overloaded("The server is shutting down.", "shutting_down", 5);
  }

  // finish_reason of a choice: a timed-out one is "length" (the answer so far).
  static std::string finish_name(const engine::GenerationResult& r) {
    return engine::finish_reason_name(r.finish_reason);
  }

  // A non-streamed answer. It stops within one scheduler step when the
  // client hangs up (the socket is checked while the job runs).
  void run_blocking(httplib::Response& res, Job& job) {
    Progress pr;
    pump(job, pr, [](int, std::string_view) { return true; });
    if (pr.failed) return send_error(res, failure_error(*pr.failed, pr.cut));
    std::vector<Choice> choices;
    Usage usage{static_cast<int64_t>(job.prompt.size()), 0};
    usage.cached_tokens = pr.done.empty() || !pr.done.front() ? 0 : pr.done.front()->cached_tokens;
    for (auto& d : pr.done) {
      if (!d || d->finish_reason == engine::FinishReason::kCancelled) return send_error(res, cut_error(pr.cut));
      usage.completion_tokens += d->completion_tokens;
      Choice ch{std::move(d->text), finish_name(*d), {}, {}};
      if (job.meta.endpoint == Endpoint::kChat) {
        engine::ChatOutputParser parser(job.output);
        engine::ChatOutputDelta all = parser.feed(ch.text);
        const engine::ChatOutputDelta rest = parser.finish();
        ch.text = std::move(all.content) + rest.content;
        ch.reasoning = std::move(all.reasoning) + rest.reasoning;
        ch.tool_calls = parser.tool_calls();
        if (!ch.tool_calls.empty() && ch.finish_reason == "stop") ch.finish_reason = "tool_calls";
      }
      choices.push_back(std::move(ch));
    }
    job.handle.reset();
    send_json(res, 200, build_response(job.meta, choices, usage));
  }

  void start_stream(httplib::Response& res, std::shared_ptr<Job> job) {
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream", [this, job](size_t, httplib::DataSink& sink) {
      auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
      // With stream_options.include_usage, OpenAI sends "usage": null on every
      // chunk but the last (the usage chunk); typed clients expect the key.
      auto chunk = [&](json c) {
        if (job->include_usage) c["usage"] = nullptr;
        return write(sse_event(c));
      };
      bool alive = true;
      std::vector<bool> role_sent(static_cast<size_t>(job->n), false);
      auto ensure_role = [&](int i) {
        if (job->meta.endpoint != Endpoint::kChat || role_sent[static_cast<size_t>(i)]) return true;
        role_sent[static_cast<size_t>(i)] = true;
        return chunk(build_role_chunk(job->meta, i));
      };
      if (job->n == 1) alive = ensure_role(0);
      Progress pr;
      std::vector<bool> finished(static_cast<size_t>(job->n), false);
      const bool chat = job->meta.endpoint == Endpoint::kChat;
      std::vector<engine::ChatOutputParser> parsers(static_cast<size_t>(job->n), engine::ChatOutputParser(job->output));
      std::vector<int> n_calls(static_cast<size_t>(job->n), 0);
      // Writes one choice's parsed delta: reasoning, content, completed tool calls.
      auto emit = [&](int i, const engine::ChatOutputDelta& d) {
        if (!d.reasoning.empty()) alive = alive && chunk(build_reasoning_chunk(job->meta, i, d.reasoning));
        if (!d.content.empty()) alive = alive && chunk(build_content_chunk(job->meta, i, d.content));
        for (const auto& call : d.tool_calls) {
          const int k = n_calls[static_cast<size_t>(i)]++;
          alive = alive && chunk(build_tool_call_chunk(job->meta, i, k, call, new_tool_call_id()));
        }
        return alive;
      };
      if (alive) {
        pump(*job, pr, [&](int i, std::string_view text) {
          if (!alive || !sink.is_writable()) return alive = false;
          if (!ensure_role(i)) return alive = false;
          if (!chat) return alive = chunk(build_content_chunk(job->meta, i, text));
          return emit(i, parsers[static_cast<size_t>(i)].feed(text));
        });
      }
      if (alive && pr.failed) {
        // The stream ends with the error event: no usage chunk and no [DONE] after it.
        if (pr.cut != CutReason::kClientGone) write(sse_event(failure_error(*pr.failed, pr.cut).to_json()));
        alive = false;
      }
      Usage usage{static_cast<int64_t>(job->prompt.size()), 0};
      usage.cached_tokens = 0;
      for (int i = 0; i < job->n && alive; ++i) {
        const auto& d = pr.done[static_cast<size_t>(i)];
        if (!d || d->finish_reason == engine::FinishReason::kCancelled) {
          if (pr.cut != CutReason::kClientGone) write(sse_event(cut_error(pr.cut).to_json()));
          alive = false;
          break;
        }
        usage.completion_tokens += d->completion_tokens;
        if (i == 0) usage.cached_tokens = d->cached_tokens;
        std::string finish = finish_name(*d);
        if (chat) {
          auto& parser = parsers[static_cast<size_t>(i)];
          alive = ensure_role(i) && emit(i, parser.finish());
          if (!parser.tool_calls().empty() && finish == "stop") finish = "tool_calls";
        }
        alive = alive && ensure_role(i) && chunk(build_finish_chunk(job->meta, i, finish));
      }
      job->handle.reset();
      if (alive) {
        if (job->include_usage) alive = write(sse_event(build_usage_chunk(job->meta, usage)));
        if (alive) write(std::string(kSseDone));
      }
      sink.done();
      return true;
    });
  }

  // Shuts down the reading side of every connection with no request in
  // flight (stop(), after the listener is closed). httplib 0.11 waits for an
  // idle keep-alive connection's next request for the whole keep-alive
  // timeout (5 s) without looking at the listener, and run() joins every
  // connection thread, so one idle client (any HTTP client that pools
  // connections) held shutdown for 5 s. After SHUT_RD the waiting thread
  // reads end-of-file at once and closes the connection (the peer gets a
  // FIN, as for any keep-alive timeout). Connections with a request in
  // flight are left alone: their generation is cancelled by `stopping`, and
  // they finish writing their answer (the shutdown error) and then close,
  // since httplib does not wait for another request once the listener is
  // closed. Returns the number of connections shut down.
  int close_idle_connections() {
    if (bound_port < 0) return 0;
    int closed = 0;
    std::lock_guard lock(conn_mu);
    for_each_connection(bound_port, [&](int fd, const std::string& host, int port) {
      if (!busy_peers.contains({host, port}) && ::shutdown(fd, SHUT_RD) == 0) ++closed;
      return true;
    });
    return closed;
  }

  // ---- models, health, metrics, admin -------------------------------------

  // Models a request may name: registered ones (loadable on demand) and
  // resident ones; a failed load of an unregistered id is not one (it is
  // listed, with its reason, by GET /admin/models only).
  std::vector<std::string> all_model_ids() const {
    std::set<std::string> ids;
    for (const auto& id : models->registered_ids()) ids.insert(id);
    for (const auto& m : models->list())
      if (m.state != engine::ModelState::kFailed) ids.insert(m.id);
    return {ids.begin(), ids.end()};
  }

  int64_t created_of(const std::string& id) const {
    for (const auto& m : models->list())
      if (m.id == id && m.created_unix > 0) return static_cast<int64_t>(m.created_unix);
    return started_unix;
  }

  void handle_models(httplib::Response& res) {
    json data = json::array();
    for (const auto& id : all_model_ids()) data.push_back(model_object(id, created_of(id)));
    send_json(res, 200, json{{"object", "list"}, {"data", data}});
  }

  void handle_model(const std::string& id, httplib::Response& res) {
    auto ids = all_model_ids();
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
      ApiError e;
      e.status = 404;
      e.message = "The model '" + id + "' does not exist";
      e.param = "model";
      e.code = "model_not_found";
      return send_error(res, e);
    }
    send_json(res, 200, model_object(id, created_of(id)));
  }

  // The model rows of /admin/models and /health. `with_files`: include each
  // model's file path and failure reason (they name server paths and file
  // contents; /health is not behind --api-key, so it omits them when a key is set).
  json models_json(bool with_files = true) const {
    json arr = json::array();
    for (const auto& m : models->list()) {
      json j{{"id", m.id},         {"state", engine::model_state_name(m.state)},
             {"in_flight", m.in_flight}, {"mem_bytes", m.mem_bytes}, {"pool_size", m.pool_size},
             {"busy", m.busy}};
      if (with_files) j["path"] = m.path;
      if (with_files && m.state == engine::ModelState::kFailed) j["reason"] = m.reason;
      arr.push_back(std::move(j));
    }
    return arr;
  }

  void handle_health(httplib::Response& res) {
    const size_t loaded = models->loaded_count();
    json body{{"status", loaded > 0 && !stopping ? "ok" : (stopping ? "shutting_down" : "unavailable")},
              {"models_loaded", loaded},
              {"models", models_json(/*with_files=*/opt.api_key.empty())}};
    if (loaded == 0) {
      for (const auto& m : models->list())
        if (m.state == engine::ModelState::kLoading) body["status"] = "loading";
    }
    send_json(res, loaded > 0 && !stopping ? 200 : 503, body);
  }

  void refresh_gauges() {
    auto rows = models->list();
    for (const char* g : {kPoolSize, kPoolBusy, kModelBytes, kWaiting, kEngineItlP50, kEngineItlP95, kEngineTps,
                          kRunning, kKvUsage, kVllmRunning, kVllmWaiting, kVllmKvUsage})
      metrics.clear(g);
    size_t loaded = 0;
    for (const auto& m : rows) {
      if (m.state != engine::ModelState::kLoaded) continue;
      ++loaded;
      metrics.set(kPoolSize, {{"model", m.id}}, m.pool_size);
      metrics.set(kPoolBusy, {{"model", m.id}}, m.busy);
      metrics.set(kModelBytes, {{"model", m.id}}, static_cast<double>(m.mem_bytes));
      if (auto lm = models->peek(m.id); lm && lm->rates) {
        const engine::RequestRateStats st = lm->rates->snapshot();
        metrics.set(kEngineItlP50, {{"model", m.id}}, st.itl_p50_ms / 1000.0);
        metrics.set(kEngineItlP95, {{"model", m.id}}, st.itl_p95_ms / 1000.0);
        metrics.set(kEngineTps, {{"model", m.id}}, st.tokens_per_s_mean);
      }
      if (auto lm = models->peek(m.id); lm && lm->scheduler) {
        const engine::SchedulerStats ss = lm->scheduler->stats();
        const Labels l{{"model", m.id}};
        const double kv = ss.kv_capacity > 0 ? static_cast<double>(ss.kv_used) / static_cast<double>(ss.kv_capacity) : 0;
        metrics.set(kRunning, l, static_cast<double>(ss.running));
        metrics.set(kWaiting, l, static_cast<double>(ss.waiting));
        metrics.set(kKvUsage, l, kv);
        metrics.set(kVllmRunning, {{"model_name", m.id}}, static_cast<double>(ss.running));
        metrics.set(kVllmWaiting, {{"model_name", m.id}}, static_cast<double>(ss.waiting));
        metrics.set(kVllmKvUsage, {{"model_name", m.id}}, kv);
        metrics.set(kCacheHits, l, static_cast<double>(ss.cache_hits));
        metrics.set(kCachedTokens, l, static_cast<double>(ss.cached_tokens));
        metrics.set(kComputedPrompt, l, static_cast<double>(ss.prompt_tokens));
        metrics.set_histogram(kStepTokens, l, ss.step_hist, static_cast<double>(ss.step_tokens));
      }
    }
    metrics.set(kModelsLoaded, {}, static_cast<double>(loaded));
    metrics.set(kMemoryBytes, {}, static_cast<double>(models->current_mem_bytes()));
    metrics.set(kBudgetBytes, {}, static_cast<double>(models->mem_budget_bytes()));
  }

  void handle_admin_list(httplib::Response& res) {
    send_json(res, 200, json{{"object", "list"},
                             {"data", models_json()},
                             {"capacity", models->capacity()},
                             {"mem_budget_bytes", models->mem_budget_bytes()},
                             {"mem_bytes", models->current_mem_bytes()}});
  }

  static std::optional<ApiError> parse_admin_body(const std::string& body_text, json& body) {
    if (json_nesting_exceeds(body_text, kMaxJsonDepth))
      return bad_request("The request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels.", {},
                         "invalid_json");
    body = json::parse(body_text, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return bad_request("The request body must be a JSON object.", {}, "invalid_json");
    auto id = body.find("id");
    if (id == body.end() || !id->is_string() || id->get<std::string>().empty())
      return bad_request("Missing required parameter: 'id' (a non-empty string).", "id", "missing_required_parameter");
    // Ids end up in /v1/models, /metrics labels and logs: keep them bounded.
    if (id->get_ref<const std::string&>().size() > kMaxModelIdBytes)
      return bad_request("Invalid 'id': longer than " + std::to_string(kMaxModelIdBytes) + " bytes.", "id",
                         "invalid_value");
    return std::nullopt;
  }

  void handle_admin_load(const std::string& body_text, httplib::Response& res) {
    json body;
    if (auto e = parse_admin_body(body_text, body)) return send_error(res, *e);
    const std::string id = body["id"].get<std::string>();
    // With a path: the server's defaults for that file; without: the id's
    // registration. Either way pool_size / ctx_size / q2_layout in the body override.
    engine::ModelSpec spec = opt.default_spec;
    auto path = body.find("path");
    if (path != body.end()) {
      if (!path->is_string()) return send_error(res, bad_request("Invalid type for 'path': expected a string.", "path", "invalid_type"));
      spec.path = path->get<std::string>();
    } else if (auto reg = models->registration(id)) {
      spec = *reg;
    } else {
      return send_error(res, bad_request("Missing required parameter: 'path' (model '" + id + "' is not registered).",
                                         "path", "missing_required_parameter"));
    }
    for (const char* f : {"pool_size", "ctx_size"}) {
      const int64_t max = std::string(f) == "pool_size" ? kMaxAdminPoolSize : 1'000'000;
      auto it = body.find(f);
      if (it == body.end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > max)
        return send_error(res, bad_request(std::string("Invalid '") + f + "': expected an integer in [0, " +
                                               std::to_string(max) + "].",
                                           f, "invalid_value"));
      (std::string(f) == "pool_size" ? spec.pool_size : spec.ctx_size) = static_cast<int>(it->get<int64_t>());
    }
    // q2_layout: force the type-42 layout (as `bonsai serve --q2-layout`);
    // absent or null keeps the registration's (a new path: detected).
    if (auto it = body.find("q2_layout"); it != body.end() && !it->is_null()) {
      if (!it->is_string())
        return send_error(res, bad_request("Invalid type for 'q2_layout': expected a string.", "q2_layout", "invalid_type"));
      const std::string name = it->get<std::string>();
      spec.q2_layout = core::parse_q2_layout(name);
      if (!spec.q2_layout)
        return send_error(res, bad_request("Invalid 'q2_layout': unknown Q2_0 layout '" + name +
                                               "' (expected g64, g128-d-first or g128-qs-first).",
                                           "q2_layout", "invalid_value"));
    }
    std::error_code ec;
    if (path != body.end() && !std::filesystem::is_regular_file(spec.path, ec))
      return send_error(res, bad_request("Invalid 'path': " + spec.path + " is not a readable file.", "path", "invalid_value"));
    auto given = [&](const char* f) { return body.contains(f) && !body[f].is_null(); };
    if (auto e = check_load_fits(id, spec, given("ctx_size"), given("pool_size"))) return send_error(res, *e);
    // Registers and loads as one step: a refused or failed load leaves the
    // id's previous registration (the file a served model reloads from) alone.
    core::Expected<void> r = models->load_in_background(id, spec);
    if (!r) {
      ApiError e = from_core_error(r.error());
      switch (r.error().code) {
        case core::Errc::kInvalidArgument:  // the id is loading or loaded
          e.status = 409;
          e.code = "conflict";
          break;
        case core::Errc::kFormat:       // not a GGUF file, truncated, tensor past the end...
        case core::Errc::kUnsupported:  // an architecture or tensor type this runtime does not run
        case core::Errc::kIo:           // unreadable
        case core::Errc::kNotFound:     // a required key or tensor is missing (not a 404 route)
          e.status = 400;
          e.param = "path";
          e.code = "invalid_value";
          break;
        default:
          break;
      }
      return send_error(res, e);
    }
    send_json(res, 202, json{{"id", id}, {"state", "loading"}});
  }

  // Refuses an admin load before anything is allocated when its explicit
  // ctx_size is beyond what the model supports (model_footprint's max_ctx:
  // the training context x the RoPE scaling factor), or when the KV caches
  // it implies (n_layer x 2 x n_head_kv x head_dim x ctx x 2 bytes (F16) x
  // replicas) do not fit: with a pool budget, mapping + KV caches must fit
  // the budget (ModelPool would otherwise refuse the model only later, as a
  // 503 that retrying never cures); without one, the KV caches must fit
  // opt.admin_mem_limit_bytes or else MemAvailable. The caches are allocated
  // lazily (pages committed as the context fills), so an oversized one
  // would not fail at load but kill the process later, mid-request.
  // ctx_size 0 stays allowed: it means the model's default context
  // (min(context_length, 4096)), as `bonsai serve -c 0` and llama.cpp's -c 0.
  // A file whose header cannot be read is left to the loader's own error.
  std::optional<ApiError> check_load_fits(const std::string& id, const engine::ModelSpec& spec, bool ctx_given,
                                          bool pool_given) const {
    gguf::OpenOptions open;
    open.q2_layout = spec.q2_layout;
    auto fp = engine::model_footprint(spec.path, spec.ctx_size, spec.pool_size, open);
    if (!fp) return std::nullopt;
    if (ctx_given && spec.ctx_size > 0 && fp->max_ctx > 0 && spec.ctx_size > fp->max_ctx) {
      char factor[32];
      std::snprintf(factor, sizeof factor, "%g", static_cast<double>(fp->rope_scaling_factor));
      return bad_request("Invalid 'ctx_size': " + std::to_string(spec.ctx_size) + " tokens is more than model '" + id +
                             "' supports: at most " + std::to_string(fp->max_ctx) + " (training context " +
                             std::to_string(fp->n_ctx_train) + " x RoPE scaling factor " + factor + ").",
                         "ctx_size", "invalid_value");
    }
    const uint64_t budget = models->mem_budget_bytes();
    const uint64_t limit = budget > 0 ? budget : opt.admin_mem_limit_bytes > 0 ? opt.admin_mem_limit_bytes
                                                                                : available_memory_bytes();
    if (limit == 0) return std::nullopt;  // /proc/meminfo unreadable: nothing to compare with
    const uint64_t need = budget > 0 ? fp->total_bytes() : fp->kv_bytes;
    if (need <= limit) return std::nullopt;
    // The context per replica that would fit (0 if not even the mapping does).
    const uint64_t room = budget > 0 ? (limit > fp->mapped_bytes ? limit - fp->mapped_bytes : 0) : limit;
    const uint64_t per_ctx = fp->kv_bytes_per_position * static_cast<uint64_t>(fp->replicas);
    const uint64_t fit_ctx = per_ctx > 0 ? room / per_ctx : 0;
    std::string msg = "Model '" + id + "' with ctx_size " + std::to_string(fp->n_ctx) + " and " +
                      std::to_string(fp->replicas) + " replica(s) needs " + size_text(fp->kv_bytes) +
                      " of KV cache (" + std::to_string(fp->kv_bytes_per_position) + " bytes per position x " +
                      std::to_string(fp->n_ctx) + " positions x " + std::to_string(fp->replicas) + " replicas)";
    if (budget > 0) {
      msg += " plus " + size_text(fp->mapped_bytes) + " of mapped weights = " + size_text(need) +
             ", more than the memory budget (--mem-budget) of " + size_text(limit) + ".";
    } else {
      msg += ", more than the " + size_text(limit) +
             (opt.admin_mem_limit_bytes > 0 ? " allowed for one load." : " of memory available (MemAvailable).");
    }
    msg += fit_ctx > 0 ? " At most ctx_size " + std::to_string(fit_ctx) + " fits with " +
                             std::to_string(fp->replicas) + " replica(s)."
                       : " It does not fit at any ctx_size.";
    return bad_request(std::move(msg), ctx_given ? "ctx_size" : pool_given ? "pool_size" : "", "insufficient_memory");
  }

  void handle_admin_unload(const std::string& body_text, httplib::Response& res) {
    json body;
    if (auto e = parse_admin_body(body_text, body)) return send_error(res, *e);
    const std::string id = body["id"].get<std::string>();
    auto r = models->unload(id);
    if (!r) {
      ApiError e = from_core_error(r.error());
      if (r.error().code == core::Errc::kNotFound) e.code = "model_not_loaded";
      if (r.error().code == core::Errc::kInvalidArgument) {
        e.status = 409;
        e.code = "conflict";
      }
      return send_error(res, e);
    }
    send_json(res, 200, json{{"id", id}, {"state", "unloaded"}});
  }
};

uint64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t bytes = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long kib = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      bytes = static_cast<uint64_t>(kib) * 1024u;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

Server::Server(std::shared_ptr<engine::ModelPool> models, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(models), std::move(options))) {}

Server::~Server() { stop(); }

core::Expected<int> Server::bind() {
  auto& o = impl_->opt;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) return core::fail(core::Errc::kIo, "cannot listen on " + o.host + " (any port)");
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    return core::fail(core::Errc::kIo, "cannot listen on " + o.host + ":" + std::to_string(port) +
                                           " (address in use, or not a local address)");
  }
  // httplib 0.11 listens with a backlog of 5 (compiled into the library):
  // bursts of connections then waited a 1 s SYN retry. Linux lets listen(2)
  // be called again on a listening socket to change its backlog (capped by
  // net.core.somaxconn).
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, kListenBacklog);
  impl_->bound_port = port;
  return port;
}

// httplib 0.11's stop() does nothing until listen_after_bind() has marked
// the listener running, so a stop() that came first (SIGTERM while `bonsai
// serve` was still starting) was lost and run() then served forever. run()
// announces itself before it checks `stopping` and stop() sets `stopping`
// before it checks run_entered (both sequentially consistent), so either
// run() sees the stop and returns at once, or stop() sees run() starting
// and waits (at most ~5 s) until httplib is listening to stop it.
void Server::run() {
  impl_->run_entered = true;
  if (!impl_->stopping) impl_->http.listen_after_bind();
  impl_->run_returned = true;
}

void Server::stop() {
  if (!impl_) return;
  impl_->stopping = true;
  impl_->models->close_all();
  if (impl_->run_entered) {
    for (int i = 0; i < 5000 && !impl_->http.is_running() && !impl_->run_returned; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->http.stop();
  impl_->close_idle_connections();
}

MetricsRegistry& Server::metrics() { return impl_->metrics; }

}  // namespace bonsai::server
