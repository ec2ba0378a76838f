// HTTP/1.1 transport on Boost.Beast/Asio: see transport.h.
//
// Threads: `io_threads` run one io_context; every connection's handlers run
// on its own strand, so a Connection's members are touched by one thread at
// a time without a mutex. Handlers run on a net::thread_pool of
// `worker_threads`. An Exchange (the handler's side) talks to its
// Connection only by posting onto that strand.
//
// A connection's life: read header (timeout header/idle) -> limits ->
// [100 Continue] -> read body (timeout body) -> dispatch, and, while the
// answer is being produced and written, one read stays pending on the
// socket to see the peer leave (disconnect watch) -> next request or close.
#include "server/transport.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace bonsai::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr int kMinBacklog = 512;
constexpr size_t kWatchChunk = 4096;         // bytes per disconnect-watch read
constexpr size_t kMaxPipelined = 64u << 10;  // buffered next-request bytes while answering
constexpr size_t kLingerBytes = 8u << 20;    // discarded after an error answer, at most
constexpr auto kLingerTime = std::chrono::seconds(2);

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(s, 0.001)));
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The path of a request target: an absolute-form target ("http://host:port/p",
// RFC 9112 section 3.2.2, which a server MUST accept) without its scheme and
// authority ("/p"; "/" when it has no path); any other form as it is.
std::string_view origin_path(std::string_view target) {
  for (std::string_view scheme : {std::string_view("http://"), std::string_view("https://")}) {
    if (target.size() < scheme.size() || !iequals(target.substr(0, scheme.size()), scheme)) continue;
    const size_t slash = target.find('/', scheme.size());
    return slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  return target;
}

// %XX decoded; malformed escapes are kept as they are.
std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

std::string reason_of(int status) {
  const auto r = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return r.empty() || r == "<unknown-status>" ? std::string("Status") : std::string(r);
}

// Status line and headers of a response, up to and including the blank line.
std::string head_of(int status, const std::string& content_type,
                    const std::vector<std::pair<std::string, std::string>>& headers, bool keep_alive,
                    std::optional<size_t> content_length, const std::string& keep_alive_hint = {}) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason_of(status) + "\r\n";
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  for (const auto& [k, v] : headers) {
    // Header injection guard: a value with CR/LF is dropped.
    if (k.find_first_of("\r\n:") != std::string::npos || v.find_first_of("\r\n") != std::string::npos) continue;
    h += k + ": " + v + "\r\n";
  }
  if (content_length) {
    h += "Content-Length: " + std::to_string(*content_length) + "\r\n";
  } else {
    h += "Transfer-Encoding: chunked\r\n";
  }
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  if (!keep_alive_hint.empty()) h += "Keep-Alive: " + keep_alive_hint + "\r\n";
  h += "\r\n";
  return h;
}

HttpResponse default_error_body(int status, const std::string& message, const std::string& /*path*/) {
  HttpResponse r;
  r.status = status;
  r.body = message + "\n";
  return r;
}

// The request's Content-Encoding when it names a coding other than
// identity (lower-cased, whitespace trimmed; a list such as "gzip, br" as
// sent), else "".
std::string content_coding(const HttpRequest& req) {
  std::string v = req.header("Content-Encoding");
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t b = v.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  v = v.substr(b, v.find_last_not_of(" \t") + 1 - b);
  return v == "identity" ? std::string() : v;
}

}  // namespace

// ---- shared state -------------------------------------------------------------------

struct RouteEntry {
  std::string method;
  std::string path;  // without the trailing '*' for prefix routes
  bool prefix = false;
  Handler handler;
  Dispatch dispatch = Dispatch::kWorker;
};

// Everything the Transport's connections share. Members above `ioc` outlive
// it (destroyed after it), so handlers destroyed with the io_context may
// still unregister their connection.
struct TransportCore {
  TransportOptions opt;
  std::vector<RouteEntry> routes;  // set before run(), read-only after
  Handler not_found;
  HttpTransport::PreRouter pre_route;
  HttpTransport::HeaderDecorator decorate;
  ErrorBody error_body = default_error_body;
  RequestLogger logger;

  std::atomic<bool> stopping{false};
  std::atomic<bool> dead{false};  // the Transport is being destroyed: exchanges stop posting
  std::atomic<int64_t> n_conns{0};
  std::atomic<int64_t> n_rejecting{0};  // 503 answers being written
  std::atomic<uint64_t> n_refused{0};
  std::mutex conns_mu;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns;  // guarded by conns_mu
  SteadyClock::time_point stop_at{};

  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;
  tcp::acceptor acceptor{net::make_strand(ioc)};
  std::optional<net::steady_timer> stop_timer;  // acceptor's strand
  net::thread_pool workers;
  bool bound = false;

