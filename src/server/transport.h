// The server's HTTP transport: listening socket, connection threads, request
// bodies, streamed responses, client-disconnect probes and closing idle
// keep-alive connections at shutdown. Today it sits on cpp-httplib 0.11;
// everything httplib-specific (its thread pool, socket options, the listen
// backlog, /proc/self/fd scanning for a request's socket, the run/stop race)
// lives in transport.cpp. Routes see only HttpRequest / HttpResponse (read
// the method, path, headers, regex matches and peer; set status, headers and
// content) and the types declared here.
//
// Thread-safety: register routes and hooks before bind(); after that,
// handlers run on the connection threads (TransportOptions::threads of them)
// and stop() may be called from any thread.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace bonsai::server {

// What a route handler reads and writes (httplib's types for now).
using HttpRequest = httplib::Request;
using HttpResponse = httplib::Response;

// Tells whether the client that sent one request has gone away. Obtained
// from HttpTransport::client_of while the request's handler runs; valid as
// long as the request is being handled or answered (the connection stays
// open that long). A default-constructed probe never reports a close.
class ClientProbe {
 public:
  ClientProbe() = default;
  // True when the peer has closed the connection (an orderly FIN or an
  // error). Data waiting to be read (a pipelined next request) is not a close.
  bool closed() const;

 private:
  friend class HttpTransport;
  explicit ClientProbe(int fd) : fd_(fd) {}
  int fd_ = -1;  // the connection's socket, -1 unknown
};

// Where a streamed response's bytes go (HttpTransport::stream).
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Sends `data` to the client at once (one chunk). False: the client is gone.
  virtual bool write(std::string_view data) = 0;
  // False once the connection can no longer be written to.
  virtual bool writable() const = 0;
};

struct TransportOptions {
  int threads = 64;                  // connection threads
  size_t max_body_bytes = 4u << 20;  // larger request bodies: 413
  int keep_alive_s = 5;              // idle keep-alive connections are closed after this
  int listen_backlog = 1024;         // pending connections the kernel queues before accept (listen(2))
};

class HttpTransport {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;
  // A POST handler: `body` is the whole request body (read as JSON by the route).
  using BodyHandler = std::function<void(const HttpRequest&, const std::string& body, HttpResponse&)>;
  // Runs before routing; returns true when it answered the request itself
  // (e.g. 401), false to route it.
  using PreRouter = std::function<bool(const HttpRequest&, HttpResponse&)>;
  // Writes the body of an error the transport produced itself (res.status
  // is set: 404 unknown route, 413 body too large, 400 unreadable, 5xx).
  using ErrorWriter = std::function<void(const HttpRequest&, HttpResponse&)>;
  // Writes the answer to a handler that threw (`what`: the exception's text).
  using ExceptionWriter = std::function<void(HttpResponse&, const std::string& what)>;
  // Called once per request after its response (a stream's last chunk
  // included) has been written.
  using Logger = std::function<void(const HttpRequest&, const HttpResponse&)>;

  explicit HttpTransport(TransportOptions options);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  void set_pre_routing(PreRouter fn);
  void set_error_writer(ErrorWriter fn);
  void set_exception_writer(ExceptionWriter fn);
  void set_logger(Logger fn);

  // A GET route; `pattern` is a path or an ECMAScript regex whose groups
  // the handler reads as req.matches[i].
  void get(const std::string& pattern, Handler handler);
  // A POST route whose body is read as JSON whatever its Content-Type says
  // (OpenAI's API does the same), up to TransportOptions::max_body_bytes
  // (413 above it, for every type); a multipart body is drained and refused
  // with 400 (`multipart_error` writes that answer); no Content-Length and no
  // Transfer-Encoding means an empty body.
  void post_json(const std::string& pattern, BodyHandler handler, Handler multipart_error);

  // Makes `res` a chunked stream of `content_type`: once the handler has
  // returned, `body` runs on the connection's thread and writes the chunks;
  // the response ends when it returns. Set status and headers before.
  static void stream(HttpResponse& res, const std::string& content_type, std::function<void(StreamSink&)> body);

  // The disconnect probe of the connection that sent `req` (call from its handler).
  ClientProbe client_of(const HttpRequest& req) const;

  // Binds the listening socket. Returns the port (a free one when `port`
  // is 0). Errors: kIo naming host:port.
  core::Expected<int> bind(const std::string& host, int port);
  // Serves until stop(). Call after bind().
  void run();
  // Stops accepting and makes run() return once the requests in flight have
  // been answered; closes idle keep-alive connections at once. Callable
  // from any thread, before, during or after run(). Idempotent.
  void stop();

 private:
  // Shuts down the reading side of every connection with no request in
  // flight. Returns how many.
  int close_idle_connections();

  TransportOptions opt_;
  httplib::Server http_;
  int bound_port_ = -1;  // set by bind()
  int listen_fd_ = -1;   // the listening socket (set_socket_options), for its backlog
  PreRouter pre_route_;
  Logger logger_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> run_entered_{false};   // run() called (set before it checks stop_requested_)
  std::atomic<bool> run_returned_{false};  // run() returned
  // Connections with a request being handled or answered, by peer (host,
  // port): counted from pre-routing until the logger, which httplib runs
  // after the response (a stream's last chunk included) is written. The
  // others are idle keep-alive connections, which stop() closes.
  std::mutex conn_mu_;
  std::map<std::pair<std::string, int>, int> busy_peers_;  // guarded by conn_mu_
};

}  // namespace bonsai::server
