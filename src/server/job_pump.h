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
#include "engine/chat_output.h"       // ChatOutputParser
#include "engine/inference_engine.h"  // GenerationResult
#include "engine/sampling.h"          // SamplingParams
#include "engine/scheduler.h"         // JobHandle, JobEvent, Clock
#include "server/openai.h"            // ApiError
#include "server/routes_common.h"     // ServerContext
#include "server/transport.h"         // HttpTransport, Exchange
#include "tokenizer/tokenizer.h"      // Tokenizer

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

// A chat request submitted to its model's scheduler by the server's chat
// path (Server's submit_completion), as a route of another dialect needs it.
struct SubmittedChat {
  std::shared_ptr<engine::JobHandle> handle;  // the job (one choice)
  // The chat path's own job state: holds the model while the job runs;
  // dropping the last reference cancels a job still running.
  std::shared_ptr<void> owner;
  int64_t prompt_tokens = 0;                  // tokens of the rendered prompt (usage.input_tokens)
  engine::ChatOutputParser::Options output;   // how the text splits (reasoning, tool calls)
  std::string model;                          // the model id that serves it
  std::function<void(JobProgress&)> account;  // the server's metrics of a finished job
  // What llama.cpp's native routes report (routes_llama.h): the prompt's
  // token ids, the sampling parameters it runs with, the model's tokenizer
  // (shared; outlives the job) and context length.
  std::vector<int32_t> prompt;
  engine::SamplingParams params;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
  int64_t n_ctx = 0;
};
// The writer of a route's error body in its dialect (send_error: OpenAI's).
using ErrorWriter = void (*)(HttpResponse& res, const ApiError& e);

// The answer to one job of the chat path (SubmittedChat, one choice) as the
// routes of other dialects write it (Ollama's /api/chat and /api/generate,
// Anthropic's /v1/messages, /v1/responses): streamed as the text comes, or
// one body at the end. What is the same for all is here: the parser that
// splits the text (reasoning, content, tool calls), flow control on a slow
// client, the error of a job that ended without an answer (a status and one
// body while nothing was streamed; else the dialect's error event and the
// end of the stream), metrics, and releasing the job. As chat completions,
// a stream's status and headers wait for the job's first event, so a job
// that fails while queued is answered with its real status. The route
// writes the rest through the hooks below (called on the pump's run thread).
class ChatJobAnswer : public JobAnswer {
 public:
  void start(JobPump& pump) final { ex_ = &pump.exchange(); }
  bool hold(JobPump& pump) final;
  void on_cut(CutReason why) final;
  bool on_text(const engine::JobEvent& ev) final;
  void finish(JobPump& pump, JobProgress& pr) final;
  std::string missing_result_message() const final { return "the request ended without a result"; }

 protected:
  // `chat` is the route's job's (it outlives this answer: the route keeps
  // the job); `stream` whether the answer is streamed; `write_error` the
  // dialect's error body.
  ChatJobAnswer(SubmittedChat& chat, bool stream, ErrorWriter write_error)
      : chat_(chat), stream_(stream), write_error_(write_error), parser_(chat.output) {}

  // Stream: the status, headers and opening events (once: the first text,
  // or the end of a generation that released none).
  virtual void begin_stream() = 0;
  // One parsed piece of the generation (streamed: as it comes; not: all
  // of it before complete()).
  virtual void take(const engine::ChatOutputDelta& d) = 0;
  // A stream's error event after its headers went (the client still there).
  virtual void stream_error(const ApiError& e) = 0;
  // Before the last bytes of a failed answer (Ollama releases the model
  // there, so a client that sees the answer finds it released).
  virtual void before_error_end() {}
  // A generation that ended well, after every take(): the closing events
  // and end of the stream, or the one body.
  virtual void complete(const engine::GenerationResult& r) = 0;

  // Sends `bytes` on the stream while the client takes them; false once it is gone.
  bool send(const std::string& bytes) { return alive_ && (alive_ = ex_->send(bytes)); }
  bool alive() const { return alive_; }
  bool stream() const { return stream_; }
  Exchange& exchange() { return *ex_; }

 private:
  void open_stream();
  // The job's error, if it ended without an answer.
  std::optional<ApiError> failure(JobPump& pump, const JobProgress& pr) const;

  SubmittedChat& chat_;
  bool stream_;
  ErrorWriter write_error_;
  engine::ChatOutputParser parser_;
  Exchange* ex_ = nullptr;     // the pump's (set by start)
  bool alive_ = true;          // stream: the client still takes bytes
  bool headers_sent_ = false;  // stream: begin_stream() ran
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
void add_job_route(HttpTransport& http, ServerContext& ctx, const std::string& path, JobSubmitter submit,
                   ErrorWriter write_error = send_error);

}  // namespace bonsai::server