  explicit TransportCore(TransportOptions o)
      : opt(std::move(o)),
        ioc(std::max(1, opt.io_threads)),
        workers(static_cast<size_t>(std::max(1, opt.worker_threads))) {
    guard.emplace(ioc.get_executor());
  }
  ~TransportCore() {
    dead = true;
    workers.join();
  }

  // The route of `method` on `path` (see HttpTransport::route); a HEAD
  // request takes the GET route when the path has no HEAD route (RFC 9110
  // section 9.3.2: HEAD is GET without the body, which the connection drops).
  const RouteEntry* find_route(const std::string& method, const std::string& path) const {
    const RouteEntry* r = find_route_exact(method, path);
    if ((r == nullptr || r->prefix) && method == "HEAD") {  // an exact GET route beats a HEAD prefix route
      const RouteEntry* g = find_route_exact("GET", path);
      if (r == nullptr || (g != nullptr && !g->prefix)) r = g;
    }
    return r;
  }

  // The methods some route serves `path` with, in registration order, HEAD
  // added after GET (the Allow header of a 405; RFC 9110 section 15.5.6).
  // Empty: no route has the path under any method (a 404). `exact_only`:
  // only the routes that name `path` itself (no prefix route).
  std::vector<std::string> allowed_methods(const std::string& path, bool exact_only = false) const {
    std::vector<std::string> out;
    auto add = [&out](const std::string& m) {
      if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
    };
    for (const auto& r : routes) {
      if (exact_only ? (r.prefix || r.path != path) : find_route_exact(r.method, path) == nullptr) continue;
      add(r.method);
      if (r.method == "GET") add("HEAD");
    }
    return out;
  }

  const RouteEntry* find_route_exact(const std::string& method, const std::string& path) const {
    const RouteEntry* best = nullptr;
    for (const auto& r : routes) {
      if (r.method != method) continue;
      if (!r.prefix) {
        if (r.path == path) return &r;
      } else if (path.size() > r.path.size() && path.compare(0, r.path.size(), r.path) == 0) {
        if (!best || r.path.size() > best->path.size()) best = &r;
      }
    }
    return best;
  }

  std::vector<std::shared_ptr<Connection>> snapshot() {
    std::vector<std::shared_ptr<Connection>> out;
    std::lock_guard lock(conns_mu);
    for (auto& [p, w] : conns)
      if (auto c = w.lock()) out.push_back(std::move(c));
    return out;
  }

  void do_accept();
  void on_accept(beast::error_code ec, tcp::socket socket);
  void reject(tcp::socket socket);
  void stop();
  void watch_stop();
};

