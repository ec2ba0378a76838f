// The OpenAI-compatible HTTP server behind `bonsai serve` (transport:
// transport.h; completion routes: server.cpp; /tokenize, /detokenize and
// /v1/embeddings: routes_tokens.h; the others: routes_admin.h; the one job
// pump of the routes that wait on a scheduler: job_pump.h).
//
// Routes: POST /v1/chat/completions, POST /v1/completions, POST
// /v1/embeddings, POST /tokenize, POST /detokenize, GET /v1/models,
// GET /v1/models/{id}, llama.cpp's POST /completion, POST /infill, GET
// /props, GET /slots (routes_llama.h), GET /health (HEAD too, as every GET
// route), GET /metrics (Prometheus text), GET /
// (the web chat page), and the admin routes GET /admin/models, POST
// /admin/models/load (202, background load; 400 before anything is allocated
// when ctx_size exceeds the model's context or the KV caches it implies
// exceed the memory limit, see ServerOptions::admin_mem_limit_bytes), POST
// /admin/models/unload.
//
// One request: parse + validate (400) -> ModelPool::acquire (404 unknown,
// 503 loading; the handle is held until the answer is written) ->
// engine::prepare_completion (chat template, encoding, context check: 400
// context_length_exceeded; sampling parameters) -> the model's
// engine::Scheduler: submit (503 + Retry-After when the scheduler's queue
// bound, ModelSpec::queue_factor x its sequence slots, is reached); the step
// loop runs it batched with the model's other requests, and its events are
// streamed (SSE; the status and headers go with the job's first event, so a
// stream that fails while queued gets its real status, e.g. 503 +
// Retry-After) or collected into one body. A request still
// queued at its deadline is a 503 "timeout"; one that reaches the deadline
// while generating returns what it produced with finish_reason "length"
// and "timed_out": true on its choice (a max_tokens "length" has no such field).
// A request without `seed` gets ServerOptions::default_seed or a fresh
// random one; usage.prompt_tokens_details.cached_tokens says how much of the
// prompt came from the prompt cache.
//
// No thread waits per request: a submitted job's events are read as they
// come (JobHandle::set_notify) on the transport's worker threads, which
// write SSE chunks or the final body (transport.h: event-driven Boost.Beast,
// bounded connections, header/body timeouts). A client that disconnects
// (seen on the socket itself), a shutdown, or a dropped job cancels it: it
// stops within one scheduler step whether queued, prefilling or decoding.
// Before tokenizing, a full queue is a 503 and an over-long prompt text a
// 400 (ServerOptions::max_prompt_bytes). stop() cancels in-flight
// generations, closes the pools, stops the listener and closes idle
// keep-alive connections.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "engine/load_fit.h"    // available_memory_bytes
#include "engine/model_pool.h"  // ModelPool, ModelSpec
#include "server/metrics.h"     // MetricsRegistry

namespace bonsai::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (see bind())
  std::string api_key;  // non-empty: /v1 and /admin need "Authorization: Bearer KEY"
  // With no api_key on a non-loopback host (is_loopback_host), /admin/*
  // answers 403 admin_forbidden unless this is set (`serve --admin-open`):
  // loading files by path is not for the network at large (DESIGN.md).
  bool admin_open = false;
  size_t max_body_bytes = 4u << 20;  // larger bodies: 413
  double timeout_s = 600;            // per request: waiting for an engine + generating
  int http_threads = 0;              // worker threads running route handlers; 0: 8
  // Open connections served at once; past it a new connection gets an
  // immediate 503 and is closed (`serve --max-connections`). 0: 1024.
  int max_connections = 0;
  // Socket time limits in seconds (`serve --header-timeout`, `--body-timeout`,
  // `--keep-alive-timeout`, `--write-timeout`; see TransportOptions): the
  // whole request header, the whole body once the header is in, the wait for
  // a keep-alive connection's next request, one write making no progress.
  // Past one the connection is closed. 0: the transport's default (10, 30,
  // 5, 60).
  double header_timeout_s = 0;
  double body_timeout_s = 0;
  double idle_timeout_s = 0;
  double write_timeout_s = 0;
  // Bytes of prompt text (a completion's prompt, a chat's rendered
  // messages) tokenized at most; more is a 400 context_length_exceeded
  // naming the limit, before any tokenization. 0: 32 bytes per context
  // position of the model, at least 64 KiB.
  size_t max_prompt_bytes = 0;
  std::string default_model;  // used when a request names no model
  // While one model is served, a request naming another model gets that
  // one (llama-server's habit: clients send "gpt-4o" or any name); true
  // (`serve --strict-model-names`): an unknown name is a 404 model_not_found.
  bool strict_model_names = false;
  engine::ModelSpec default_spec;  // pool size / context / sampling for admin loads
  // Seed of requests that give none (`serve --seed`, reproducible
  // deployments); unset: a fresh random seed per request.
  std::optional<uint64_t> default_seed;
  // Chat answers: <think>...</think> returned as reasoning_content
  // (llama-server's --reasoning-format deepseek, the default); false: the
  // raw text stays in content (--reasoning-format none).
  bool parse_reasoning = true;
  // CORS (--cors-origin / config cors-origin; off when empty): "*" or a
  // comma-separated list of origins. Every answer to a request from an
  // allowed origin carries Access-Control-Allow-Origin ("*", or that origin
  // plus Vary: Origin), and a preflight (OPTIONS) is answered 204 with the
  // allowed methods (GET, POST, OPTIONS) and headers (those the preflight
  // asks for, else Authorization, Content-Type), before authorization.
  std::string cors_origin;
  // POST /admin/models/load when the ModelPool has no memory budget: the
  // most KV-cache bytes (all replicas) one load may allocate. 0: the
  // machine's MemAvailable (/proc/meminfo) at the time of the request. With
  // a budget, the model's whole estimate (mapping + KV caches) must fit it.
  uint64_t admin_mem_limit_bytes = 0;
};

// MemAvailable from /proc/meminfo in bytes (engine/load_fit.h).
using engine::available_memory_bytes;

class Server {
 public:
  // `models` is shared with the caller (which registers and preloads models).
  Server(std::shared_ptr<engine::ModelPool> models, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket. Returns the port (the chosen one when
  // options.port is 0). Errors: kIo naming host:port.
  core::Expected<int> bind();
  // Serves until stop(). Call after bind().
  void run();
  // Graceful shutdown, callable from any thread (e.g. a signal thread):
  // stops accepting, cancels in-flight generations at their next decode
  // step (their clients get the "shutting_down" error), closes every engine
  // pool and every idle keep-alive connection, and makes run() return once
  // the requests in flight have answered (within a decode step; with none,
  // at once rather than after the 5 s keep-alive wait). Idempotent.
  // For a second signal forcing exit, see ShutdownSignals (shutdown.h).
  void stop();
  // Drain, then stop() (the first SIGTERM/SIGINT of `bonsai serve`; blocks
  // the calling thread up to `timeout_s` seconds): at once, every POST
  // (completions, embeddings, admin, tokenize) is answered 503 "draining"
  // with Retry-After 5 and GET /health 503 {"status": "draining"} (the
  // listener stays open so load balancers and probes see that); requests
  // still queued in a model's scheduler get the same 503 (at the latest
  // when a running sequence of that model ends and frees its slot);
  // requests already running finish. Once no request is being answered, or
  // after `timeout_s` (then what still runs is cancelled, its client gets
  // the shutting_down error), stop() runs and run() returns. A stop()
  // from another thread ends the wait early. Idempotent.
  void drain(double timeout_s);

  MetricsRegistry& metrics();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bonsai::server
