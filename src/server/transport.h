// The server's HTTP/1.1 transport: Boost.Beast parsing over an event-driven
// Boost.Asio acceptor (Debian's libboost-dev, header-only).
//
// What it guarantees (issue 10, DESIGN.md "Server"):
// - A fixed, small set of I/O threads (TransportOptions::io_threads) runs
//   every socket; a slow or idle client costs a socket and a few KiB, never
//   a thread. The listen backlog is at least 512.
// - At most `max_connections` connections are served; one more gets an
//   immediate 503 (Connection: close) and is closed.
// - Limits are checked before any body byte is read: the header block is
//   capped in bytes (431) and in fields (431); a Content-Length that is
//   negative or not a number is a 400, one above `max_body_bytes` a 413,
//   both answered as soon as the header is parsed. A chunked body is capped
//   by the same `max_body_bytes` while it is read (413), malformed chunk
//   framing is a 400.
// - Timeouts: the whole header must arrive within `header_timeout_s`
//   (slowloris), the body within `body_timeout_s`; an idle keep-alive
//   connection is closed after `idle_timeout_s`, and after
//   `max_requests_per_connection` requests; a response write that makes no
//   progress for `write_timeout_s` closes the connection.
// - Handlers run on a fixed pool of worker threads (never on an I/O
//   thread), unless a route is registered Dispatch::kInline (cheap, non-
//   blocking routes such as /health). A handler answers through its
//   Exchange, from any thread, at any later time: either one whole
//   Response, or a stream (chunked transfer, e.g. Server-Sent Events) whose
//   producer pushes chunks with Exchange::send; nothing holds a thread per
//   open stream. Back-pressure: Exchange::over_high_water() says when the
//   unsent bytes of a stream exceed `stream_high_water_bytes`, and
//   Exchange::on_drain() calls back once they fall below half of it.
// - While a request is being handled or answered the connection keeps a
//   read pending on the socket: end-of-file or a reset there runs the
//   Exchange's on_disconnect callback at once (the server cancels the
//   request's scheduler job from it).
// - stop(): stops accepting, closes every idle connection at once (those
//   waiting for a request, fully or partly read), lets the exchanges in
//   flight finish (no keep-alive after them) and makes run() return when
//   they have; after `stop_grace_s` the remaining connections are closed.
//
// - Routing: a HEAD request is answered by the path's GET route without the
//   body; a path served only under other methods answers 405 with an Allow
//   header listing them; a routed request whose body carries a
//   Content-Encoding other than identity answers 415 with
//   "Accept-Encoding: identity" (bodies are never decompressed).
//
// Errors the transport writes itself (400, 404, 405, 413, 415, 417, 431,
// 503, 505; a timed-out read is closed without an answer) get their body
// from an ErrorBody callback (the server writes OpenAI error objects) or a
// plain default.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace bonsai::server {

// Limits and sizes of one Transport. Times in seconds, sizes in bytes.
struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 0;                               // 0: any free port (see Transport::bind)
  int backlog = 1024;                         // listen(2) backlog; raised to 512 if lower
  int io_threads = 2;                         // threads running sockets (>= 1)
  int worker_threads = 8;                     // threads running handlers (>= 1)
  int max_connections = 1024;                 // open connections served at once; more: 503 + close
  size_t max_body_bytes = 4u << 20;           // Content-Length or chunked total above this: 413
  size_t max_header_bytes = 64u << 10;        // request line + header fields: 431 above
  size_t max_header_fields = 256;             // header fields per request: 431 above
  double header_timeout_s = 10;               // whole request header (first request of a connection)
  double body_timeout_s = 30;                 // whole body, once the header is in
  double idle_timeout_s = 5;                  // keep-alive wait for the next request
  int max_requests_per_connection = 1000;     // then Connection: close
  double write_timeout_s = 60;                // one write making no progress: connection closed
  size_t stream_high_water_bytes = 1u << 20;  // unsent stream bytes that count as "full"
  double stop_grace_s = 10;                   // after stop(), in-flight exchanges get this long
};