// ---- one connection -------------------------------------------------------------------

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(TransportCore* core, tcp::socket socket)
      : core_(core), stream_(std::move(socket)), buffer_(core->opt.max_header_bytes + (16u << 10)) {
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) {
      remote_addr_ = ep.address().to_string();
      remote_port_ = ep.port();
    }
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }
  ~Connection() {
    {
      std::lock_guard lock(core_->conns_mu);
      core_->conns.erase(this);
    }
    core_->n_conns.fetch_sub(1);
  }

  void start() {
    {
      std::lock_guard lock(core_->conns_mu);
      core_->conns[this] = weak_from_this();
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }

  // Posts `fn` onto this connection's strand.
  template <class F>
  void post(F&& fn) {
    if (core_->dead) return;
    net::post(stream_.get_executor(), std::forward<F>(fn));
  }

  // ---- called on the strand (through post) by Exchange and the core ----

  void deliver(HttpResponse r) {
    if (phase_ == Phase::kClosed) return;
    const bool ka = keep_alive_now();
    std::string data = head_of(r.status, r.content_type, r.headers, ka, r.body.size(), ka ? keep_alive_hint() : "");
    if (head_only_) r.body.clear();
    data += r.body;
    queue(std::move(data), 0, true);
  }
  void stream_head(int status, const std::string& content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers) {
    if (phase_ == Phase::kClosed) return;
    const bool ka = keep_alive_now();
    queue(head_of(status, content_type, headers, ka, std::nullopt, ka ? keep_alive_hint() : ""), 0, false);
  }
  void stream_chunk(std::string data, size_t counted) {
    if (phase_ == Phase::kClosed) return wrote_counted(counted);
    char size_line[32];
    const int n = std::snprintf(size_line, sizeof size_line, "%zx\r\n", data.size());
    std::string framed(size_line, static_cast<size_t>(n));
    framed += data;
    framed += "\r\n";
    queue(std::move(framed), counted, false);
  }
  void stream_end() {
    if (phase_ == Phase::kClosed) return;
    queue("0\r\n\r\n", 0, true);
  }
  // stop(): an idle connection (waiting for, or partly through, a request
  // header) is closed now; a busy one closes after its answer.
  void on_stop() {
    keep_alive_ = false;
    if (phase_ == Phase::kReadHeader) close();
  }
  void force_close() { close(); }
  // The request logger, if any (any thread).
  void log(const HttpRequest& req, int status) const {
    if (core_->logger) core_->logger(req, status);
  }
  // The decorator's headers for the answer to `req` (see set_header_decorator).
  void decorate(const HttpRequest& req, std::vector<std::pair<std::string, std::string>>& headers) const {
    if (core_->decorate) core_->decorate(req, headers);
  }

 private:
  enum class Phase { kReadHeader, kReadBody, kHandling, kAwaitNext, kClosing, kClosed };

  // "timeout=<idle s>, max=<requests left>" (the Keep-Alive header, informational).
  std::string keep_alive_hint() const {
    const int idle = static_cast<int>(core_->opt.idle_timeout_s + 0.5);
    return "timeout=" + std::to_string(std::max(idle, 1)) +
           ", max=" + std::to_string(std::max(0, core_->opt.max_requests_per_connection - served_));
  }

  bool keep_alive_now() const {
    return keep_alive_ && !core_->stopping && served_ < core_->opt.max_requests_per_connection;
  }

  void read_header() {
    if (phase_ == Phase::kClosed) return;
    if (core_->stopping) return close();
    phase_ = Phase::kReadHeader;
    head_only_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<size_t>(core_->opt.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(core_->opt.max_body_bytes);
    // The first request has the header timeout; a keep-alive wait the idle
    // timeout plus, once bytes come, the header timeout.
    double t = core_->opt.header_timeout_s;
    if (served_ > 0 && buffer_.size() == 0) t += core_->opt.idle_timeout_s;
    stream_.expires_after(seconds(t));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec) return read_failed(ec);
    const auto& req = parser_->get();
    size_t fields = 0;
    for (auto it = req.begin(); it != req.end(); ++it) ++fields;
    if (fields > core_->opt.max_header_fields)
      return fail(431, "Too many header fields (" + std::to_string(fields) + "; the limit is " +
                           std::to_string(core_->opt.max_header_fields) + ").");
    if (!req.keep_alive()) keep_alive_ = false;
    // Only "chunked" is understood; any other coding (gzip, "chunked, x")
    // would be read as something it is not.
    const auto te = req[http::field::transfer_encoding];
    if (!te.empty() && !iequals(std::string_view(te.data(), te.size()), "chunked"))
      return fail(400, "Unsupported Transfer-Encoding (only chunked is accepted).");
    head_only_ = req.method() == http::verb::head;
    if (parser_->is_done()) return dispatch();
    // A body follows. 100-continue: ask for it now that the header passed.
    const auto expect = req[http::field::expect];
    if (!expect.empty()) {
      if (!iequals(std::string_view(expect.data(), expect.size()), "100-continue"))
        return fail(417, "Unsupported Expect header (only 100-continue).");
      continue_msg_ = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(seconds(core_->opt.write_timeout_s));
      return net::async_write(stream_, net::buffer(continue_msg_),
                              [self = shared_from_this()](beast::error_code wec, size_t) {
                                if (wec) return self->close();
                                self->read_body();
                              });
    }
    read_body();
  }

  void read_body() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kReadBody;
    stream_.expires_after(seconds(core_->opt.body_timeout_s));
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (self->phase_ == Phase::kClosed) return;
      if (ec) return self->read_failed(ec);
      self->dispatch();
    });
  }

  // A read ended in an error: answer the ones that are the client's fault
  // (the connection then closes), drop the rest.
  void read_failed(beast::error_code ec) {
    const bool in_body = phase_ == Phase::kReadBody;
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset || ec == net::error::eof || ec == net::error::broken_pipe ||
        ec == net::error::bad_descriptor)
      return close();
    if (ec == http::error::partial_message) {
      // The peer half-closed mid-request: say so, it may still read.
      return fail(400,
                  in_body ? "The request body ended before its Content-Length." : "The request header was cut short.");
    }
    if (ec == http::error::buffer_overflow && in_body)
      return fail(400, "A chunk header (size line or extensions) is too long.");
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow)
      return fail(431, "The request header is larger than " + std::to_string(core_->opt.max_header_bytes) + " bytes.");
    if (ec == http::error::body_limit)
      return fail(
          413, "The request body is larger than the limit of " + std::to_string(core_->opt.max_body_bytes) + " bytes.");
    if (ec == http::error::bad_content_length)
      return fail(400, "Content-Length is not a non-negative decimal number (or is given twice).");
    if (ec == http::error::bad_transfer_encoding)
      return fail(400, "Unsupported Transfer-Encoding (only chunked is accepted).");
    if (ec == http::error::bad_chunk || ec == http::error::bad_chunk_extension)
      return fail(400, "Malformed chunked encoding.");
    if (ec == http::error::bad_version) {
      // Beast reports a request line that does not end in CRLF as a bad
      // version too: only a well-formed HTTP/d.d of another major is a 505.
      const std::string_view head(static_cast<const char*>(buffer_.data().data()), buffer_.size());
      const std::string_view line = head.substr(0, head.find('\n'));
      const size_t v = line.rfind(' ');
      const std::string_view version = v == std::string_view::npos ? line : line.substr(v + 1);
      const bool well_formed = version.size() == 9 && version.substr(0, 5) == "HTTP/" && version[8] == '\r' &&
                               std::isdigit(static_cast<unsigned char>(version[5])) && version[6] == '.' &&
                               std::isdigit(static_cast<unsigned char>(version[7]));
      if (well_formed) return fail(505, "HTTP version not supported (only HTTP/1.0 and HTTP/1.1).");
      if (line.size() < head.size() && (line.empty() || line.back() != '\r'))
        return fail(400, "Malformed request: header lines must end in CRLF (RFC 9112 section 2.2).");
      return fail(400, "Malformed request line (expected METHOD TARGET HTTP/1.1, RFC 9112 section 3).");
    }
    return fail(400, "Malformed request (" + ec.message() + ").");
  }

  // Answers an error and closes (after a bounded linger so the client sees it).
  void fail(int status, const std::string& message) {
    keep_alive_ = false;
    phase_ = Phase::kClosing;
    const std::string path = failed_request_path();
    HttpResponse r =
        core_->error_body ? core_->error_body(status, message, path) : default_error_body(status, message, path);
    r.status = status;
    std::string data = head_of(status, r.content_type, r.headers, false, r.body.size()) + r.body;
    out_.push_back({std::move(data), 0});
    out_last_ = true;
    if (core_->logger && parser_ && parser_->is_header_done()) {
      HttpRequest req = make_request(false);
      core_->logger(req, status);
    }
    if (!writing_) do_write();
  }

  // The path of the request a read failed on: from the parsed request line,
  // or (a header too large to parse, cut short) from the one at the front of
  // the bytes read, "METHOD SP TARGET SP ..."; "" when even that
  // line is not there.
  std::string failed_request_path() {
    // The request line is parsed before the fields and the limits checked
    // after them (a Content-Length above the body limit): the target is there.
    if (parser_ && (parser_->is_header_done() || !parser_->get().target().empty())) return make_request(false).path;
    const auto data = buffer_.data();
    const std::string_view bytes(static_cast<const char*>(data.data()), data.size());
    const std::string_view line = bytes.substr(0, bytes.find_first_of("\r\n"));
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == line.size() - 1) return {};
    const size_t end = line.find(' ', sp + 1);
    if (end == std::string_view::npos) return {};  // the target may go on: not known whole
    const std::string_view target = line.substr(sp + 1, end - sp - 1);
    return percent_decode(target.substr(0, target.find('?')));
  }

  HttpRequest make_request(bool take_body) {
    HttpRequest out;
    auto& req = parser_->get();
    out.method = std::string(req.method_string());
    out.target = std::string(req.target());
    const size_t q = out.target.find('?');
    out.path = percent_decode(origin_path(std::string_view(out.target).substr(0, q)));
    if (q != std::string::npos) out.query = out.target.substr(q + 1);
    for (const auto& f : req) out.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    if (take_body) out.body = std::move(req.body());
    out.remote_addr = remote_addr_;
    out.remote_port = remote_port_;
    return out;
  }

  void dispatch() {
    phase_ = Phase::kHandling;
    ++served_;
    auto ex = std::make_shared<Exchange>(shared_from_this(), make_request(true), core_->opt.stream_high_water_bytes);
    parser_.reset();
    ex_ = ex;
    stream_.expires_at(SteadyClock::time_point::max());
    start_watch();
    const HttpRequest& req = ex->request();
    if (core_->pre_route) {
      HttpResponse res;
      if (core_->pre_route(req, res)) return ex->respond(std::move(res));
    }
    const RouteEntry* route = core_->find_route(req.method, req.path);
    // A catch-all ("/api/*") does not hide a path that a route names exactly
    // under other methods: that is still a 405.
    const bool named = !core_->allowed_methods(req.path, /*exact_only=*/true).empty();
    if (route != nullptr && route->prefix && named) route = nullptr;
    if (route == nullptr) {
      // The path is served, but not with this method: 405 and the methods it has.
      const std::vector<std::string> allowed = core_->allowed_methods(req.path, named);
      if (!allowed.empty()) {
        std::string list;
        for (const auto& m : allowed) list += (list.empty() ? "" : ", ") + m;
        HttpResponse r = core_->error_body(
            405, "Method " + req.method + " is not allowed on " + req.path + " (allowed: " + list + ").", req.path);
        r.status = 405;
        r.set_header("Allow", list);
        return ex->respond(std::move(r));
      }
    } else if (const std::string coding = content_coding(req); !coding.empty() && !req.body.empty()) {
      // RFC 9110 section 15.5.16 / RFC 7694: a body in a content coding the
      // server does not decode is a 415 naming the codings it accepts.
      HttpResponse r = core_->error_body(415,
                                         "Content-Encoding '" + coding +
                                             "' is not supported: send the request body uncompressed "
                                             "(Content-Encoding identity, or no Content-Encoding header).",
                                         req.path);
      r.status = 415;
      r.set_header("Accept-Encoding", "identity");
      return ex->respond(std::move(r));
    }
    Handler h = route ? route->handler : core_->not_found;
    if (!h) {
      HttpResponse r = core_->error_body(404, "Unknown request URL: " + req.method + " " + req.path + ".", req.path);
      r.status = 404;
      ex->respond(std::move(r));
      return;
    }
    auto run = [ex, handler = route ? &route->handler : &core_->not_found, core = core_] {
      std::string what;
      try {
        (*handler)(ex);
        return;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
        what = "unknown exception";
      }
      HttpResponse r = core->error_body(500, "Internal error: " + what + ".", ex->request().path);
      r.status = 500;
      ex->respond(std::move(r));
    };
    if (route && route->dispatch == Dispatch::kInline)
      run();
    else
      net::post(core_->workers, std::move(run));
  }

  // One read kept pending while the answer is produced: EOF or an error
  // means the peer left. Bytes that arrive (a pipelined next request) are
  // kept, up to kMaxPipelined.
  void start_watch() {
    if (watching_ || phase_ != Phase::kHandling) return;
    if (buffer_.size() + kWatchChunk > std::min(buffer_.max_size(), kMaxPipelined)) return;
    watching_ = true;
    stream_.expires_at(SteadyClock::time_point::max());
    stream_.async_read_some(buffer_.prepare(kWatchChunk),
                            [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (n > 0) buffer_.commit(n);
    if (phase_ == Phase::kClosed) return;
    if (phase_ == Phase::kAwaitNext) return next_request();
    if (phase_ == Phase::kClosing) return linger_read();
    if (ec && ec != net::error::operation_aborted) {
      // The peer closed or reset the connection while its answer was pending.
      peer_gone();
      if (!writing_) close();
      return;
    }
    if (!ec) start_watch();
  }

  void peer_gone() {
    if (auto ex = ex_.lock()) ex->mark_gone();
  }

  void queue(std::string data, size_t counted, bool last) {
    out_.push_back({std::move(data), counted});
    if (last) out_last_ = true;
    if (!writing_) do_write();
  }

  void do_write() {
    if (out_.empty() || phase_ == Phase::kClosed) return;
    writing_ = true;
    batch_.clear();
    batch_counted_ = 0;
    batch_last_ = out_last_;
    size_t bytes = 0;
    while (!out_.empty() && bytes < (256u << 10)) {
      bytes += out_.front().first.size();
      batch_counted_ += out_.front().second;
      batch_.push_back(std::move(out_.front().first));
      out_.pop_front();
    }
    if (!out_.empty()) batch_last_ = false;
    bufs_.clear();
    for (const auto& s : batch_) bufs_.emplace_back(net::buffer(s));
    stream_.expires_after(seconds(core_->opt.write_timeout_s));
    net::async_write(stream_, bufs_, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    batch_.clear();
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      peer_gone();
      return close();
    }
    wrote_counted(batch_counted_);
    if (!out_.empty()) return do_write();
    if (batch_last_) {
      out_last_ = false;
      finish_exchange();
    }
  }

  void wrote_counted(size_t counted) {
    if (counted == 0) return;
    if (auto ex = ex_.lock()) ex->wrote(counted);
  }

  // The whole answer is written.
  void finish_exchange() {
    ex_.reset();
    // After an error answer the request may be partly unread: linger so
    // the client reads the answer. After a complete request: close now.
    if (phase_ == Phase::kClosing) return linger();
    if (!keep_alive_now()) return close();
    phase_ = Phase::kAwaitNext;
    if (watching_) {
      beast::error_code ignored;
      stream_.socket().cancel(ignored);  // on_watch continues with next_request()
      return;
    }
    next_request();
  }

  void next_request() {
    if (phase_ == Phase::kClosed) return;
    read_header();
  }

  // Graceful close: FIN now, then read and discard what the client still
  // sends (bounded) so it reads our answer before our close resets it.
  void linger() {
    phase_ = Phase::kClosing;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    linger_deadline_ = SteadyClock::now() + kLingerTime;
    if (watching_) {
      stream_.socket().cancel(ignored);  // on_watch continues with linger_read()
      return;
    }
    linger_read();
  }

  void linger_read() {
    if (phase_ == Phase::kClosed) return;
    if (lingered_ >= kLingerBytes || SteadyClock::now() >= linger_deadline_) return close();
    stream_.expires_at(linger_deadline_);
    linger_buf_.resize(8192);
    stream_.async_read_some(net::buffer(linger_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->lingered_ += n;
      if (ec) return self->close();
      self->linger_read();
    });
  }

  void close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    peer_gone();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    out_.clear();
  }

  TransportCore* core_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string remote_addr_;
  int remote_port_ = 0;
  Phase phase_ = Phase::kReadHeader;
  int served_ = 0;
  bool keep_alive_ = true;
  bool head_only_ = false;
  bool watching_ = false;
  bool writing_ = false;
  std::weak_ptr<Exchange> ex_;                      // the exchange being answered
  std::deque<std::pair<std::string, size_t>> out_;  // bytes to write, stream bytes they count
  bool out_last_ = false;                           // the exchange's last bytes are queued
  std::vector<std::string> batch_;                  // being written
  std::vector<net::const_buffer> bufs_;
  size_t batch_counted_ = 0;
  bool batch_last_ = false;
  std::string continue_msg_;
  std::vector<char> linger_buf_;
  size_t lingered_ = 0;
  SteadyClock::time_point linger_deadline_{};
};

