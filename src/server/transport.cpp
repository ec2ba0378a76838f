// The server's HTTP transport on cpp-httplib 0.11. See transport.h.
#include "server/transport.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <thread>

namespace bonsai::server {

namespace {

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

// StreamSink over httplib's DataSink.
class HttplibSink final : public StreamSink {
 public:
  explicit HttplibSink(httplib::DataSink& sink) : sink_(sink) {}
  bool write(std::string_view data) override { return sink_.write(data.data(), data.size()); }
  bool writable() const override { return sink_.is_writable(); }

 private:
  httplib::DataSink& sink_;
};

}  // namespace

bool ClientProbe::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
  if ((p.revents & POLLIN) != 0) {
    char c = 0;
    return recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

HttpTransport::HttpTransport(TransportOptions options) : opt_(options) {
  http_.new_task_queue = [n = opt_.threads > 0 ? opt_.threads : 64] {
    return new httplib::ThreadPool(static_cast<size_t>(n));
  };
  // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second
  // server bind the same port and silently share its connections.
  http_.set_socket_options([this](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = sock;  // bind() widens its backlog once httplib listens
  });
  http_.set_payload_max_length(opt_.max_body_bytes);
  http_.set_tcp_nodelay(true);
  http_.set_keep_alive_timeout(opt_.keep_alive_s);

  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard lock(conn_mu_);
      ++busy_peers_[{req.remote_addr, req.remote_port}];
    }
    if (pre_route_ && pre_route_(req, res)) return httplib::Server::HandlerResponse::Handled;
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (logger_) logger_(req, res);
    std::lock_guard lock(conn_mu_);
    // Absent for a request refused before routing (an unreadable request line).
    if (auto it = busy_peers_.find({req.remote_addr, req.remote_port}); it != busy_peers_.end() && --it->second <= 0)
      busy_peers_.erase(it);
  });
}

HttpTransport::~HttpTransport() { stop(); }

void HttpTransport::set_pre_routing(PreRouter fn) { pre_route_ = std::move(fn); }

void HttpTransport::set_logger(Logger fn) { logger_ = std::move(fn); }

void HttpTransport::set_error_writer(ErrorWriter fn) {
  httplib::Server::HandlerWithResponse on_error = [fn = std::move(fn)](const httplib::Request& req,
                                                                       httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    fn(req, res);
    return httplib::Server::HandlerResponse::Handled;
  };
  http_.set_error_handler(std::move(on_error));
}

void HttpTransport::set_exception_writer(ExceptionWriter fn) {
  http_.set_exception_handler(
      [fn = std::move(fn)](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        fn(res, what);
      });
}

void HttpTransport::get(const std::string& pattern, Handler handler) { http_.Get(pattern, std::move(handler)); }

// The body is read here, through httplib's content reader, rather than by
// httplib itself: httplib caps application/x-www-form-urlencoded bodies at
// 8 KiB (413) — the type `curl -d` sends by default — and parses them as a
// query string.
void HttpTransport::post_json(const std::string& pattern, BodyHandler handler, Handler multipart_error) {
  auto read_body = [this, multipart_error](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& reader, std::string& body) {
    if (req.is_multipart_form_data()) {
      reader([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; });
      multipart_error(req, res);
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
      if (body.size() + n > opt_.max_body_bytes) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (ok) return true;
    if (too_large) res.status = 413;
    if (res.status < 400) res.status = 400;  // unreadable (httplib sets 413 above its own limit)
    return false;                            // the error writer writes the body
  };
  http_.Post(pattern, [read_body, handler](const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, body)) handler(req, body, res);
  });
  // A POST that httplib does not treat as having content comes here.
  http_.Post(pattern, [handler](const httplib::Request& req, httplib::Response& res) { handler(req, req.body, res); });
}

void HttpTransport::stream(HttpResponse& res, const std::string& content_type,
                           std::function<void(StreamSink&)> body) {
  res.set_chunked_content_provider(content_type, [body = std::move(body)](size_t, httplib::DataSink& sink) {
    HttplibSink s(sink);
    body(s);
    sink.done();
    return true;
  });
}

// httplib 0.11 gives handlers no access to the request's socket (later
// versions added Request::is_connection_closed for this), so it is found by
// its addresses: the socket in /proc/self/fd whose peer is req's remote
// address and port and whose local port is the listener's. A TCP
// connection's address pair is unique, and the connection (so the fd) stays
// open while its handler runs.
ClientProbe HttpTransport::client_of(const HttpRequest& req) const {
  int found = -1;
  for_each_connection(bound_port_, [&](int fd, const std::string& host, int port) {
    if (host != req.remote_addr || port != req.remote_port) return true;
    found = fd;
    return false;
  });
  return ClientProbe(found);
}

core::Expected<int> HttpTransport::bind(const std::string& host, int port) {
  if (port == 0) {
    port = http_.bind_to_any_port(host);
    if (port < 0) return core::fail(core::Errc::kIo, "cannot listen on " + host + " (any port)");
  } else if (!http_.bind_to_port(host, port)) {
    return core::fail(core::Errc::kIo, "cannot listen on " + host + ":" + std::to_string(port) +
                                           " (address in use, or not a local address)");
  }
  // httplib 0.11 listens with a backlog of 5 (compiled into the library):
  // bursts of connections then waited a 1 s SYN retry. Linux lets listen(2)
  // be called again on a listening socket to change its backlog (capped by
  // net.core.somaxconn).
  if (listen_fd_ >= 0) ::listen(listen_fd_, opt_.listen_backlog);
  bound_port_ = port;
  return port;
}

// httplib 0.11's stop() does nothing until listen_after_bind() has marked
// the listener running, so a stop() that came first (SIGTERM while `bonsai
// serve` was still starting) was lost and run() then served forever. run()
// announces itself before it checks stop_requested_ and stop() sets
// stop_requested_ before it checks run_entered_ (both sequentially
// consistent), so either run() sees the stop and returns at once, or stop()
// sees run() starting and waits (at most ~5 s) until httplib is listening to
// stop it.
void HttpTransport::run() {
  run_entered_ = true;
  if (!stop_requested_) http_.listen_after_bind();
  run_returned_ = true;
}

void HttpTransport::stop() {
  stop_requested_ = true;
  if (run_entered_) {
    for (int i = 0; i < 5000 && !http_.is_running() && !run_returned_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  http_.stop();
  close_idle_connections();
}

// httplib 0.11 waits for an idle keep-alive connection's next request for
// the whole keep-alive timeout (5 s) without looking at the listener, and
// run() joins every connection thread, so one idle client (any HTTP client
// that pools connections) held shutdown for 5 s. After SHUT_RD the waiting
// thread reads end-of-file at once and closes the connection (the peer gets
// a FIN, as for any keep-alive timeout). Connections with a request in
// flight are left alone: the server cancels their generations, and they
// finish writing their answer (the shutdown error) and then close, since
// httplib does not wait for another request once the listener is closed.
int HttpTransport::close_idle_connections() {
  if (bound_port_ < 0) return 0;
  int closed = 0;
  std::lock_guard lock(conn_mu_);
  for_each_connection(bound_port_, [&](int fd, const std::string& host, int port) {
    if (!busy_peers_.contains({host, port}) && ::shutdown(fd, SHUT_RD) == 0) ++closed;
    return true;
  });
  return closed;
}

}  // namespace bonsai::server