// One parsed request. Header names keep the client's spelling; lookups are
// case-insensitive. `path` is percent-decoded, without the query.
struct HttpRequest {
  std::string method;  // as sent ("GET", "POST", or any token)
  std::string target;  // raw request-target ("/v1/models?x=1")
  std::string path;    // percent-decoded path part of target
  std::string query;   // after '?', raw; empty if none
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote_addr;  // numeric peer address
  int remote_port = 0;
  // The first header named `name` (case-insensitive), or "" if none.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
  // The first `name=value` of the query string, percent-decoded ('+' is a
  // space, application/x-www-form-urlencoded), or "" if none.
  std::string query_param(std::string_view name) const;
  // Whether Content-Type starts with multipart/form-data (case-insensitive):
  // the body routes that take JSON refuse it (HttpTransport::post_json).
  bool is_multipart() const;
};

// One whole response. Content-Length and Connection are set by the transport.
struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  void set_content(std::string text, std::string type) {
    body = std::move(text);
    content_type = std::move(type);
  }
  void set_content(const char* data, size_t size, std::string type) {
    set_content(std::string(data, size), std::move(type));
  }
  // Adds a header (a value containing CR or LF is dropped when written).
  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
};

class HttpTransport;
struct TransportCore;
class Connection;

// One request being answered. Shared by the transport and the handler; all
// methods are thread-safe and never block. Exactly one of respond() or
// start_stream() (+ send()* + end_stream()) should be called; a second
// respond()/start_stream() is ignored. If the handler drops its last
// reference without answering, the client gets a 500.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<Connection> conn, HttpRequest request, size_t high_water);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  const HttpRequest& request() const { return request_; }

  // The whole answer. Written on the connection's strand.
  void respond(HttpResponse response);
  // Starts a chunked response (status + headers now, body later).
  void start_stream(int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers = {});
  // Queues one body chunk of a started stream (empty chunks are skipped).
  // Returns false when the peer is gone or the stream has ended (the
  // producer should stop). Never blocks: see over_high_water().
  bool send(std::string chunk);
  // Ends the stream (the last chunk).
  void end_stream();
  // Unsent bytes of the stream exceed TransportOptions::stream_high_water_bytes.
  bool over_high_water() const;
  // `fn` runs once (on an I/O thread; keep it short: post real work
  // elsewhere) when the unsent bytes fall to half the high-water mark or
  // the peer goes away; at once (on this thread) if that is already so.
  void on_drain(std::function<void()> fn);
  // `fn` runs once (on an I/O thread, or at once on this thread when the
  // peer is already gone) when the peer closes or resets the connection, or
  // the connection is closed (write timeout, stop grace) before the answer
  // is complete. Replaces an earlier callback.
  void on_disconnect(std::function<void()> fn);
  // The peer is gone (or the connection was closed); writes are dropped.
  bool peer_gone() const { return gone_.load(); }
  // Status given to respond()/start_stream(), 0 before.
  int status() const { return status_.load(); }

 private:
  friend class Connection;
  void mark_gone();          // the connection's strand: peer gone
  void wrote(size_t bytes);  // the connection's strand: `bytes` of queued data written
  std::shared_ptr<Connection> conn_;
  HttpRequest request_;
  const size_t high_water_;
  std::atomic<bool> answered_{false};  // respond() or start_stream() called
  std::atomic<bool> ended_{false};     // respond() or end_stream() called
  std::atomic<bool> gone_{false};
  std::atomic<int> status_{0};
  std::atomic<size_t> pending_{0};  // queued, unwritten stream bytes
  std::mutex mu_;                   // guards the two callbacks
  std::function<void()> on_drain_;
  std::function<void()> on_disconnect_;
};