// ---- the core ------------------------------------------------------------------------

void TransportCore::do_accept() {
  if (stopping) return;
  acceptor.async_accept(net::make_strand(ioc),
                        [this](beast::error_code ec, tcp::socket socket) { on_accept(ec, std::move(socket)); });
}

void TransportCore::on_accept(beast::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {
    // EMFILE and friends: wait a little instead of spinning.
    auto t = std::make_shared<net::steady_timer>(acceptor.get_executor(), std::chrono::milliseconds(50));
    t->async_wait([this, t](beast::error_code) { do_accept(); });
    return;
  }
  if (stopping) return;
  if (n_conns.load() >= opt.max_connections) {
    reject(std::move(socket));
  } else {
    n_conns.fetch_add(1);
    std::make_shared<Connection>(this, std::move(socket))->start();
  }
  do_accept();
}

// Past max_connections: an immediate 503 and a close, without reading the
// request. Bounded too: past another max_connections of these, plain close.
void TransportCore::reject(tcp::socket socket) {
  n_refused.fetch_add(1);
  if (n_rejecting.load() >= std::max(1, opt.max_connections)) return;  // socket closes here
  n_rejecting.fetch_add(1);
  HttpResponse r = error_body ? error_body(503, "Too many open connections; retry later.", "")
                              : default_error_body(503, "Too many open connections; retry later.", "");
  r.status = 503;
  r.headers.emplace_back("Retry-After", "1");
  auto text = std::make_shared<std::string>(head_of(503, r.content_type, r.headers, false, r.body.size()) + r.body);
  auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
  stream->expires_after(std::chrono::seconds(1));
  net::async_write(*stream, net::buffer(*text), [this, stream, text](beast::error_code, size_t) {
    beast::error_code ignored;
    stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream->close();
    n_rejecting.fetch_sub(1);
  });
}

