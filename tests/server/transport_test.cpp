// The HTTP transport (src/server/transport.h) against a tiny route table, over raw
// sockets: slow clients (slowloris), Content-Length and chunked abuse, a
// hostile request corpus, connection bounds, keep-alive limits, disconnect
// detection, streaming back-pressure, graceful stop. Latency bounds are the
// issue's (answers < 100 ms, /health < 1 s under 500 slow connections); they
// are generous for a loaded 2-core machine, where the answers here take
// about a millisecond.
#include "server/transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace bonsai::server {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// A raw client socket with a receive timeout.
class Sock {
 public:
  explicit Sock(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Sock() {
    if (fd_ >= 0) ::close(fd_);
  }
  Sock(const Sock&) = delete;
  Sock& operator=(const Sock&) = delete;
  bool ok() const { return ok_; }
  int fd() const { return fd_; }
  // Sends all of `s` (false on error, e.g. the server closed and reset).
  bool send_all(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      s.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  void shut_wr() { ::shutdown(fd_, SHUT_WR); }
  // Reads until the peer closes, `until` appears complete (one response:
  // header + Content-Length body, or the chunked terminator), or timeout.
  std::string read_response(double timeout_ms = 3000) {
    const auto t0 = Clock::now();
    while (ms_since(t0) < timeout_ms) {
      if (complete()) break;
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(timeout_ms - ms_since(t0));
      if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      in_.append(buf, static_cast<size_t>(n));
    }
    std::string out;
    const size_t end = response_end();
    if (end == std::string::npos) {
      out.swap(in_);
    } else {
      out = in_.substr(0, end);
      in_.erase(0, end);
    }
    return out;
  }
  // True when the peer closed (EOF or reset) within `timeout_ms`.
  bool wait_closed(double timeout_ms) {
    const auto t0 = Clock::now();
    while (!closed_ && ms_since(t0) < timeout_ms) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) closed_ = true;
    }
    return closed_;
  }
  bool closed() const { return closed_; }

 private:
  size_t response_end() const {
    const size_t h = in_.find("\r\n\r\n");
    if (h == std::string::npos) return std::string::npos;
    const std::string head = in_.substr(0, h);
    if (const size_t cl = head.find("Content-Length: "); cl != std::string::npos) {
      const size_t len = std::stoul(head.substr(cl + 16));
      return in_.size() >= h + 4 + len ? h + 4 + len : std::string::npos;
    }
    if (head.find("Transfer-Encoding: chunked") != std::string::npos) {
      const size_t e = in_.find("\r\n0\r\n\r\n", h);
      return e == std::string::npos ? std::string::npos : e + 7;
    }
    return h + 4;
  }
  bool complete() const { return response_end() != std::string::npos; }
  int fd_ = -1;
  bool ok_ = false;
  bool closed_ = false;
  std::string in_;
};

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

std::string body_of(const std::string& response) {
  const size_t h = response.find("\r\n\r\n");
  return h == std::string::npos ? "" : response.substr(h + 4);
}

