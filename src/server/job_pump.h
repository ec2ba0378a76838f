// The one job pump of the server's routes that wait on a model's scheduler
// (internal to src/server): POST /v1/chat/completions, /v1/completions
// (server.cpp) and /v1/embeddings (routes_tokens.cpp). A route parses,
// admits and submits its job (HTTP threads never run the model); from then
// on a JobPump answers it: the deadline, the registry Server::stop() cuts,
// the client's disconnect, and taking the job's events are written once
// here. What the events become (SSE chunks, one JSON body, embeddings) is
// the route's JobAnswer.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/inference_engine.h"  // GenerationResult
#include "engine/scheduler.h"         // JobHandle, JobEvent, Clock
#include "server/openai.h"            // ApiError
#include "server/routes_common.h"     // ServerContext
#include "server/transport.h"         // HttpTransport, Exchange

namespace bonsai::server {

// Why a job was cut short (kCancelled from the engine).
enum class CutReason { kNone, kClientGone, kShutdown };

// What one job's events came to, choice by choice (completions: choices;
// embeddings: inputs).
struct JobProgress {
  std::vector<std::optional<engine::GenerationResult>> done;  // per choice
  int n_done = 0;
  std::optional<core::Error> failed;
  CutReason cut = CutReason::kNone;
  bool started = false;  // a choice produced an event (it left the queue)
};

// `t` + `seconds`, saturated: a huge or infinite timeout (--timeout inf,
// 1e10: "no timeout") means 10^9 s (~31 years); NaN too; a negative one 0.
// Converting it unclamped to nanoseconds overflowed int64 into a deadline in
// the past, and every request timed out at once.
engine::Clock::time_point deadline_after(engine::Clock::time_point t, double seconds);

// The API error of a job the model's scheduler refused at submit (`e`):
// kResourceExhausted (its queue bound) 503 overloaded naming `model_id`
// (Retry-After 1; counted in kRejected), anything else from_core_error(e, 500).
ApiError submit_refusal(ServerContext& ctx, const std::string& model_id, const core::Error& e);

class JobPump;

// A route's side of a pump: what its job's events become. start() runs on
// the thread that starts the pump (the route's), before the pump can run;
// every other call on the pump's run thread (one call at a time per pump).
class JobAnswer {
 public:
  virtual ~JobAnswer() = default;
  // Once, before any event (a stream sends its headers here).
  virtual void start(JobPump&) {}
  // True while the pump should leave the events waiting (a stream whose
  // client is over its high-water mark: arrange pump.kick() on drain).
  virtual bool hold(JobPump&) { return false; }
  // The pump took a cut request (client gone / shutdown); the job is being cancelled.
  virtual void on_cut(CutReason) {}
  // A text event of an uncancelled job. False: the client is gone (the pump
  // cancels the job and records kClientGone).
  virtual bool on_text(const engine::JobEvent&) { return true; }
  // Every choice is done or the job failed: answer the client (once).
  virtual void finish(JobPump&, JobProgress&) = 0;
  // The failure of a job the scheduler ended without every result
  // (e.g. "the request ended without a result for every choice").
  virtual std::string missing_result_message() const = 0;
};

// Answers one submitted job without a thread of its own: the job's handle
// notifies (JobHandle::set_notify) and the pump then runs on one of the
// transport's worker threads (never two at once for one pump), takes the
// events that are there, hands them to its JobAnswer and returns. A client
// that disconnects (Exchange::on_disconnect) or Server::stop() (through
// ServerContext::cut_all_jobs) cancels the job, which ends within one
// scheduler step. Lives in ServerContext's registry until it has answered.
class JobPump : public std::enable_shared_from_this<JobPump> {
 public:
  // Starts answering `handle` (a job of `n` choices) through `ex` with
  // `answer`: registers the pump in `ctx` (cut at once when the server is
  // already stopping), calls answer->start, subscribes to the job's events
  // and the client's disconnect. `ctx` and `http` outlive the pump.
  static void start(ServerContext& ctx, HttpTransport& http, const std::shared_ptr<Exchange>& ex,
                    std::shared_ptr<engine::JobHandle> handle, int n, std::shared_ptr<JobAnswer> answer);

  JobPump(ServerContext& ctx, HttpTransport& http, std::shared_ptr<Exchange> ex,
          std::shared_ptr<engine::JobHandle> handle, int n, std::shared_ptr<JobAnswer> answer);

  // Asks for a run on a worker (from any thread; cheap).
  void kick();
  // Cancels the job (from any thread): the client left or the server
  // stops. The first reason asked for is kept; the next run cancels the handle.
  void cut(CutReason why);

  Exchange& exchange() { return *ex_; }
  ServerContext& context() { return ctx_; }

 private:
  void run();
  void step();
  void take(std::vector<engine::JobEvent>& evs);
  void finish();

  ServerContext& ctx_;
  HttpTransport& http_;
  std::shared_ptr<Exchange> ex_;
  std::shared_ptr<engine::JobHandle> handle_;
  std::shared_ptr<JobAnswer> answer_;
  std::mutex mu_;                    // guards the three flags below
  bool queued_ = false;              // a run() is posted or running
  bool again_ = false;               // notified while running: run once more
  bool finished_ = false;            // the answer is complete
  std::atomic<int> cut_request_{0};  // CutReason asked for from another thread (disconnect, stop)
  // Run-thread state (one run() at a time).
  JobProgress pr_;
  bool cancelled_ = false;
};

// Registers POST `path`, answered later by a JobPump: a multipart body is a
// 400, a stopping server a 503 shutting_down; otherwise `submit(body, res,
// admitted)` parses, admits and submits the request and returns the job to
// pump, or nullopt with its (error) answer written in `res`. A draining
// server (Server::drain) answers 503 draining before `submit` runs. `ctx` and
// `http` outlive the route. `write_error` writes the route's own errors
// (multipart, stopping, draining) in its dialect: OpenAI's error object by
// default (send_error), Ollama's {"error": "..."} for /api/* (routes_ollama.h),
// Anthropic's error object for /v1/messages (routes_anthropic.h).
struct SubmittedJob {
  std::shared_ptr<engine::JobHandle> handle;
  int n = 1;  // choices (completions) or inputs (embeddings)
  std::shared_ptr<JobAnswer> answer;
};
using JobSubmitter =
    std::function<std::optional<SubmittedJob>(const std::string& body, HttpResponse& res, engine::Clock::time_point)>;
using ErrorWriter = void (*)(HttpResponse& res, const ApiError& e);
void add_job_route(HttpTransport& http, ServerContext& ctx, const std::string& path, JobSubmitter submit,
                   ErrorWriter write_error = send_error);

}  // namespace bonsai::server