// On the acceptor's strand.
void TransportCore::stop() {
  beast::error_code ignored;
  acceptor.close(ignored);
  for (auto& c : snapshot()) c->post([c] { c->on_stop(); });
  stop_at = SteadyClock::now();
  stop_timer.emplace(acceptor.get_executor());
  watch_stop();
}

// Every 20 ms after stop(): done when no connection is left; after
// stop_grace_s the rest are closed.
void TransportCore::watch_stop() {
  if (n_conns.load() == 0 && n_rejecting.load() == 0) {
    guard.reset();
    return;
  }
  if (SteadyClock::now() - stop_at > seconds(opt.stop_grace_s)) {
    for (auto& c : snapshot()) c->post([c] { c->force_close(); });
  }
  stop_timer->expires_after(std::chrono::milliseconds(20));
  stop_timer->async_wait([this](beast::error_code) { watch_stop(); });
}

// ---- Exchange -------------------------------------------------------------------------

Exchange::Exchange(std::shared_ptr<Connection> conn, HttpRequest request, size_t high_water)
    : conn_(std::move(conn)), request_(std::move(request)), high_water_(std::max<size_t>(high_water, 1)) {}

Exchange::~Exchange() {
  if (!answered_.exchange(true) && conn_) {
    // Dropped without an answer: the client still gets one.
    conn_->post([c = conn_] { c->deliver(default_error_body(500, "The request was dropped without an answer.", "")); });
  } else if (answered_ && !ended_ && conn_) {
    conn_->post([c = conn_] { c->stream_end(); });
  }
}

