// The OpenAI-compatible HTTP server: the Server class, request
// authorization, and the completion routes (POST /v1/chat/completions,
// POST /v1/completions: admission, the scheduler job, SSE framing). See
// server.h. Transport: transport.*; model, health, metrics and admin routes:
// routes_admin.*; metric families: metrics.*.
#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat_output.h"       // reasoning / tool-call split of chat answers
#include "engine/inference_engine.h"  // GenerationResult, finish_reason_name
#include "engine/scheduler.h"         // Scheduler, CompletionJob, JobHandle
#include "server/openai.h"            // request parsing, response builders, ApiError
#include "server/routes_admin.h"      // add_admin_routes
#include "server/routes_common.h"     // ServerContext, send_json, send_error
#include "server/transport.h"         // HttpTransport
#include "tokenizer/tokenizer.h"      // Tokenizer::encode_chat / encode_prompt

namespace bonsai::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace metric;

namespace {

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

// The route a path belongs to (bounded label values for /metrics).
std::string route_label(const std::string& path) {
  static const std::set<std::string> known = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                              "/health",              "/metrics",        "/admin/models",
                                              "/admin/models/load",   "/admin/models/unload"};
  if (known.contains(path)) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
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
  ClientProbe client;  // the connection (disconnect checks)

  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    if (handle) handle->cancel();
    handle.reset();
    if (model) pool->release(model);
  }
};

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
  ServerContext ctx;
  HttpTransport http;

  Impl(std::shared_ptr<engine::ModelPool> m, ServerOptions o)
      : ctx(std::move(m), std::move(o)),
        http(TransportOptions{.threads = ctx.opt.http_threads > 0 ? ctx.opt.http_threads : 64,
                              .max_body_bytes = ctx.opt.max_body_bytes,
                              .keep_alive_s = 5,
                              .listen_backlog = 1024}) {
    declare_server_metrics(ctx.metrics);
    setup();
  }

  bool authorized(const HttpRequest& req) const {
    if (ctx.opt.api_key.empty()) return true;
    std::string h = req.get_header_value("Authorization");
    // RFC 7235 section 2.1: the auth scheme is case-insensitive ("bearer KEY" is valid).
    constexpr std::string_view kScheme = "bearer ";
    if (h.size() < kScheme.size()) return false;
    for (size_t i = 0; i < kScheme.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(h[i])) != kScheme[i]) return false;
    const std::string_view key = std::string_view(h).substr(kScheme.size());
    const std::string& want = ctx.opt.api_key;
    if (key.size() != want.size()) return false;
    unsigned diff = 0;  // constant time in the key's length
    for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(key[i] ^ want[i]);
    return diff == 0;
  }

  void setup() {
    http.set_pre_routing([this](const HttpRequest& req, HttpResponse& res) {
      const bool protected_route = req.path.rfind("/v1/", 0) == 0 || req.path.rfind("/admin/", 0) == 0;
      if (!protected_route || authorized(req)) return false;
      ApiError e;
      e.status = 401;
      e.code = "invalid_api_key";
      e.message = req.has_header("Authorization")
                      ? "Incorrect API key provided."
                      : "You didn't provide an API key. Provide it in the Authorization header (Authorization: "
                        "Bearer YOUR_KEY).";
      send_error(res, e);
      return true;
    });

    // OpenAI-shaped bodies for errors the transport produces itself (404
    // unknown route, 413 body too large, 400 unreadable request).
    http.set_error_writer([](const HttpRequest& req, HttpResponse& res) {
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
    });

    http.set_exception_writer([](HttpResponse& res, const std::string& what) {
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = "Internal error: " + what;
      send_error(res, e);
    });

    http.set_logger([this](const HttpRequest& req, const HttpResponse& res) {
      ctx.metrics.inc(kRequests, {{"route", route_label(req.path)}, {"status", std::to_string(res.status)}});
    });

    auto bad_body = [](const HttpRequest&, HttpResponse& res) {
      send_error(res, bad_request("The request body must be JSON (got multipart/form-data).", {}, "invalid_json"));
    };
    http.post_json(
        "/v1/chat/completions",
        [this](const HttpRequest& req, const std::string& body, HttpResponse& res) {
          handle_completion(req, body, res, Endpoint::kChat);
        },
        bad_body);
    http.post_json(
        "/v1/completions",
        [this](const HttpRequest& req, const std::string& body, HttpResponse& res) {
          handle_completion(req, body, res, Endpoint::kCompletion);
        },
        bad_body);
    add_admin_routes(http, ctx);
  }

  // ---- completions --------------------------------------------------------

  void handle_completion(const HttpRequest& req, const std::string& body_text, HttpResponse& res,
                         Endpoint endpoint) {
    if (ctx.stopping) return send_error(res, overloaded("The server is shutting down.", "shutting_down", 5));
    const Clock::time_point admitted = Clock::now();
    CompletionRequest cr;
    if (auto e = parse_completion_request(body_text, endpoint, cr)) return send_error(res, *e);

    auto job = std::make_shared<Job>();
    job->pool = ctx.models;
    job->admitted = admitted;
    job->deadline = deadline_after(admitted, ctx.opt.timeout_s);
    const std::string model_id = cr.model.empty() ? ctx.opt.default_model : cr.model;
    if (model_id.empty()) return send_error(res, bad_request("You must provide a model parameter.", "model"));

    // The model: 404 unknown, 503 loading; a registered model loads on demand here.
    auto model = ctx.models->acquire(model_id);
    if (!model) {
      const core::Error& err = model.error();
      // 404 only for an id that names no model: a registered model whose
      // file fails to load (e.g. a missing GGUF key, also kNotFound) is a
      // server-side failure.
      if (err.code == core::Errc::kNotFound && !ctx.models->is_registered(model_id)) {
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
        for (const auto& m : ctx.models->list())
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
    p.grammar = cr.grammar;  // structured outputs (server/structured_output.h)
    if (auto v = p.validate(); !v) return send_error(res, bad_request(v.error().message));
    job->params = std::move(p);
    job->seed = cr.seed ? *cr.seed : ctx.opt.default_seed ? *ctx.opt.default_seed : fresh_seed();
    job->n = cr.n;
    job->include_usage = cr.include_usage;
    job->output.parse_reasoning = endpoint == Endpoint::kChat && ctx.opt.parse_reasoning;
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
    auto handle = lm.scheduler->submit(std::move(cj), static_cast<size_t>(std::max(1, ctx.opt.queue_factor)) *
                                                         static_cast<size_t>(lm.pool->size()));
    if (!handle) {
      if (handle.error().code == core::Errc::kResourceExhausted) {
        ctx.metrics.inc(kRejected, {{"model", model_id}});
        return send_error(res, overloaded("Model '" + model_id + "' is overloaded: " + handle.error().message +
                                              ". Retry later.",
                                          "overloaded", 1));
      }
      return send_error(res, from_core_error(handle.error(), 500));
    }
    job->handle = std::move(*handle);
    job->client = http.client_of(req);
    ctx.metrics.inc(kPromptTokens, {{"model", model_id}}, static_cast<double>(n_prompt) * job->n);

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
      if (ctx.stopping) {
        pr.cut = CutReason::kShutdown;
        cancelled = true;
        job.handle->cancel();
      } else if (job.client.closed()) {
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
      ctx.metrics.inc(kCompletionTokens, {{"model", model}}, r.completion_tokens);
      if (i == 0 && r.rate.tokens > 0) ctx.metrics.observe(kTtft, {{"model", model}}, r.rate.ttft_ms / 1000.0);
      if (i == 0) ctx.metrics.observe(kQueueWait, {{"model", model}}, r.rate.queue_ms / 1000.0);
      for (double gap : r.rate.itl_ms) ctx.metrics.observe(kItl, {{"model", model}}, gap / 1000.0);
      if (r.timed_out) ctx.metrics.inc(kCancelled, {{"reason", "timeout"}});
    }
    if (pr.failed && pr.failed->code == core::Errc::kCancelled && pr.cut == CutReason::kNone)
      pr.cut = ctx.stopping ? CutReason::kShutdown : CutReason::kClientGone;
    bool any_cancelled = pr.failed && pr.failed->code == core::Errc::kCancelled;
    for (const auto& d : pr.done) any_cancelled = any_cancelled || (d && d->finish_reason == engine::FinishReason::kCancelled);
    if (any_cancelled) {
      if (pr.cut == CutReason::kNone) pr.cut = ctx.stopping ? CutReason::kShutdown : CutReason::kClientGone;
      ctx.metrics.inc(kCancelled, {{"reason", pr.cut == CutReason::kClientGone ? "client_gone" : "shutdown"}});
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
        return ctx.stopping ? overloaded("The server is shutting down.", "shutting_down", 5)
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
  void run_blocking(HttpResponse& res, Job& job) {
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

  void start_stream(HttpResponse& res, std::shared_ptr<Job> job) {
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    HttpTransport::stream(res, "text/event-stream", [this, job](StreamSink& sink) {
      auto write = [&](const std::string& s) { return sink.write(s); };
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
          if (!alive || !sink.writable()) return alive = false;
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
    });
  }
};

Server::Server(std::shared_ptr<engine::ModelPool> models, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(models), std::move(options))) {}

Server::~Server() { stop(); }

core::Expected<int> Server::bind() { return impl_->http.bind(impl_->ctx.opt.host, impl_->ctx.opt.port); }

void Server::run() { impl_->http.run(); }

// Cancels in-flight generations (`stopping`, seen by each request's pump
// within 20 ms) and closes the pools before the transport stops, so the
// requests in flight answer with the shutdown error and run() returns.
void Server::stop() {
  if (!impl_) return;
  impl_->ctx.stopping = true;
  impl_->ctx.models->close_all();
  impl_->http.stop();
}

MetricsRegistry& Server::metrics() { return impl_->ctx.metrics; }

}  // namespace bonsai::server
