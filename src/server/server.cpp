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
#include <expected>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat_output.h"       // reasoning / tool-call split of chat answers
#include "engine/completion.h"        // prepare_completion
#include "engine/inference_engine.h"  // GenerationResult, finish_reason_name
#include "engine/scheduler.h"         // Scheduler, CompletionJob, JobHandle
#include "server/config.h"            // is_loopback_host
#include "server/job_pump.h"          // JobPump, add_job_route, deadline_after
#include "server/openai.h"            // request parsing, response builders, ApiError
#include "server/routes_admin.h"      // add_admin_routes
#include "server/routes_anthropic.h"  // add_anthropic_routes, send_anthropic_error
#include "server/routes_common.h"     // ServerContext, send_json, send_error, acquire_model
#include "server/routes_llama.h"      // add_llama_routes, build_fim_prompt
#include "server/routes_ollama.h"     // add_ollama_routes, send_ollama_error
#include "server/routes_responses.h"  // add_responses_routes, SubmittedChat
#include "server/routes_template.h"   // add_template_routes
#include "server/routes_tokens.h"     // add_token_routes
#include "server/structured_output.h"
#include "server/transport.h"     // HttpTransport
#include "tokenizer/tokenizer.h"  // Tokenizer

namespace bonsai::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace metric;

namespace {

// The route a path belongs to (bounded label values for /metrics).
std::string route_label(const std::string& path) {
  static const std::set<std::string> known = {
      "/v1/chat/completions", "/v1/completions",      "/v1/models",     "/health",   "/metrics",    "/admin/models",
      "/admin/models/load",   "/admin/models/unload", "/v1/embeddings", "/tokenize", "/detokenize", "/apply-template",
      "/chat/completions",    "/embeddings",          "/models"};  // llama-server's names without /v1
  if (known.contains(path) || is_llama_route(path)) return path;
  if (path == "/v1/responses" || path == "/v1/messages" || path == "/v1/messages/count_tokens") return path;
  if (path.rfind("/api/", 0) == 0) {  // Ollama's API: its known routes, every other path as one
    static const std::set<std::string> ollama = {"/api/version", "/api/tags",       "/api/show",
                                                 "/api/ps",      "/api/chat",       "/api/generate",
                                                 "/api/embed",   "/api/embeddings", "/api/pull"};
    return ollama.contains(path) ? path : "/api/other";
  }
  if (path.rfind("/v1/responses/", 0) == 0) return "/v1/responses/{id}";
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

// The writer of an error answered on `path`: Ollama's API (/api/*) and
// Anthropic's routes (/v1/messages and below) answer errors in their own
// shapes, everything else in OpenAI's.
ErrorWriter error_writer(std::string_view path) {
  if (path.starts_with("/api/")) return send_ollama_error;
  if (is_anthropic_path(path)) return send_anthropic_error;
  return send_error;
}

// True when a chat request's prompt is rendered with thinking off although
// it asked for it: a grammar constrains the answer (forced tool call,
// response_format) and the template would open the reasoning itself
// (Qwen3.5), so the grammar holds from the answer's first token. The one rule
// for submitting a chat (Server::Impl::submit_completion) and counting its
// prompt (count_chat_prompt).
bool thinks_off_for_grammar(const CompletionRequest& cr, const tokenizer::ChatTemplate& tmpl,
                            const tokenizer::ChatOptions& rendering) {
  const bool constrained = cr.sampling.grammar.has_value() && *cr.sampling.grammar != nullptr;
  return constrained && tmpl.prompt_opens_reasoning(rendering);
}

// One admitted completion request: what the handler prepared and its
// CompletionAnswer (which runs after the handler returns, from the job's
// JobPump) still needs. Dropping it cancels the job if it is still running
// (its slot comes back within a step), then releases the model.
struct Job {
  std::shared_ptr<engine::ModelPool> pool;  // outlives `model` (declared first)
  engine::ModelHandle model;
  std::shared_ptr<engine::JobHandle> handle;  // set once submitted to the model's scheduler
  std::vector<int32_t> prompt;                // the prompt (batched completions: the first one)
  engine::SamplingParams params;              // seed included (choice i: params.seed + i)
  int n = 1;                                  // choices in all (batched completions: prompts * the request's n)
  int64_t prompt_tokens = 0;                  // usage.prompt_tokens: each prompt's tokens once (summed over a batch)
  int per_prompt = 1;  // choices per prompt (the request's n): choice i answers prompt i / per_prompt
  bool include_usage = false;
  bool stream = false;    // answered as Server-Sent Events
  int32_t logprobs = -1;  // < 0: no logprobs; else top alternatives per token
  bool echo = false;      // completions: the prompt text precedes the answer
  // Per prompt (one, or a batch's each): its text as its tokens spell it
  // (echo), and its tokens' bytes (legacy text_offset of the first answer token).
  std::vector<std::string> echo_text;
  std::vector<int64_t> prompt_bytes;
  // Bytes the prompt's tokens spell before the echoed text (SentencePiece's
  // dummy-prefix space of a text prompt echoed as sent): the echoed tokens'
  // text_offset starts that far below 0 (clamped to 0).
  std::vector<int64_t> echo_shift;
  // Of choice i's prompt.
  const std::string& echo_of(int i) const { return echo_text[static_cast<size_t>(i / per_prompt)]; }
  int64_t prompt_bytes_of(int i) const { return prompt_bytes[static_cast<size_t>(i / per_prompt)]; }
  int64_t echo_shift_of(int i) const { return echo_shift[static_cast<size_t>(i / per_prompt)]; }
  // Chat: how the generated text splits into reasoning / content / tool calls.
  engine::ChatOutputParser::Options output;
  ResponseMeta meta;
  Clock::time_point admitted;
  Clock::time_point deadline;

  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    if (handle) handle->cancel();
    handle.reset();
    model.release();
  }
};

}  // namespace