void Exchange::respond(HttpResponse response) {
  if (answered_.exchange(true)) return;
  ended_ = true;
  status_ = response.status;
  conn_->decorate(request_, response.headers);
  conn_->log(request_, response.status);
  conn_->post([c = conn_, r = std::move(response)]() mutable { c->deliver(std::move(r)); });
}

void Exchange::start_stream(int status, std::string content_type,
                            std::vector<std::pair<std::string, std::string>> headers) {
  if (answered_.exchange(true)) return;
  status_ = status;
  conn_->decorate(request_, headers);
  conn_->log(request_, status);
  conn_->post(
      [c = conn_, status, ct = std::move(content_type), h = std::move(headers)] { c->stream_head(status, ct, h); });
}

bool Exchange::send(std::string chunk) {
  if (gone_ || ended_ || !answered_) return false;
  if (chunk.empty()) return true;
  const size_t n = chunk.size();
  pending_.fetch_add(n);
  conn_->post([c = conn_, data = std::move(chunk), n]() mutable { c->stream_chunk(std::move(data), n); });
  return true;
}

void Exchange::end_stream() {
  if (!answered_ || ended_.exchange(true)) return;
  conn_->post([c = conn_] { c->stream_end(); });
}

bool Exchange::over_high_water() const { return pending_.load() > high_water_; }