// An HttpTransport on a free port, run on a background thread, with routes:
// GET /health (inline) "ok"; POST /echo (worker) the body's size;
// GET /wait (worker) answers when released, records a disconnect;
// GET /stream?n=N streams N chunks from a producer thread (back-pressure).
class TransportFixture : public ::testing::Test {
 protected:
  void start(TransportOptions o = {}) {
    o.host = "127.0.0.1";
    o.port = 0;
    t_ = std::make_unique<HttpTransport>(o);
    t_->route(
        "GET", "/health",
        [](const std::shared_ptr<Exchange>& ex) {
          HttpResponse r;
          r.body = "ok";
          ex->respond(std::move(r));
        },
        Dispatch::kInline);
    t_->route("POST", "/echo", [](const std::shared_ptr<Exchange>& ex) {
      HttpResponse r;
      r.body = std::to_string(ex->request().body.size());
      ex->respond(std::move(r));
    });
    t_->route("GET", "/wait", [this](const std::shared_ptr<Exchange>& ex) {
      ex->on_disconnect([this] {
        std::lock_guard lock(mu_);
        disconnected_ = true;
        cv_.notify_all();
      });
      std::lock_guard lock(mu_);
      waiting_.push_back(ex);
      cv_.notify_all();
    });
    t_->route("GET", "/items/*", [](const std::shared_ptr<Exchange>& ex) {
      HttpResponse r;
      r.body = ex->request().path;
      ex->respond(std::move(r));
    });
    t_->route("GET", "/stream", [this](const std::shared_ptr<Exchange>& ex) {
      const int n = std::stoi(ex->request().query.substr(2));
      ex->start_stream(200, "text/event-stream");
      producers_.emplace_back([this, ex, n] {
        const std::string chunk(64 << 10, 'x');
        for (int i = 0; i < n;) {
          if (ex->peer_gone()) return;
          if (ex->over_high_water()) {
            ++paused_;
            std::promise<void> drained;
            auto f = drained.get_future();
            ex->on_drain([&drained] { drained.set_value(); });
            f.wait();
            continue;
          }
          ex->send(chunk);
          ++i;
        }
        ex->end_stream();
      });
    });
    auto port = t_->bind();
    ASSERT_TRUE(port.has_value());
    port_ = *port;
    runner_ = std::thread([this] { t_->run(); });
  }
  void TearDown() override {
    if (t_) t_->stop();
    {
      std::lock_guard lock(mu_);
      waiting_.clear();
    }
    if (runner_.joinable()) runner_.join();
    for (auto& p : producers_) p.join();
    t_.reset();
  }
  // GET /health on a fresh connection: the status, and its latency in ms.
  std::pair<int, double> health() {
    const auto t0 = Clock::now();
    Sock s(port_);
    s.send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string r = s.read_response(5000);
    return {status_of(r), ms_since(t0)};
  }
  // One raw request on a fresh connection: status and latency in ms.
  // A second try only when the first was slow (a scheduling hiccup on a
  // loaded machine): the latency reported is the faster one.
  std::pair<int, double> raw(const std::string& bytes, bool shut = false) {
    std::pair<int, double> best{0, 1e9};
    for (int attempt = 0; attempt < 2 && best.second >= 100; ++attempt) {
      Sock s(port_);
      const auto t0 = Clock::now();
      s.send_all(bytes);
      if (shut) s.shut_wr();
      const std::string r = s.read_response(3000);
      const double ms = ms_since(t0);
      if (ms < best.second) best = {status_of(r), ms};
    }
    return best;
  }

  std::unique_ptr<HttpTransport> t_;
  std::thread runner_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Exchange>> waiting_;  // guarded by mu_
  bool disconnected_ = false;                       // guarded by mu_
  std::vector<std::thread> producers_;
  std::atomic<int> paused_{0};
};