using Handler = std::function<void(const std::shared_ptr<Exchange>&)>;
// Where a handler runs: on a worker thread (default; may block briefly,
// e.g. tokenize), or on the I/O thread that read the request (only for
// handlers that never block and take microseconds).
enum class Dispatch { kWorker, kInline };
// Body of an error the transport answers itself: status, a one-line
// reason ("Content-Length is negative"), and the request's path (decoded,
// without the query) so that the body can take the shape of the API the
// path belongs to; "" when no request line was read (503 at accept).
using ErrorBody = std::function<HttpResponse(int status, const std::string& message, const std::string& path)>;
// Called once per answered request: the request (its body may be empty)
// and the status given. On the thread that answered.
using RequestLogger = std::function<void(const HttpRequest&, int status)>;

class HttpTransport {
 public:
  // A handler that answers at once: fills `res`, which is then sent.
  using SyncHandler = std::function<void(const HttpRequest&, HttpResponse&)>;
  // A POST handler: `body` is the whole request body.
  using BodyHandler = std::function<void(const HttpRequest&, const std::string& body, HttpResponse&)>;
  // Runs before routing (on the I/O thread: keep it cheap); returns true
  // when it answered the request itself (e.g. 401), false to route it.
  using PreRouter = std::function<bool(const HttpRequest&, HttpResponse&)>;
  // Adds headers to every answer an Exchange gives (respond() or
  // start_stream(), pre-routing answers included; not the errors the
  // transport writes itself before a request is whole, e.g. 413 / 431 /
  // 503). Runs on the answering thread; must be thread-safe and cheap.
  using HeaderDecorator =
      std::function<void(const HttpRequest&, std::vector<std::pair<std::string, std::string>>& headers)>;

  explicit HttpTransport(TransportOptions options);
  // Stops (as stop()) and joins every thread. Exchanges must not be used
  // after this (their owners are gone before: the server's streams end at stop()).
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Routes: `path` matched exactly, or as a prefix when it ends in '*'
  // ("/v1/models/*" matches "/v1/models/x", not "/v1/models/"). Exact
  // routes win over prefix routes, longer prefixes over shorter; the method
  // must match exactly (HEAD falls back to GET). No match: 405 + Allow
  // when the path has routes under other methods, else the not-found
  // handler (default: 404 through ErrorBody). Register before run().
  void route(std::string method, std::string path, Handler handler, Dispatch dispatch = Dispatch::kWorker);
  // A GET route answered at once (see route() for `path`).
  void get(std::string path, SyncHandler handler, Dispatch dispatch = Dispatch::kWorker);
  // A POST route whose body is read as JSON whatever its Content-Type says
  // (OpenAI's API does the same); a multipart/form-data body goes to
  // `multipart_error` instead.
  void post_json(std::string path, BodyHandler handler, SyncHandler multipart_error);
  void set_pre_routing(PreRouter fn);
  void set_header_decorator(HeaderDecorator fn);  // register before run()
  void set_not_found(Handler handler);
  void set_error_body(ErrorBody fn);
  void set_logger(RequestLogger fn);

  // Binds and listens. Returns the port (the chosen one when options.port
  // is 0). Errors: kIo naming host:port and the system's reason.
  core::Expected<int> bind();
  // Serves on the calling thread plus io_threads - 1 more until stop() and
  // the exchanges in flight have finished. A stop() before run() makes it
  // return at once.
  void run();
  // Graceful stop; callable from any thread (also a signal-handling
  // thread), any number of times, before or during run().
  void stop();
  bool stopping() const;
  // Runs `fn` on a worker thread (the pool handlers run on). For work a
  // handler defers, e.g. reading a job's events when it notifies.
  void post(std::function<void()> fn);

  // Open connections right now (served ones, not counting refused ones).
  int64_t connections() const;
  // Connections refused with 503 because max_connections were open.
  uint64_t refused() const;

 private:
  std::shared_ptr<TransportCore> core_;
};

}  // namespace bonsai::server