void Exchange::on_drain(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (!gone_ && pending_.load() > high_water_ / 2) {
      on_drain_ = std::move(fn);
      return;
    }
  }
  fn();
}

void Exchange::on_disconnect(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (!gone_) {
      on_disconnect_ = std::move(fn);
      return;
    }
  }
  fn();
}

void Exchange::mark_gone() {
  std::function<void()> disc, drain;
  {
    std::lock_guard lock(mu_);
    if (gone_.exchange(true)) return;
    if (ended_ && pending_.load() == 0) {
      // Fully answered already: nothing to cancel.
      on_drain_ = nullptr;
      on_disconnect_ = nullptr;
      return;
    }
    disc = std::move(on_disconnect_);
    drain = std::move(on_drain_);
  }
  if (disc) disc();
  if (drain) drain();
}

void Exchange::wrote(size_t bytes) {
  const size_t left = pending_.fetch_sub(bytes) - bytes;
  if (left > high_water_ / 2) return;
  std::function<void()> fn;
  {
    std::lock_guard lock(mu_);
    fn = std::move(on_drain_);
    on_drain_ = nullptr;
  }
  if (fn) fn();
}

// ---- HttpRequest ----------------------------------------------------------------------

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return true;
  return false;
}

// ---- Transport ------------------------------------------------------------------------