struct Server::Impl {
  struct CompletionAnswer;
  ServerContext ctx;
  // Last member: destroyed first, so its worker threads (which run the
  // job pumps) are joined while everything they touch is still there.
  HttpTransport http;

  Impl(std::shared_ptr<engine::ModelPool> m, ServerOptions o)
      : ctx(std::move(m), std::move(o)), http(transport_options(ctx.opt)) {
    declare_server_metrics(ctx.metrics);
    setup();
  }

  // Bytes of prompt text tokenized at most for a model of `n_ctx` positions.
  size_t max_prompt_bytes(int64_t n_ctx) const {
    if (ctx.opt.max_prompt_bytes > 0) return ctx.opt.max_prompt_bytes;
    return std::max<size_t>(size_t{64} << 10, static_cast<size_t>(std::max<int64_t>(n_ctx, 0)) * 32);
  }

  static TransportOptions transport_options(const ServerOptions& o) {
    TransportOptions t;
    t.host = o.host;
    t.port = o.port;
    t.worker_threads = o.http_threads > 0 ? o.http_threads : 8;
    t.max_connections = o.max_connections > 0 ? o.max_connections : 1024;
    t.max_body_bytes = o.max_body_bytes;
    if (o.header_timeout_s > 0) t.header_timeout_s = o.header_timeout_s;
    if (o.body_timeout_s > 0) t.body_timeout_s = o.body_timeout_s;
    if (o.idle_timeout_s > 0) t.idle_timeout_s = o.idle_timeout_s;
    if (o.write_timeout_s > 0) t.write_timeout_s = o.write_timeout_s;
    return t;
  }

