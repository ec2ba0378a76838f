// What the server's route files share (internal to src/server): the state
// every route reads (ServerContext) and the helpers that answer a request
// with JSON or an OpenAI-shaped error.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <expected>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/model_pool.h"  // ModelPool
#include "engine/scheduler.h"   // JobHandle
#include "server/metrics.h"     // MetricsRegistry
#include "server/openai.h"      // ApiError
#include "server/server.h"      // ServerOptions
#include "server/transport.h"   // HttpResponse

namespace bonsai::server {

class JobPump;  // server/job_pump.h

// Seconds since the Unix epoch (OpenAI `created` fields).
int64_t unix_now();

// The server's shared state, owned by Server and outliving every route
// handler (handlers run until Server::stop() has returned).
struct ServerContext {
  ServerContext(std::shared_ptr<engine::ModelPool> m, ServerOptions o) : models(std::move(m)), opt(std::move(o)) {}

  std::shared_ptr<engine::ModelPool> models;
  const ServerOptions opt;
  MetricsRegistry metrics;            // thread-safe
  std::atomic<bool> stopping{false};  // set once by Server::stop()
  // Set once by Server::drain() (SIGTERM): new requests get 503 draining,
  // /health answers 503 "draining", running jobs finish.
  std::atomic<bool> draining{false};
  const int64_t started_unix = unix_now();  // `created` of models without their own
  // The jobs being answered (every route that waits on a scheduler:
  // completions, chat completions, embeddings), each by its JobPump
  // (job_pump.h), owned here until it has answered so nothing outlives the
  // server. Guarded by jobs_mu; jobs_cv is notified whenever a job leaves
  // (Server::drain waits on it for the registry to empty).
  std::mutex jobs_mu;
  std::condition_variable jobs_cv;
  std::set<std::shared_ptr<JobPump>> jobs;
  // Server::stop(): cuts every registered job (its client gets the
  // shutting_down error within one scheduler step). Defined in job_pump.cpp.
  void cut_all_jobs();
};

// Answers `res` with `status` and `body` (invalid UTF-8 replaced).
void send_json(HttpResponse& res, int status, const nlohmann::json& body);
// Answers `res` with the OpenAI error object of `e` (and Retry-After when set).
void send_error(HttpResponse& res, const ApiError& e);
// The API error of an engine / pool error: kInvalidArgument and
// kOutOfRange 400, kNotFound 404, kResourceExhausted / kTimeout / kCancelled
// 503 overloaded, anything else `default_status` (a server_error when >= 500).
ApiError from_core_error(const core::Error& e, int default_status = 400);

// The models a request may name, sorted: registered ones (loadable on
// demand) and resident ones; a failed load of an unregistered id is not one.
std::vector<std::string> served_model_ids(const engine::ModelPool& pool);

// The context, in tokens, model `id` is served with, or would be once
// loaded: a resident model's n_ctx; a registered one's ctx-size, or when
// that is 0 (the model's own) min(<arch>.context_length of its GGUF,
// engine::kDefaultMaxSeqLen), as InferenceEngine::create resolves it, read
// from the file's header (mapped and parsed, no weights loaded; cached per
// path, size and mtime). 0 when unknown (no such model, unreadable file).
int64_t served_context_length(const engine::ModelPool& pool, const std::string& id);

// A model held for one request (ModelPool::acquire; a registered model
// loads on demand): `id` empty means ctx.opt.default_model. While exactly
// one model is served (served_model_ids) any other name means that model,
// as llama-server answers whatever name a request gives, unless
// ServerOptions::strict_model_names; the handle's LoadedModel::id is the
// model that serves it (what answers report). Errors in the
// API's terms: 400 no model named and no default, 404 model_not_found (an id
// that names no model), 503 model_loading / insufficient_capacity, 500
// model_load_failed. The handle gives the model back when dropped.
std::expected<engine::ModelHandle, ApiError> acquire_model(ServerContext& ctx, const std::string& id);

// The answer to a request refused because the server is draining
// (Server::drain, SIGTERM): 503 draining, Retry-After 5 (another instance,
// or this one once restarted, will take it).
ApiError draining_error();

// The error of a scheduler job that was cut (a choice ended kCancelled, or
// the job failed kCancelled): 499 client_closed_request when the cut was the
// client leaving (`client_gone`; nobody reads it, it labels the request in
// /metrics, as nginx's 499), else 503 shutting_down (Retry-After 5).
ApiError job_cut_error(bool client_gone);

// The error of a scheduler job of model `model_id` that failed before it
// produced an answer (JobEvent::kFailed, scheduler.h), for `what` (e.g.
// "its embeddings"): kTimeout (still queued at its deadline) 503 timeout
// (Retry-After 1); kCancelled job_cut_error(client_gone); kResourceExhausted (the
// model's engine pool closed before the job started) 503 shutting_down when
// the server stops, 503 draining (draining_error) while it drains, else 503 model_unloaded (the model was unloaded or
// evicted meanwhile; sending the request again loads it again; Retry-After
// 1); anything else from_core_error(e, 500).
ApiError job_failure_error(const ServerContext& ctx, const core::Error& e, const std::string& model_id,
                           bool client_gone);

}  // namespace bonsai::server