HttpTransport::HttpTransport(TransportOptions options) : core_(std::make_shared<TransportCore>(std::move(options))) {}

HttpTransport::~HttpTransport() {
  stop();
  core_->dead = true;
  core_->workers.join();
}

void HttpTransport::route(std::string method, std::string path, Handler handler, Dispatch dispatch) {
  RouteEntry r;
  r.method = std::move(method);
  r.prefix = !path.empty() && path.back() == '*';
  if (r.prefix) path.pop_back();
  r.path = std::move(path);
  r.handler = std::move(handler);
  r.dispatch = dispatch;
  core_->routes.push_back(std::move(r));
}

void HttpTransport::get(std::string path, SyncHandler handler, Dispatch dispatch) {
  route(
      "GET", std::move(path),
      [h = std::move(handler)](const std::shared_ptr<Exchange>& ex) {
        HttpResponse res;
        h(ex->request(), res);
        ex->respond(std::move(res));
      },
      dispatch);
}

std::string HttpRequest::query_param(std::string_view name) const {
  for (size_t b = 0; b < query.size();) {
    size_t e = query.find('&', b);
    if (e == std::string::npos) e = query.size();
    std::string item = query.substr(b, e - b);
    std::replace(item.begin(), item.end(), '+', ' ');
    const size_t eq = item.find('=');
    if (percent_decode(std::string_view(item).substr(0, eq)) == name)
      return eq == std::string::npos ? std::string() : percent_decode(std::string_view(item).substr(eq + 1));
    b = e + 1;
  }
  return {};
}

bool HttpRequest::is_multipart() const {
  std::string type = header("Content-Type");
  for (auto& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return type.rfind("multipart/form-data", 0) == 0;
}

void HttpTransport::post_json(std::string path, BodyHandler handler, SyncHandler multipart_error) {
  route("POST", std::move(path),
        [h = std::move(handler), mp = std::move(multipart_error)](const std::shared_ptr<Exchange>& ex) {
          HttpResponse res;
          const HttpRequest& req = ex->request();
          if (req.is_multipart() && mp)
            mp(req, res);
          else
            h(req, req.body, res);
          ex->respond(std::move(res));
        });
}

void HttpTransport::set_pre_routing(PreRouter fn) { core_->pre_route = std::move(fn); }
void HttpTransport::set_header_decorator(HeaderDecorator fn) { core_->decorate = std::move(fn); }

void HttpTransport::set_not_found(Handler handler) { core_->not_found = std::move(handler); }
void HttpTransport::set_error_body(ErrorBody fn) { core_->error_body = fn ? std::move(fn) : default_error_body; }
void HttpTransport::set_logger(RequestLogger fn) { core_->logger = std::move(fn); }

core::Expected<int> HttpTransport::bind() {
  const auto& o = core_->opt;
  const std::string where = o.host + ":" + std::to_string(o.port);
  beast::error_code ec;
  const auto addr = net::ip::make_address(o.host == "localhost" ? "127.0.0.1" : o.host, ec);
  if (ec) return core::fail(core::Errc::kIo, "cannot listen on " + where + ": not a numeric IP address");
  const tcp::endpoint ep(addr, static_cast<unsigned short>(o.port));
  auto& a = core_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(std::max(o.backlog, kMinBacklog), ec);
  if (ec) {
    const std::string why = ec.message();  // (close() below resets ec: the message was "Success")
    a.close(ec);
    return core::fail(core::Errc::kIo, "cannot listen on " + where + ": " + why);
  }
  core_->bound = true;
  return static_cast<int>(a.local_endpoint().port());
}

void HttpTransport::run() {
  TransportCore* c = core_.get();
  if (c->bound) net::post(c->acceptor.get_executor(), [c] { c->do_accept(); });
  std::vector<std::thread> extra;
  for (int i = 1; i < std::max(1, c->opt.io_threads); ++i) extra.emplace_back([c] { c->ioc.run(); });
  c->ioc.run();
  for (auto& t : extra) t.join();
}

void HttpTransport::stop() {
  if (core_->stopping.exchange(true)) return;
  TransportCore* c = core_.get();
  net::post(c->acceptor.get_executor(), [c] { c->stop(); });
}

void HttpTransport::post(std::function<void()> fn) { net::post(core_->workers, std::move(fn)); }

bool HttpTransport::stopping() const { return core_->stopping; }
int64_t HttpTransport::connections() const { return core_->n_conns.load(); }
uint64_t HttpTransport::refused() const { return core_->n_refused.load(); }

}  // namespace bonsai::server