  // The key, from "Authorization: Bearer KEY" (OpenAI) or "x-api-key: KEY"
  // (Anthropic's header, docs.anthropic.com/en/api/overview): either one
  // that holds the key is enough, on every protected route. Both carry the
  // same secret, compared the same way, so the second header opens nothing
  // the first does not; and a client set up for Anthropic (which sends only
  // x-api-key) can also list /v1/models.
  bool authorized(const HttpRequest& req) const {
    if (ctx.opt.api_key.empty()) return true;
    if (req.has_header("x-api-key") && key_matches(req.header("x-api-key"))) return true;
    std::string h = req.header("Authorization");
    // RFC 7235 section 2.1: the auth scheme is case-insensitive ("bearer KEY" is valid).
    constexpr std::string_view kScheme = "bearer ";
    if (h.size() < kScheme.size()) return false;
    for (size_t i = 0; i < kScheme.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(h[i])) != kScheme[i]) return false;
    return key_matches(std::string_view(h).substr(kScheme.size()));
  }
  // True when `key` is ctx.opt.api_key (non-empty), compared in constant time in its length.
  bool key_matches(std::string_view key) const {
    const std::string& want = ctx.opt.api_key;
    if (key.size() != want.size()) return false;
    unsigned diff = 0;  // constant time in the key's length
    for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(key[i] ^ want[i]);
    return diff == 0;
  }

  // No key on a network-facing host: the admin routes stay closed unless
  // opened on purpose (ServerOptions::admin_open).
  bool admin_closed(const HttpRequest& req) const {
    return req.path.rfind("/admin/", 0) == 0 && ctx.opt.api_key.empty() && !ctx.opt.admin_open &&
           !is_loopback_host(ctx.opt.host);
  }

  // CORS (ServerOptions::cors_origin): the request's Origin when it is
  // allowed ("*" when any is), else empty (no CORS headers: the browser
  // refuses the answer).
  std::string cors_allowed(const HttpRequest& req) const {
    const std::string& allowed = ctx.opt.cors_origin;
    if (allowed.empty() || !req.has_header("Origin")) return {};
    if (allowed == "*") return allowed;
    const std::string origin = req.header("Origin");
    for (size_t b = 0; b <= allowed.size();) {
      size_t e = allowed.find(',', b);
      if (e == std::string::npos) e = allowed.size();
      std::string item = allowed.substr(b, e - b);
      std::erase_if(item, [](unsigned char c) { return std::isspace(c); });
      if (!item.empty() && item == origin) return origin;
      b = e + 1;
    }
    return {};
  }

  // A CORS preflight (OPTIONS with Access-Control-Request-Method from an
  // allowed origin): answered 204 with the allowed methods and headers
  // (Access-Control-Allow-Origin comes from the header decorator).
  bool cors_preflight(const HttpRequest& req, HttpResponse& res) const {
    if (req.method != "OPTIONS" || !req.has_header("Access-Control-Request-Method") || cors_allowed(req).empty())
      return false;
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    const std::string asked = req.header("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers", asked.empty() ? std::string("Authorization, Content-Type") : asked);
    res.set_header("Access-Control-Max-Age", "86400");
    return true;
  }

  void setup() {
    if (!ctx.opt.cors_origin.empty()) {
      http.set_header_decorator([this](const HttpRequest& req, std::vector<std::pair<std::string, std::string>>& h) {
        const std::string origin = cors_allowed(req);
        if (origin.empty()) return;
        h.emplace_back("Access-Control-Allow-Origin", origin);
        if (origin != "*") h.emplace_back("Vary", "Origin");
      });
    }
    http.set_pre_routing([this](const HttpRequest& req, HttpResponse& res) {
      if (cors_preflight(req, res)) return true;  // before authorization: a preflight carries no credentials
      const bool ollama = req.path.rfind("/api/", 0) == 0;
      const auto write_error = error_writer(req.path);
      if (ctx.draining && req.method == "POST") {  // no new work while draining (GET /health says so)
        write_error(res, draining_error());
        return true;
      }
      const bool protected_route = req.path.rfind("/v1/", 0) == 0 || req.path.rfind("/admin/", 0) == 0 || ollama ||
                                   req.path == "/tokenize" || req.path == "/detokenize" ||
                                   req.path == "/chat/completions" || req.path == "/embeddings" ||
                                   req.path == "/models" || req.path == "/apply-template" || is_llama_route(req.path);
      if (!protected_route) return false;
      ApiError e;
      if (!authorized(req)) {
        e.status = 401;
        e.code = "invalid_api_key";
        e.message = req.has_header("Authorization") || req.has_header("x-api-key")
                        ? "Incorrect API key provided."
                        : "You didn't provide an API key. Provide it in the Authorization header (Authorization: "
                          "Bearer YOUR_KEY) or the x-api-key header.";
      } else if (admin_closed(req)) {
        e.status = 403;
        e.code = "admin_forbidden";
        e.message = "The admin routes need an API key when the server listens on " + ctx.opt.host +
                    " (start it with --api-key, or --admin-open to allow them without one).";
      } else {
        return false;
      }
      write_error(res, e);
      return true;
    });

    // Bodies for errors the transport produces itself (404 unknown route,
    // 413 body too large, 431 header too large, 400 unreadable request, 503
    // too many connections, 500 a handler threw), in the shape of the API
    // the path belongs to as pre-routing's: Ollama's under /api/,
    // Anthropic's under /v1/messages, else OpenAI's.
    http.set_error_body([](int status, const std::string& message, const std::string& path) {
      ApiError e;
      e.status = status;
      e.message = message;
      if (status == 413) {
        e.code = "request_too_large";
      } else if (status == 404) {
        e.code = "unknown_url";
      } else if (status == 405) {
        e.code = "method_not_allowed";
      } else if (status == 415) {
        e.code = "unsupported_media_type";
      } else if (status == 431) {
        e.code = "request_header_fields_too_large";
      } else if (status == 503) {
        e = overloaded(message, "too_many_connections", 1);
      } else if (status >= 500) {
        e.type = "server_error";
      } else {
        e.code = "invalid_request";
      }
      HttpResponse res;
      error_writer(path)(res, e);
      return res;
    });

    http.set_logger([this](const HttpRequest& req, int status) {
      ctx.metrics.inc(kRequests, {{"route", route_label(req.path)}, {"status", std::to_string(status)}});
    });

    // The completion routes answer later, from their job's JobPump.
    // /chat/completions: llama-server's name without /v1 (its /completions
    // is the native /completion, routes_llama).
    for (const auto& [path, endpoint] :
         {std::pair{"/v1/chat/completions", Endpoint::kChat}, std::pair{"/chat/completions", Endpoint::kChat},
          std::pair{"/v1/completions", Endpoint::kCompletion}}) {
      add_job_route(http, ctx, path,
                    [this, endpoint](const std::string& body, HttpResponse& res, Clock::time_point admitted) {
                      return handle_completion(body, res, endpoint, admitted);
                    });
    }
    add_admin_routes(http, ctx);
    add_token_routes(http, ctx);
    add_template_routes(http, ctx);
    // POST /v1/responses, Ollama's /api/chat and /api/generate,
    // Anthropic's /v1/messages and llama.cpp's /completion and /infill:
    // translated into a chat (or completions) request, prepared and
    // submitted as chat completions are.
    const ChatSubmitter submit = [this](CompletionRequest cr, Clock::time_point admitted) {
      return submit_chat(std::move(cr), admitted);
    };
    add_responses_routes(http, ctx, submit);
    add_ollama_routes(http, ctx, submit);
    // llama.cpp's own routes (/completion, /infill, /props, /slots).
    add_llama_routes(http, ctx, submit);
    // Anthropic's also counts a prompt's tokens (/v1/messages/count_tokens).
    add_anthropic_routes(http, ctx, submit, [this](CompletionRequest cr) { return count_chat_prompt(cr); });
  }

  // The chat path as another dialect's route takes it (ChatSubmitter,
  // routes_responses.h): submit_completion, the job handed over as a SubmittedChat.
  std::expected<SubmittedChat, ApiError> submit_chat(CompletionRequest cr, Clock::time_point admitted) {
    auto job = submit_completion(std::move(cr), admitted);
    if (!job) return std::unexpected(job.error());
    SubmittedChat s;
    s.handle = (*job)->handle;
    s.prompt_tokens = static_cast<int64_t>((*job)->prompt.size());
    s.output = (*job)->output;
    s.model = (*job)->meta.model;
    s.account = [this, raw = job->get()](JobProgress& pr) { account(*raw, pr); };
    s.prompt = (*job)->prompt;
    s.params = (*job)->params;
    s.tokenizer = (*job)->model->tokenizer;
    s.n_ctx = (*job)->model->n_ctx;
    s.owner = std::move(*job);
    return s;
  }

  // The prompt tokens `cr` (a parsed chat request) renders to with its
  // model's template, as submit_completion would render it (a constrained
  // answer on a template that opens the reasoning itself is rendered with
  // thinking off); nothing is submitted. POST /v1/messages/count_tokens.
  std::expected<int64_t, ApiError> count_chat_prompt(const CompletionRequest& cr) {
    const std::string model_id = cr.model.empty() ? ctx.opt.default_model : cr.model;
    auto model = acquire_model(ctx, model_id);
    if (!model) return std::unexpected(model.error());
    const engine::ModelHandle hold = std::move(*model);  // gives the model back on every path
    if (!hold->tokenizer) return std::unexpected(overloaded("Model '" + model_id + "' is not ready.", "model_loading"));
    const tokenizer::Tokenizer& tok = *hold->tokenizer;
    tokenizer::ChatOptions rendering;
    rendering.enable_thinking = cr.enable_thinking;
    rendering.tools = cr.tools;
    rendering.continue_final_message = continues_final_message(cr);
    if (thinks_off_for_grammar(cr, tok.chat_template(), rendering)) rendering.enable_thinking = false;
    auto rendered = tok.chat_template().render(cr.messages, rendering);
    if (!rendered) return std::unexpected(bad_request(rendered.error().message, "messages", "invalid_value"));
    size_t bytes = 0;
    for (const auto& seg : rendered->segments) bytes += seg.text.size();
    if (bytes > max_prompt_bytes(hold->n_ctx))
      return std::unexpected(
          bad_request("The messages text is " + std::to_string(bytes) + " bytes; this server tokenizes at most " +
                          std::to_string(max_prompt_bytes(hold->n_ctx)) + " bytes of prompt for this model.",
                      "messages", "context_length_exceeded"));
    return static_cast<int64_t>(tok.encode_chat(*rendered).size());
  }

  // ---- completions --------------------------------------------------------

  // Parses, validates, tokenizes and submits one completion request
  // (admitted at `admitted`). Returns the submitted job for its JobPump, or
  // nullopt with the answer (an error) in `res`.
  std::optional<SubmittedJob> handle_completion(const std::string& body_text, HttpResponse& res, Endpoint endpoint,
                                                Clock::time_point admitted) {
    CompletionRequest cr;
    auto job = [&]() -> std::expected<std::shared_ptr<Job>, ApiError> {
      if (auto e = parse_completion_request(body_text, endpoint, cr)) return std::unexpected(*e);
      return submit_completion(std::move(cr), admitted);
    }();
    if (!job) {
      send_error(res, job.error());
      return std::nullopt;
    }
    auto handle = (*job)->handle;
    const int n = (*job)->n;
    return SubmittedJob{std::move(handle), n, std::make_shared<CompletionAnswer>(this, std::move(*job))};
  }

  // The preparation every chat-shaped route shares (chat completions, and
  // /v1/responses after translating its request into `cr`): the model, the
  // queue check, engine::prepare_completion (template, tokens, context,
  // sampling), the output parser's options and the submit to the model's
  // scheduler. Returns the submitted job, or the error to answer.
  std::expected<std::shared_ptr<Job>, ApiError> submit_completion(CompletionRequest cr, Clock::time_point admitted) {
    const Endpoint endpoint = cr.endpoint;
    auto fail = [](const ApiError& e) -> std::expected<std::shared_ptr<Job>, ApiError> { return std::unexpected(e); };
    auto job = std::make_shared<Job>();
    job->pool = ctx.models;
    job->admitted = admitted;
    job->deadline = deadline_after(admitted, ctx.opt.timeout_s);
    // The model: 404 unknown, 503 loading; a registered model loads on demand here.
    auto model = acquire_model(ctx, cr.model);
    if (!model) return fail(model.error());
    job->model = std::move(*model);
    const engine::LoadedModel& lm = *job->model;
    const std::string model_id = lm.id;  // the model that serves it (another name may have been asked for)
    if (!lm.pool || !lm.tokenizer) return fail(overloaded("Model '" + model_id + "' is not ready.", "model_loading"));

    // Refused before the prompt costs anything (issue 10.2): a full queue
    // answers 503 before tokenizing (submit checks again), and the prompt
    // text is capped in bytes before it is tokenized.
    // Full: every sequence slot running and the queue at its limit (so a
    // job that was submitted a moment ago and not yet moved to a free slot
    // does not refuse this one); submit() checks the queue again after
    // tokenizing. The bound is the scheduler's (SchedulerOptions::max_queue).
    if (lm.scheduler && lm.scheduler->saturated()) {
      ctx.metrics.inc(kRejected, {{"model", model_id}});
      return fail(overloaded("Model '" + model_id +
                                 "' is overloaded: " + std::to_string(lm.scheduler->options().max_queue) +
                                 " requests are already waiting. Retry later.",
                             "overloaded", 1));
    }
    // A grammar (structured output, forced tool calls) was compiled for
    // Qwen3's answer form while parsing; a template that writes otherwise
    // (Qwen3.5: XML tool calls, the answer starting inside <think>) gets it
    // compiled again in its own form (build_output_grammar's GrammarForm).
    const tokenizer::ChatTemplate& tmpl = lm.tokenizer->chat_template();
    tokenizer::ChatOptions rendering;
    rendering.enable_thinking = cr.enable_thinking;
    rendering.continue_final_message = endpoint == Endpoint::kChat && continues_final_message(cr);
    // A constrained answer (forced tool call, response_format) starts at its
    // first token, as it does for Qwen3 (whose grammar leaves no room for a
    // <think> block): where the template itself would open the reasoning
    // (Qwen3.5), the prompt is rendered with thinking off. Otherwise a model
    // that never closes </think> returns no call and no JSON at all, and the
    // README's "the answer is one call" would not hold.
    const bool constrained = cr.sampling.grammar.has_value() && *cr.sampling.grammar != nullptr;
    if (endpoint == Endpoint::kChat && thinks_off_for_grammar(cr, tmpl, rendering)) {
      cr.enable_thinking = false;
      rendering.enable_thinking = false;
    }
    const GrammarForm form{tmpl.tool_call_syntax(), tmpl.prompt_opens_reasoning(rendering)};
    if (endpoint == Endpoint::kChat && constrained &&
        (form.tool_call_syntax != tokenizer::ToolCallSyntax::kJson || form.opens_reasoning)) {
      OutputGrammar og;
      if (auto e = build_output_grammar(cr.grammar_source, endpoint, og, form)) return fail(*e);
      cr.sampling.grammar = std::move(og.grammar);
    }
    // The prompt (byte cap before tokenizing), the context check and the
    // sampling parameters: engine::prepare_completion, as the CLI's.
    engine::CompletionInput in;
    in.chat = endpoint == Endpoint::kChat;
    in.messages = std::move(cr.messages);
    in.chat_options.enable_thinking = cr.enable_thinking;
    in.chat_options.tools = cr.tools;
    in.chat_options.continue_final_message = rendering.continue_final_message;
    in.prompt = std::move(cr.prompt);
    in.prompt_ids = std::move(cr.prompt_ids);
    in.prompt_pieces = std::move(cr.prompt_pieces);
    in.logit_bias_text = std::move(cr.logit_bias_text);
    if (cr.fim) {  // fill in the middle: the prompt from the vocabulary's FIM tokens (400 without them)
      auto ids = build_fim_prompt(*lm.tokenizer, in.prompt, *cr.fim, max_prompt_bytes(lm.n_ctx));
      if (!ids) return fail(ids.error());
      in.prompt_ids = std::move(*ids);
      in.prompt.clear();
    }
    // The request's sampling fields as parsed (stop, ignore_eos, logit_bias
    // and grammar are the request's even when absent), and its seed: the
    // request's, else --seed, else a fresh random one.
    if (!cr.sampling.seed) cr.sampling.seed = ctx.opt.default_seed ? *ctx.opt.default_seed : fresh_seed();
    engine::PrepareOptions popt;  // server: empty prompt and context overflow are errors
    popt.max_prompt_bytes = max_prompt_bytes(lm.n_ctx);
    popt.truncate = cr.truncate;
    popt.truncate_ctx = cr.truncate_ctx;
    popt.prompt_cap_source = ctx.opt.max_prompt_bytes > 0
                                 ? "the server's max_prompt_bytes"
                                 : "the larger of 32 bytes per position of --ctx-size and 64 KiB";
    // Batched completions: each prompt prepared as a single one would be;
    // one sampling setup for all (max_tokens the least any prompt resolved to).
    std::vector<std::vector<int32_t>> prompts;
    std::optional<engine::SamplingParams> params;
    std::vector<std::optional<std::string>> sent;
    const size_t n_inputs = cr.prompts.empty() ? 1 : cr.prompts.size();
    for (size_t p = 0; p < n_inputs; ++p) {
      if (!cr.prompts.empty()) {
        in.prompt = std::move(cr.prompts[p].text);
        in.prompt_ids = std::move(cr.prompts[p].ids);
        in.prompt_pieces = std::move(cr.prompts[p].pieces);
      }
      auto prepared = engine::prepare_completion(*lm.tokenizer, lm.n_ctx, lm.spec.defaults, in, cr.sampling, popt);
      if (!prepared) {
        std::string message = prepared.error().error.message;
        std::string param = prepared.error().param;
        if (!cr.prompts.empty()) {
          message = "prompt[" + std::to_string(p) + "]: " + message;
          if (param == "prompt") param += "[" + std::to_string(p) + "]";
        }
        return fail(bad_request(std::move(message), std::move(param), prepared.error().code));
      }
      if (!params) {
        params = std::move(prepared->params);
      } else {
        params->max_tokens = std::min(params->max_tokens, prepared->params.max_tokens);
      }
      prompts.push_back(std::move(prepared->prompt));
      // A text prompt, as sent (completions echo returns it so).
      sent.push_back(!in.chat && in.prompt_ids.empty() && in.prompt_pieces.empty()
                         ? std::optional<std::string>(in.prompt)
                         : std::nullopt);
    }
    job->params = std::move(*params);
    job->prompt = prompts.front();
    int64_t n_prompt = 0;
    for (const auto& p : prompts) n_prompt += static_cast<int64_t>(p.size());
    job->prompt_tokens = n_prompt;
    // Log probabilities (job->logprobs >= 0) and completions echo: each
    // prompt's text as echo returns it and its length in bytes (text_offset
    // of the first answer token). A text prompt is echoed as sent (OpenAI)
    // when its tokens spell it after a few extra leading bytes
    // (SentencePiece's dummy-prefix space): text_offset then runs that many
    // bytes behind the tokens' bytes (echo_shift). Token-id prompts, and
    // text the tokens do not spell (normalized), are their tokens' text.
    job->logprobs = cr.logprobs();
    job->echo = cr.echo;
    for (size_t p = 0; p < prompts.size(); ++p) {
      std::string spelled;
      if (job->logprobs >= 0 || cr.echo)
        for (int32_t id : prompts[p]) spelled += lm.tokenizer->token_to_bytes(id);
      const std::optional<std::string>& as_sent = sent[p];
      const bool literal = as_sent && spelled.size() >= as_sent->size() && spelled.ends_with(*as_sent);
      const int64_t shift = literal ? static_cast<int64_t>(spelled.size() - as_sent->size()) : 0;
      job->prompt_bytes.push_back(static_cast<int64_t>(spelled.size()) - shift);
      job->echo_shift.push_back(shift);
      job->echo_text.push_back(!cr.echo ? std::string() : literal ? *as_sent : spelled);
    }
    job->per_prompt = cr.n;
    job->n = cr.n * static_cast<int>(prompts.size());
    job->include_usage = cr.include_usage;
    // The template decides the tool-call syntax (Qwen3 JSON / Qwen3.5 XML)
    // and whether the answer starts inside the <think> its prompt opened.
    if (endpoint == Endpoint::kChat) {
      job->output = engine::chat_output_options(lm.tokenizer->chat_template(), in.chat_options,
                                                cr.parse_reasoning.value_or(ctx.opt.parse_reasoning),
                                                cr.tools.is_array() && !cr.tools.empty() && !cr.tool_choice_none);
      job->output.only_tool_calls = cr.forced_tool_call;
    } else {
      job->output.parse_reasoning = false;
      job->output.parse_tool_calls = false;
    }
    job->meta = ResponseMeta{new_response_id(endpoint), unix_now(), model_id, endpoint};

    // Bounded admission: the model's scheduler queues the job (503 +
    // Retry-After when its queue bound is reached).
    if (!lm.scheduler) return fail(overloaded("Model '" + model_id + "' is not ready.", "model_loading"));
    engine::CompletionJob cj;
    cj.prompt = job->prompt;
    cj.params = job->params;
    cj.n = job->n;
    cj.cache_prompt = cr.cache_prompt;
    if (prompts.size() > 1) {  // choice i runs prompt i / n
      for (const auto& p : prompts)
        for (int k = 0; k < cr.n; ++k) cj.prompts.push_back(p);
    }
    cj.deadline = job->deadline;
    cj.submitted = admitted;
    auto handle = lm.scheduler->submit(std::move(cj));
    if (!handle) return fail(submit_refusal(ctx, model_id, handle.error()));
    job->handle = *handle;
    job->stream = cr.stream;
    ctx.metrics.inc(kPromptTokens, {{"model", model_id}}, static_cast<double>(n_prompt) * job->per_prompt);
    ctx.metrics.inc(kVllmPromptTokens, {{"model_name", model_id}}, static_cast<double>(n_prompt) * job->per_prompt);
    return job;
  }

  // Metrics of what a finished job ran, and the cut reason of a cancelled one.
  void account(const Job& job, JobProgress& pr) {
    const std::string& model = job.meta.model;
    for (size_t i = 0; i < pr.done.size(); ++i) {
      if (!pr.done[i]) continue;
      const engine::GenerationResult& r = *pr.done[i];
      ctx.metrics.inc(kCompletionTokens, {{"model", model}}, r.completion_tokens);
      ctx.metrics.inc(kVllmGenerationTokens, {{"model_name", model}}, r.completion_tokens);
      if (i == 0 && r.rate.tokens > 0) ctx.metrics.observe(kTtft, {{"model", model}}, r.rate.ttft_ms / 1000.0);
      if (i == 0) ctx.metrics.observe(kQueueWait, {{"model", model}}, r.rate.queue_ms / 1000.0);
      for (double gap : r.rate.itl_ms) ctx.metrics.observe(kItl, {{"model", model}}, gap / 1000.0);
      if (r.timed_out) ctx.metrics.inc(kCancelled, {{"reason", "timeout"}});
    }
    if (pr.failed && pr.failed->code == core::Errc::kCancelled && pr.cut == CutReason::kNone)
      pr.cut = ctx.stopping ? CutReason::kShutdown : CutReason::kClientGone;
    bool any_cancelled = pr.failed && pr.failed->code == core::Errc::kCancelled;
    for (const auto& d : pr.done)
      any_cancelled = any_cancelled || (d && d->finish_reason == engine::FinishReason::kCancelled);
    if (any_cancelled) {
      if (pr.cut == CutReason::kNone) pr.cut = ctx.stopping ? CutReason::kShutdown : CutReason::kClientGone;
      ctx.metrics.inc(kCancelled, {{"reason", pr.cut == CutReason::kClientGone ? "client_gone" : "shutdown"}});
    }
  }

  // finish_reason of a choice: a timed-out one is "length" (the answer so far).
  static std::string finish_name(const engine::GenerationResult& r) {
    return engine::finish_reason_name(r.finish_reason);
  }
  // A choice that --timeout ended while generating: finish_reason stays
  // "length" (OpenAI's closed set, which SDKs validate) and the choice says
  // why with the extension field "timed_out": true, left out otherwise (a
  // max_tokens "length" has none). `choice`: a choices[] element of a
  // response body or of a finish chunk.
  static void mark_timed_out(const engine::GenerationResult& r, json& choice) {
    if (r.timed_out) choice["timed_out"] = true;
  }

  // The API's view of engine log probabilities: token bytes resolved with the model's tokenizer.
  static std::vector<LogprobEntry> logprob_entries(const Job& job, std::span<const engine::TokenLogprob> lps) {
    const tokenizer::Tokenizer& tok = *job.model->tokenizer;
    std::vector<LogprobEntry> out;
    out.reserve(lps.size());
    for (const auto& lp : lps) {
      LogprobEntry e{tok.token_to_bytes(lp.token), lp.logprob, {}};
      for (const auto& [id, v] : lp.top) e.top.emplace_back(tok.token_to_bytes(id), v);
      out.push_back(std::move(e));
    }
    return out;
  }

  // A non-streamed answer from a finished job's progress.
  void answer_whole(HttpResponse& res, Job& job, JobProgress& pr) {
    if (pr.failed)
      return send_error(res, job_failure_error(ctx, *pr.failed, job.meta.model, pr.cut == CutReason::kClientGone));
    std::vector<Choice> choices;
    std::vector<const engine::GenerationResult*> results;  // per choice, for mark_timed_out
    Usage usage{job.prompt_tokens, 0};
    usage.cached_tokens = 0;  // the first choice of each prompt's (a sibling shares its prompt's KV)
    for (size_t i = 0; i < pr.done.size(); ++i)
      if (pr.done[i] && static_cast<int>(i) % job.per_prompt == 0) usage.cached_tokens += pr.done[i]->cached_tokens;
    for (size_t i = 0; i < pr.done.size(); ++i) {
      auto& d = pr.done[i];
      if (!d || d->finish_reason == engine::FinishReason::kCancelled)
        return send_error(res, job_cut_error(pr.cut == CutReason::kClientGone));
      usage.completion_tokens += d->completion_tokens;
      Choice ch{std::move(d->text), finish_name(*d), {}, {}};
      if (job.logprobs >= 0) {
        const bool chat = job.meta.endpoint == Endpoint::kChat;
        std::vector<LogprobEntry> entries;
        if (!chat && job.echo) entries = logprob_entries(job, d->prompt_logprobs);
        for (auto& e : logprob_entries(job, d->logprobs)) entries.push_back(std::move(e));
        ch.logprobs = chat ? build_chat_logprobs(entries)
                           : build_completion_logprobs(entries, job.echo ? -job.echo_shift_of(static_cast<int>(i))
                                                                         : job.prompt_bytes_of(static_cast<int>(i)));
      }
      if (job.echo) ch.text = job.echo_of(static_cast<int>(i)) + ch.text;
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
      results.push_back(&*d);
    }
    json body = build_response(job.meta, choices, usage);
    for (size_t i = 0; i < results.size(); ++i) mark_timed_out(*results[i], body["choices"][i]);
    send_json(res, 200, body);
  }

  // A completion job's answer (its JobPump takes the events): Server-Sent
  // Events as the text comes (stream), or one JSON body at the end. A stream
  // whose client reads slowly stops taking events while the connection's
  // unsent bytes are over its high-water mark (Exchange::on_drain resumes
  // it); the events wait in the handle.
  struct CompletionAnswer : JobAnswer {
    Impl* impl;
    std::shared_ptr<Job> job;
    Exchange* ex = nullptr;     // the pump's (set by start)
    bool alive = true;          // stream: the client still takes chunks
    bool headers_sent = false;  // stream: open_stream() ran (status 200 and the SSE headers are out)
    std::vector<bool> role_sent;
    std::vector<engine::ChatOutputParser> parsers;
    std::vector<int> n_calls;
    // Log probabilities (job->logprobs >= 0), per choice: chat ones wait for
    // the choice's next content (or finish) chunk; completions ones go with
    // their text, text_offset continuing from `offset`. `lp_sent`: entries
    // taken from text events (the rest of the result's, e.g. a stop
    // string's tokens, go with the finish chunk). `echoed`: completions
    // echo sent (the prompt and its logprobs as the choice's first chunk).
    std::vector<json> pending_lp;
    std::vector<int64_t> offset;
    std::vector<size_t> lp_sent;
    std::vector<bool> echoed;

    CompletionAnswer(Impl* i, std::shared_ptr<Job> j) : impl(i), job(std::move(j)) {
      const auto n = static_cast<size_t>(job->n);
      role_sent.assign(n, false);
      parsers.assign(n, engine::ChatOutputParser(job->output));
      n_calls.assign(n, 0);
      pending_lp.assign(n, json(nullptr));
      for (int i = 0; i < job->n; ++i) offset.push_back(job->prompt_bytes_of(i));
      lp_sent.assign(n, 0);
      echoed.assign(n, !job->echo);
    }

    std::string missing_result_message() const override {
      return "the request ended without a result for every choice";
    }

    bool write(const std::string& s) { return alive && (alive = ex->send(s)); }
    // With stream_options.include_usage, OpenAI sends "usage": null on every
    // chunk but the last (the usage chunk); typed clients expect the key.
    bool chunk(json c) {
      if (job->include_usage) c["usage"] = nullptr;
      return write(sse_event(c));
    }
    bool ensure_role(int i) {
      if (job->meta.endpoint != Endpoint::kChat || role_sent[static_cast<size_t>(i)]) return true;
      role_sent[static_cast<size_t>(i)] = true;
      return chunk(build_role_chunk(job->meta, i));
    }
    // Writes one choice's parsed delta: reasoning, content, completed tool calls.
    bool emit(int i, const engine::ChatOutputDelta& d) {
      if (!d.reasoning.empty()) alive = alive && chunk(build_reasoning_chunk(job->meta, i, d.reasoning));
      if (!d.content.empty()) alive = alive && chunk(build_content_chunk(job->meta, i, d.content, take_lp(i)));
      for (const auto& call : d.tool_calls) {
        const int k = n_calls[static_cast<size_t>(i)]++;
        alive = alive && chunk(build_tool_call_chunk(job->meta, i, k, call, new_tool_call_id()));
      }
      return alive;
    }
    json take_lp(int i) { return std::exchange(pending_lp[static_cast<size_t>(i)], json(nullptr)); }
    // The logprobs of `lps` (the choice's next tokens) in the endpoint's shape.
    json logprobs_of(int i, std::span<const engine::TokenLogprob> lps) {
      lp_sent[static_cast<size_t>(i)] += lps.size();
      const auto entries = logprob_entries(*job, lps);
      if (job->meta.endpoint == Endpoint::kChat) return build_chat_logprobs(entries);
      json lp = build_completion_logprobs(entries, offset[static_cast<size_t>(i)]);
      for (const auto& e : entries) offset[static_cast<size_t>(i)] += static_cast<int64_t>(e.bytes.size());
      return lp;
    }
    // Completions echo: the prompt (and its logprobs) as the choice's first text chunk.
    bool send_echo(int i, const std::vector<engine::TokenLogprob>& prompt_lp) {
      if (echoed[static_cast<size_t>(i)]) return alive;
      echoed[static_cast<size_t>(i)] = true;
      json lp = job->logprobs >= 0 ? build_completion_logprobs(logprob_entries(*job, prompt_lp), -job->echo_shift_of(i))
                                   : json(nullptr);
      return chunk(build_content_chunk(job->meta, i, job->echo_of(i), std::move(lp)));
    }

    // A stream's status and headers wait for the job's first event
    // (open_stream), so a job that fails while still queued (its model
    // unloaded or evicted, the server draining or stopping, its deadline)
    // is answered with its real status (503 + Retry-After) as a
    // non-streamed one is.
    void start(JobPump& pump) override { ex = &pump.exchange(); }
    // Stream: the 200, the SSE headers and the first role chunk (once).
    void open_stream() {
      if (headers_sent) return;
      headers_sent = true;
      ex->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
      if (job->n == 1) ensure_role(0);
    }
    // A job that ended without an answer to stream: it failed, or a choice
    // ended cancelled or without a result.
    static bool failed_whole(const JobProgress& pr) {
      if (pr.failed) return true;
      for (const auto& d : pr.done)
        if (!d || d->finish_reason == engine::FinishReason::kCancelled) return true;
      return false;
    }
    bool hold(JobPump& pump) override {
      if (!(job->stream && alive && ex->over_high_water())) return false;
      std::weak_ptr<JobPump> weak = pump.weak_from_this();
      ex->on_drain([weak] {
        if (auto p = weak.lock()) p->kick();
      });
      return true;
    }
    void on_cut(CutReason why) override {
      if (why == CutReason::kClientGone) alive = false;
    }
    bool on_text(const engine::JobEvent& ev) override {
      if (!job->stream) return true;  // collected from the results at the end
      open_stream();
      const int i = ev.choice;
      if (!alive || !ensure_role(i)) return false;
      if (job->meta.endpoint != Endpoint::kChat) {
        if (!send_echo(i, ev.prompt_logprobs)) return false;
        json lp = job->logprobs >= 0 ? logprobs_of(i, ev.logprobs) : json(nullptr);
        return chunk(build_content_chunk(job->meta, i, ev.text, std::move(lp)));
      }
      if (job->logprobs >= 0) append_logprobs(pending_lp[static_cast<size_t>(i)], logprobs_of(i, ev.logprobs));
      return emit(i, parsers[static_cast<size_t>(i)].feed(ev.text));
    }

    void finish(JobPump&, JobProgress& pr) override {
      impl->account(*job, pr);
      if (job->stream && (headers_sent || !failed_whole(pr))) {
        open_stream();
        end_stream(pr);
      } else {  // not streamed, or a stream that failed before its first text: a status and one error body
        HttpResponse res;
        impl->answer_whole(res, *job, pr);
        ex->respond(std::move(res));
      }
      job->handle.reset();
    }

    void end_stream(JobProgress& pr) {
      // A stream cut once it started (shutdown past the drain timeout, a
      // model unloaded under it) ends with the error event then
      // `data: [DONE]`, as vLLM ends a stream that fails: the client sees a
      // clean end and why. No finish chunk or usage chunk for the cut choice.
      auto end_with = [this](const ApiError& e) {
        write(sse_event(e.to_json()));
        write(std::string(kSseDone));
      };
      if (alive && pr.failed) {
        if (pr.cut != CutReason::kClientGone)
          end_with(job_failure_error(impl->ctx, *pr.failed, job->meta.model, /*client_gone=*/false));
        alive = false;
      }
      const bool chat = job->meta.endpoint == Endpoint::kChat;
      Usage usage{job->prompt_tokens, 0};
      usage.cached_tokens = 0;
      for (int i = 0; i < job->n && alive; ++i) {
        const auto& d = pr.done[static_cast<size_t>(i)];
        if (!d || d->finish_reason == engine::FinishReason::kCancelled) {
          if (pr.cut != CutReason::kClientGone) end_with(job_cut_error(/*client_gone=*/false));
          alive = false;
          break;
        }
        usage.completion_tokens += d->completion_tokens;
        if (i % job->per_prompt == 0) usage.cached_tokens += d->cached_tokens;
        std::string finish = finish_name(*d);
        if (!chat) alive = send_echo(i, d->prompt_logprobs);  // a choice that released no text
        if (job->logprobs >= 0 && lp_sent[static_cast<size_t>(i)] < d->logprobs.size()) {
          // Tokens whose text was never released (a stop string's): as in the non-streamed answer.
          const auto rest = std::span<const engine::TokenLogprob>(d->logprobs).subspan(lp_sent[static_cast<size_t>(i)]);
          append_logprobs(pending_lp[static_cast<size_t>(i)], logprobs_of(i, rest));
        }
        if (chat) {
          auto& parser = parsers[static_cast<size_t>(i)];
          alive = alive && ensure_role(i) && emit(i, parser.finish());
          if (!parser.tool_calls().empty() && finish == "stop") finish = "tool_calls";
        }
        json fin = build_finish_chunk(job->meta, i, finish, take_lp(i));
        mark_timed_out(*d, fin["choices"][0]);
        alive = alive && ensure_role(i) && chunk(std::move(fin));
      }
      if (alive) {
        if (job->include_usage) write(sse_event(build_usage_chunk(job->meta, usage)));
        write(std::string(kSseDone));
      }
      ex->end_stream();
    }
  };
};