TEST_F(TransportFixture, RoutesAndKeepAlive) {
  start();
  Sock s(port_);
  ASSERT_TRUE(s.send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string r = s.read_response();
  EXPECT_EQ(status_of(r), 200);
  EXPECT_EQ(body_of(r), "ok");
  EXPECT_NE(r.find("Connection: keep-alive"), std::string::npos);
  EXPECT_NE(r.find("Keep-Alive: timeout=5, max=999"), std::string::npos) << r;
  // Same connection: a POST with a body, then an unknown path, then a prefix route (percent-decoded).
  ASSERT_TRUE(s.send_all("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"));
  r = s.read_response();
  EXPECT_EQ(status_of(r), 200);
  EXPECT_EQ(body_of(r), "5");
  ASSERT_TRUE(s.send_all("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(status_of(s.read_response()), 404);
  ASSERT_TRUE(s.send_all("GET /items/a%2Fb HTTP/1.1\r\nHost: x\r\n\r\n"));
  r = s.read_response();
  EXPECT_EQ(body_of(r), "/items/a/b");
  // POST without Content-Length or chunked: an empty body, answered at once.
  ASSERT_TRUE(s.send_all("POST /echo HTTP/1.1\r\nHost: x\r\n\r\n"));
  r = s.read_response();
  EXPECT_EQ(body_of(r), "0");
  // Chunked body.
  ASSERT_TRUE(s.send_all(
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  EXPECT_EQ(body_of(s.read_response()), "5");
  // Expect: 100-continue gets the interim answer, then the final one.
  ASSERT_TRUE(s.send_all("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"));
  r = s.read_response();
  EXPECT_EQ(status_of(r), 100);
  ASSERT_TRUE(s.send_all("xyz"));
  EXPECT_EQ(body_of(s.read_response()), "3");
}

// A served path under another method is a 405 whose Allow lists the path's
// methods (HEAD with GET; a prefix route's too); HEAD is the GET route
// without its body (same Content-Length), and the connection stays usable;
// a body in a content coding is a 415 naming identity; no route at all is a 404.
TEST_F(TransportFixture, MethodNotAllowedHeadAndEncodedBodies) {
  start();
  Sock s(port_);
  ASSERT_TRUE(s.send_all("DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string r = s.read_response();
  EXPECT_EQ(status_of(r), 405) << r;
  EXPECT_NE(r.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << r;
  EXPECT_NE(body_of(r).find("DELETE is not allowed on /health (allowed: GET, HEAD)"), std::string::npos) << r;
  ASSERT_TRUE(s.send_all("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"));
  r = s.read_response();
  EXPECT_EQ(status_of(r), 405) << r;
  EXPECT_NE(r.find("\r\nAllow: POST\r\n"), std::string::npos) << r;
  ASSERT_TRUE(s.send_all("POST /items/a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"));
  r = s.read_response();
  EXPECT_EQ(status_of(r), 405) << r;
  EXPECT_NE(r.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << r;
  // HEAD: the status and headers of GET, no body; the next request on the connection is answered.
  // (No body follows a HEAD answer's Content-Length: read what comes within 300 ms.)
  ASSERT_TRUE(s.send_all("HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  r = s.read_response(300);
  EXPECT_EQ(status_of(r), 200) << r;
  EXPECT_NE(r.find("Content-Length: 2\r\n"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), "") << r;
  ASSERT_TRUE(s.send_all("HEAD /items/a HTTP/1.1\r\nHost: x\r\n\r\n"));
  r = s.read_response(300);
  EXPECT_EQ(status_of(r), 200) << r;
  EXPECT_NE(r.find("Content-Length: 8\r\n"), std::string::npos) << r;  // "/items/a"
  // Encoded bodies.
  ASSERT_TRUE(s.send_all("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc"));
  r = s.read_response();
  EXPECT_EQ(status_of(r), 415) << r;
  EXPECT_NE(r.find("\r\nAccept-Encoding: identity\r\n"), std::string::npos) << r;
  EXPECT_NE(body_of(r).find("Content-Encoding 'gzip' is not supported"), std::string::npos) << r;
  ASSERT_TRUE(
      s.send_all("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Encoding:  Identity \r\nContent-Length: 3\r\n\r\nabc"));
  EXPECT_EQ(body_of(s.read_response()), "3");
  ASSERT_TRUE(s.send_all("PUT /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"));
  r = s.read_response();
  EXPECT_EQ(status_of(r), 404) << r;
  EXPECT_EQ(r.find("Allow:"), std::string::npos) << r;
}

// RFC 9112 section 3.2.2: a server MUST accept an absolute-form target
// (the route is its path); a request line or header ending in a bare LF is a
// 400 (not a 505: the version is fine); another HTTP major is a 505.
TEST_F(TransportFixture, AbsoluteFormTargetsAreServedAndBareLfIs400) {
  start();
  Sock s(port_);
  ASSERT_TRUE(s.send_all("GET http://example.com/health HTTP/1.1\r\nHost: example.com\r\n\r\n"));
  std::string r = s.read_response();
  EXPECT_EQ(status_of(r), 200) << r;
  EXPECT_EQ(body_of(r), "ok");
  ASSERT_TRUE(s.send_all("GET HTTP://127.0.0.1:8080/items/a%2Fb?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"));
  r = s.read_response();
  EXPECT_EQ(status_of(r), 200) << r;
  EXPECT_EQ(body_of(r), "/items/a/b");
  ASSERT_TRUE(s.send_all("GET http://example.com HTTP/1.1\r\nHost: x\r\n\r\n"));  // no path: "/"
  EXPECT_EQ(status_of(s.read_response()), 404);
  for (const char* bytes : {"GET /health HTTP/1.1\nHost: x\n\n", "GET /health HTTP/1.1\n\n"}) {
    Sock lf(port_);
    ASSERT_TRUE(lf.send_all(bytes));
    r = lf.read_response(3000);
    EXPECT_EQ(status_of(r), 400) << r;
    EXPECT_NE(body_of(r).find("CRLF"), std::string::npos) << r;
  }
  Sock v2(port_);
  ASSERT_TRUE(v2.send_all("GET /health HTTP/2.0\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(status_of(v2.read_response(3000)), 505);
}

TEST(Transport, QueryParamIsPercentDecoded) {
  HttpRequest req;
  req.query = "a=1&model=my%2Fmodel+x&empty=&flag";
  EXPECT_EQ(req.query_param("model"), "my/model x");
  EXPECT_EQ(req.query_param("a"), "1");
  EXPECT_EQ(req.query_param("empty"), "");
  EXPECT_EQ(req.query_param("flag"), "");
  EXPECT_EQ(req.query_param("missing"), "");
}

TEST_F(TransportFixture, PipelinedRequestsAnswerInOrder) {
  start();
  Sock s(port_);
  ASSERT_TRUE(s.send_all("POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nabGET /health HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(body_of(s.read_response()), "2");
  EXPECT_EQ(body_of(s.read_response()), "ok");
}

TEST_F(TransportFixture, MaxRequestsPerConnectionCloses) {
  TransportOptions o;
  o.max_requests_per_connection = 2;
  start(o);
  Sock s(port_);
  s.send_all("GET /health HTTP/1.1\r\n\r\n");
  EXPECT_NE(s.read_response().find("Connection: keep-alive"), std::string::npos);
  s.send_all("GET /health HTTP/1.1\r\n\r\n");
  EXPECT_NE(s.read_response().find("Connection: close"), std::string::npos);
  EXPECT_TRUE(s.wait_closed(3000));
}

TEST_F(TransportFixture, IdleAndHeaderTimeoutsClose) {
  TransportOptions o;
  o.header_timeout_s = 0.3;
  o.idle_timeout_s = 0.3;
  start(o);
  Sock partial(port_);
  partial.send_all("GET /health HTTP/1.1\r\nX-Slow: 1\r\n");
  Sock idle(port_);
  idle.send_all("GET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(status_of(idle.read_response()), 200);
  EXPECT_TRUE(partial.wait_closed(5000));
  EXPECT_TRUE(idle.wait_closed(5000));
  EXPECT_EQ(health().first, 200);
}

TEST_F(TransportFixture, BodyTimeoutCloses) {
  TransportOptions o;
  o.body_timeout_s = 0.3;
  start(o);
  Sock s(port_);
  s.send_all("POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly-part");
  EXPECT_TRUE(s.wait_closed(5000));
}

TEST_F(TransportFixture, PastMaxConnectionsAnImmediate503) {
  TransportOptions o;
  o.max_connections = 4;
  start(o);
  std::vector<std::unique_ptr<Sock>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<Sock>(port_));
    held.back()->send_all("GET /health HTTP/1.1\r\n\r\n");
    ASSERT_EQ(status_of(held.back()->read_response()), 200);  // accepted and kept alive
  }
  EXPECT_EQ(t_->connections(), 4);
  const auto t0 = Clock::now();
  Sock extra(port_);
  const std::string r = extra.read_response(3000);  // without sending anything
  EXPECT_EQ(status_of(r), 503) << r;
  EXPECT_NE(r.find("Retry-After: 1"), std::string::npos);
  EXPECT_LT(ms_since(t0), 100);
  EXPECT_EQ(t_->refused(), 1u);
  held.clear();  // closing them frees the slots
  for (int i = 0; i < 200 && t_->connections() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(health().first, 200);
}

// Each Content-Length / chunked case is answered as soon as it can be
// judged: before any body byte is read where the header decides it.
TEST_F(TransportFixture, ContentLengthAndChunkedAbuseAnsweredAtOnce) {
  TransportOptions o;
  o.max_body_bytes = 1 << 20;
  start(o);
  struct Case {
    const char* name;
    std::string bytes;
    int status;
    bool shut = false;  // the client half-closes after sending
  };
  const std::string post = "POST /echo HTTP/1.1\r\nHost: x\r\n";
  const std::vector<Case> cases = {
      {"negative", post + "Content-Length: -5\r\n\r\n", 400},
      {"non-numeric", post + "Content-Length: abc\r\n\r\n", 400},
      {"hex", post + "Content-Length: 0x10\r\n\r\n", 400},
      {"empty", post + "Content-Length: \r\n\r\n", 400},
      {"two different", post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello", 400},
      {"over the limit", post + "Content-Length: 1048577\r\n\r\n", 413},
      {"huge", post + "Content-Length: 99999999999999999999\r\n\r\n", 400},
      {"2^64-1", post + "Content-Length: 18446744073709551615\r\n\r\n", 413},
      {"shorter than sent, client half-closed", post + "Content-Length: 50\r\n\r\nhello", 400, true},
      {"chunked + content-length",
       post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400},
      {"chunk over the limit", post + "Transfer-Encoding: chunked\r\n\r\n100001\r\n", 413},
      {"chunk size overflow", post + "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n", 400},
      {"chunk size not hex", post + "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400},
      {"unknown transfer-encoding", post + "Transfer-Encoding: gzip\r\n\r\n", 400},
      {"chunk extension flood", post + "Transfer-Encoding: chunked\r\n\r\n1;" + std::string(200000, 'a'), 400},
  };
  for (const auto& c : cases) {
    auto [status, ms] = raw(c.bytes, c.shut);
    EXPECT_EQ(status, c.status) << c.name;
    EXPECT_LT(ms, 100) << c.name;
  }
  // Many small chunks adding up past the limit: 413 once the total passes it.
  {
    Sock s(port_);
    s.send_all(post + "Transfer-Encoding: chunked\r\n\r\n");
    const std::string chunk = "10000\r\n" + std::string(0x10000, 'a') + "\r\n";
    const auto t0 = Clock::now();
    for (int i = 0; i < 17 && s.send_all(chunk); ++i) {
    }
    EXPECT_EQ(status_of(s.read_response()), 413);
    EXPECT_LT(ms_since(t0), 1000);
  }
  // Longer than Content-Length: the rest is read as the next request (400), the first is answered.
  {
    Sock s(port_);
    s.send_all(post + "Content-Length: 2\r\n\r\nhello world\r\n\r\n");
    EXPECT_EQ(body_of(s.read_response()), "2");
    EXPECT_EQ(status_of(s.read_response()), 400);
  }
  EXPECT_EQ(health().first, 200);
}

// Malformed and hostile requests: each is refused (4xx/5xx answer or a
// close) in < 100 ms and /health keeps answering.
TEST_F(TransportFixture, HostileCorpusKeepsServing) {
  start();
  std::string many_headers = "GET /health HTTP/1.1\r\n";
  for (int i = 0; i < 100000; ++i) many_headers += "X-H" + std::to_string(i) + ": v\r\n";
  many_headers += "\r\n";
  std::string many_small = "GET /health HTTP/1.1\r\n";
  for (int i = 0; i < 300; ++i) many_small += "a:\r\n";
  many_small += "\r\n";
  const std::vector<std::pair<const char*, std::string>> corpus = {
      {"garbage", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"},
      {"no version", "GET /health\r\n\r\n"},
      {"bad version", "GET /health HTTP/9.9\r\n\r\n"},
      {"lowercase version", "GET /health http/1.1\r\n\r\n"},
      {"spaces", "GET  /health  HTTP/1.1\r\n\r\n"},
      {"absurd method", std::string(5000, 'M') + " /health HTTP/1.1\r\n\r\n"},
      {"method with control chars", "G\x01T /health HTTP/1.1\r\n\r\n"},
      {"empty request line", "\r\n\r\n\r\n"},
      {"bare LF", "GET /health HTTP/1.1\nHost: x\n\n"},
      {"bare CR", "GET /health HTTP/1.1\rHost: x\r\r"},
      {"nul in target", std::string("GET /hea\0lth HTTP/1.1\r\n\r\n", 26)},
      {"invalid UTF-8 in path", "GET /\xff\xfe\xc3\x28 HTTP/1.1\r\n\r\n"},
      {"invalid UTF-8 in header", "GET /nope HTTP/1.1\r\nX-Name: \xff\xfe\xc3\x28\r\n\r\n"},
      {"header without colon", "GET /health HTTP/1.1\r\nNoColon\r\n\r\n"},
      {"space before colon", "GET /health HTTP/1.1\r\nHost : x\r\n\r\n"},
      {"obs-fold", "GET /health HTTP/1.1\r\nX-A: b\r\n c\r\n\r\n"},
      {"huge header value", "GET /health HTTP/1.1\r\nX-Big: " + std::string(200000, 'v') + "\r\n\r\n"},
      {"huge target", "GET /" + std::string(200000, 'p') + " HTTP/1.1\r\n\r\n"},
      {"100,000 headers", many_headers},
      {"300 tiny headers", many_small},
      {"expect other", "POST /echo HTTP/1.1\r\nContent-Length: 3\r\nExpect: 200-ok\r\n\r\n"},
  };
  for (const auto& [name, bytes] : corpus) {
    int st = 0;
    double ms = 1e9;
    bool closed = false;
    std::string r;
    for (int attempt = 0; attempt < 2 && ms >= 100; ++attempt) {  // a retry only if slow, as raw()
      Sock s(port_);
      const auto t0 = Clock::now();
      s.send_all(bytes);
      r = s.read_response(3000);
      ms = std::min(ms, ms_since(t0));
      st = status_of(r);
      closed = s.closed();
    }
    EXPECT_TRUE(st >= 400 || closed || st == 200) << name << ": " << r.substr(0, 80);
    if (std::string_view(name) != "bare LF" && std::string_view(name) != "spaces" &&
        std::string_view(name) != "invalid UTF-8 in path" && std::string_view(name) != "obs-fold") {
      EXPECT_NE(st, 200) << name;
    }
    EXPECT_LT(ms, 100) << name;
    auto [hs, hms] = health();
    EXPECT_EQ(hs, 200) << "after " << name;
    EXPECT_LT(hms, 1000) << "after " << name;
  }
  // The specific answers the limits promise.
  EXPECT_EQ(raw(many_headers).first, 431);
  EXPECT_EQ(raw(many_small).first, 431);
}

// 500 connections each sending one header line a second (never finishing)
// do not slow /health or a real request down.
TEST_F(TransportFixture, SlowlorisDoesNotStarveOthers) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 1500) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, 4096);
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < 1200) GTEST_SKIP() << "needs ~1100 file descriptors";
  TransportOptions o;
  o.header_timeout_s = 60;  // they stay for the whole test
  start(o);
  constexpr int kSlow = 500;
  std::vector<std::unique_ptr<Sock>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<Sock>(port_));
    ASSERT_TRUE(slow.back()->ok()) << i;
    slow.back()->send_all("GET /health HTTP/1.1\r\n");
  }
  double worst_health = 0, worst_echo = 0;
  int rounds = 0;
  const auto t0 = Clock::now();
  for (int sec = 0; sec < 5; ++sec) {
    for (auto& s : slow) s->send_all("X-Slow-" + std::to_string(sec) + ": 1\r\n");
    for (int k = 0; k < 5; ++k) {
      auto [hs, hms] = health();
      EXPECT_EQ(hs, 200);
      worst_health = std::max(worst_health, hms);
      Sock e(port_);
      const auto t1 = Clock::now();
      e.send_all("POST /echo HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd");
      const std::string r = e.read_response(5000);
      EXPECT_EQ(body_of(r), "4");
      worst_echo = std::max(worst_echo, ms_since(t1));
      ++rounds;
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
    while (ms_since(t0) < 1000.0 * (sec + 1)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(t_->connections(), kSlow);  // all slow ones still held open
  EXPECT_LT(worst_health, 1000);
  EXPECT_LT(worst_echo, 1000);
  std::printf("slowloris: %d slow connections, %d rounds, worst /health %.1f ms, worst POST %.1f ms\n", kSlow, rounds,
              worst_health, worst_echo);
}

TEST_F(TransportFixture, DisconnectRunsTheCancelCallback) {
  start();
  {
    Sock s(port_);
    s.send_all("GET /wait HTTP/1.1\r\n\r\n");
    std::unique_lock lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(5), [&] { return !waiting_.empty(); }));
  }  // the client hangs up
  std::unique_lock lock(mu_);
  EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(2), [&] { return disconnected_; }));
  EXPECT_TRUE(waiting_.front()->peer_gone());
  EXPECT_FALSE(waiting_.front()->send("late"));
}

TEST_F(TransportFixture, StreamingBackPressureIsBounded) {
  TransportOptions o;
  o.stream_high_water_bytes = 256 << 10;
  start(o);
  Sock s(port_);
  int rcv = 64 << 10;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
  s.send_all("GET /stream?n=256 HTTP/1.1\r\n\r\n");             // 16 MiB
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // not reading: the producer must pause
  EXPECT_GT(paused_.load(), 0);
  const std::string r = s.read_response(30000);
  EXPECT_EQ(status_of(r), 200);
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_GT(r.size(), 256u * (64u << 10));
  EXPECT_EQ(r.substr(r.size() - 5), "0\r\n\r\n");
}

// stop(): idle keep-alive and half-sent connections are closed at once,
// run() returns; an exchange in flight still gets its answer.
TEST_F(TransportFixture, StopClosesIdleConnectionsAtOnce) {
  start();
  Sock idle(port_);
  idle.send_all("GET /health HTTP/1.1\r\n\r\n");
  ASSERT_EQ(status_of(idle.read_response()), 200);
  Sock partial(port_);
  partial.send_all("GET /health HTTP/1.1\r\n");
  Sock busy(port_);
  busy.send_all("GET /wait HTTP/1.1\r\n\r\n");
  {
    std::unique_lock lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(5), [&] { return !waiting_.empty(); }));
  }
  const auto t0 = Clock::now();
  t_->stop();
  EXPECT_TRUE(idle.wait_closed(1000));
  EXPECT_TRUE(partial.wait_closed(1000));
  EXPECT_LT(ms_since(t0), 1000);
  {
    std::lock_guard lock(mu_);
    HttpResponse r;
    r.status = 503;
    r.body = "bye";
    waiting_.front()->respond(std::move(r));
    waiting_.clear();
  }
  const std::string r = busy.read_response();
  EXPECT_EQ(status_of(r), 503);
  EXPECT_NE(r.find("Connection: close"), std::string::npos);
  runner_.join();
  EXPECT_LT(ms_since(t0), 2000);
}

TEST(Transport, StopBeforeRunReturnsAtOnce) {
  HttpTransport t(TransportOptions{});
  ASSERT_TRUE(t.bind().has_value());
  t.stop();
  const auto t0 = Clock::now();
  t.run();
  EXPECT_LT(ms_since(t0), 1000);
}

TEST(Transport, BindErrorsNameTheAddress) {
  TransportOptions o;
  o.host = "not-an-ip";
  HttpTransport t(o);
  auto r = t.bind();
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("not-an-ip"), std::string::npos);
}

}  // namespace
}  // namespace bonsai::server