Server::Server(std::shared_ptr<engine::ModelPool> models, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(models), std::move(options))) {}

Server::~Server() { stop(); }

core::Expected<int> Server::bind() { return impl_->http.bind(); }

void Server::run() { impl_->http.run(); }

// Cancels the jobs being answered (their clients get the shutdown error
// within one scheduler step) and closes the pools before the transport
// stops, so the requests in flight answer and run() returns.
void Server::stop() {
  if (!impl_) return;
  impl_->ctx.stopping = true;
  impl_->ctx.jobs_cv.notify_all();  // a drain() waiting on the jobs stops waiting
  impl_->ctx.cut_all_jobs();
  impl_->ctx.models->close_all();
  impl_->http.stop();
}

// Closing every model's engine pool is what makes the scheduler refuse the
// jobs still queued (kResourceExhausted, answered 503 draining) at its next
// loop turn while the sequences already running finish: the same contract
// an admin unload relies on.
void Server::drain(double timeout_s) {
  if (!impl_) return;
  ServerContext& ctx = impl_->ctx;
  if (!ctx.stopping && !ctx.draining.exchange(true)) {
    ctx.models->close_all();
    const auto deadline = deadline_after(Clock::now(), timeout_s);
    std::unique_lock lock(ctx.jobs_mu);
    ctx.jobs_cv.wait_until(lock, deadline, [&] { return ctx.jobs.empty() || ctx.stopping; });
  }
  stop();
}

MetricsRegistry& Server::metrics() { return impl_->ctx.metrics; }

}  // namespace bonsai::server
