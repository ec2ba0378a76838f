// llama.cpp's native routes: /completion, /infill, /props, /slots. See routes_llama.h.
#include "server/routes_llama.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "engine/logprobs.h"    // TokenLogprob, kMaxTopLogprobs
#include "engine/model_pool.h"  // LoadedModel
#include "engine/scheduler.h"   // Scheduler::options / stats
#include "server/job_pump.h"    // add_job_route, JobAnswer

namespace bonsai::server {

using json = nlohmann::json;
using Json = nlohmann::ordered_json;

namespace {

// The id of the token whose vocabulary text is `text`, if there is one.
std::optional<int32_t> special_token(const tokenizer::Tokenizer& tok, std::string_view text) {
  const auto ids = tok.encode(text, /*parse_special=*/true);
  if (ids.size() == 1 && tok.token_text(ids[0]) == text) return ids[0];
  return std::nullopt;
}

// What a native request asks for beyond the completions request it becomes.
struct NativeOptions {
  bool return_tokens = false;  // the answer lists the generated token ids
  bool stream = false;
  bool evaluate_only = false;  // n_predict 0: the prompt is evaluated (and cached), nothing generated
  int32_t n_probs = 0;         // > 0: completion_probabilities with this many candidates per token
  // logit_bias entries naming text rather than a token id ([["Hello", -5]],
  // {"Hello": -5}): every token of the text gets the bias (CompletionRequest::logit_bias_text).
  std::vector<std::pair<std::string, float>> text_bias;
};

// `e` with the OpenAI field names of the translated request put back as the llama.cpp ones.
ApiError native_error(ApiError e) {
  if (e.param == "max_tokens") {
    e.param = "n_predict";
    for (size_t at = e.message.find("'max_tokens'"); at != std::string::npos; at = e.message.find("'max_tokens'"))
      e.message.replace(at, 12, "'n_predict'");
  }
  return e;
}

// Translates the fields /completion and /infill share into the completions
// request body `c` (the OpenAI names the completions parser checks).
std::optional<ApiError> translate_sampling(const Json& body, Json& c, NativeOptions& o) {
  for (const char* f :
       {"model", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
        "stop", "ignore_eos", "grammar", "json_schema", "stream", "max_tokens", "seed", "cache_prompt"}) {
    if (auto it = body.find(f); it != body.end()) c[f] = *it;
  }
  if (auto it = body.find("n_predict"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return wrong_type("n_predict", "an integer", *it);
    const int64_t n = it->get<int64_t>();
    if (n > 0) c["max_tokens"] = n;  // < 0: no limit but the context's
    o.evaluate_only = n == 0;        // 0: the prompt only (set on the parsed request: OpenAI's minimum is 1)
  }
  if (auto it = body.find("n_probs"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return wrong_type("n_probs", "an integer", *it);
    const int64_t n = it->get<int64_t>();
    if (n > engine::kMaxTopLogprobs)
      return bad_request("Invalid 'n_probs': " + std::to_string(n) + " is more than the " +
                             std::to_string(engine::kMaxTopLogprobs) + " candidates per token this server gives.",
                         "n_probs", "invalid_value");
    o.n_probs = static_cast<int32_t>(std::max<int64_t>(n, 0));  // <= 0: none (llama.cpp's default 0)
  }
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    // llama.cpp's forms: [[token id or text, bias or false], ...], or an
    // object whose keys are token ids or text. A text's tokens all get the
    // bias (o.text_bias); ids go to the OpenAI object the parser checks.
    Json obj = Json::object();
    auto add = [&](const Json& key, const Json& bias, const std::string& where) -> std::optional<ApiError> {
      if (!(bias.is_number() || bias.is_boolean()))
        return bad_request("Invalid '" + where + "': a bias is a number in [-100, 100], or false: never.", "logit_bias",
                           "invalid_value");
      if (bias.is_boolean() && bias.get<bool>())
        return bad_request("Invalid '" + where + "': a bias of true means nothing; give a number or false.",
                           "logit_bias", "invalid_value");
      const Json value = bias.is_boolean() ? Json(-100) : bias;
      if (key.is_number_integer()) {
        obj[std::to_string(key.get<int64_t>())] = value;  // the parser checks the id and the range
        return std::nullopt;
      }
      const double b = value.get<double>();
      if (!(b >= -100.0 && b <= 100.0))
        return bad_request("Invalid '" + where + "': " + value.dump() + " is not in [-100, 100].", "logit_bias",
                           "invalid_value");
      o.text_bias.emplace_back(key.get<std::string>(), static_cast<float>(b));
      return std::nullopt;
    };
    if (it->is_array()) {
      for (size_t k = 0; k < it->size(); ++k) {
        const Json& pair = (*it)[k];
        const std::string where = "logit_bias[" + std::to_string(k) + "]";
        if (!pair.is_array() || pair.size() != 2 || !(pair[0].is_number_integer() || pair[0].is_string()))
          return bad_request(
              "Invalid '" + where + "': expected [token id or text, bias] (bias a number, or false: never).",
              "logit_bias", "invalid_value");
        if (auto e = add(pair[0], pair[1], where)) return e;
      }
      c["logit_bias"] = std::move(obj);
    } else if (it->is_object()) {
      for (const auto& [key, bias] : it->items()) {
        int64_t id = -1;
        auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
        const bool is_id = ec == std::errc() && ptr == key.data() + key.size();
        if (auto e = add(is_id ? Json(id) : Json(key), bias, "logit_bias." + key)) return e;
      }
      c["logit_bias"] = std::move(obj);
    } else {
      c["logit_bias"] = *it;  // the parser names the wrong type
    }
  }
  if (auto it = body.find("return_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return wrong_type("return_tokens", "a boolean", *it);
    o.return_tokens = it->get<bool>();
  }
  return std::nullopt;
}

// An optional string field of `body` into `out` (absent or null: unchanged).
std::optional<ApiError> get_text(const Json& body, const std::string& field, const std::string& param,
                                 std::string& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return wrong_type(param, "a string", *it);
  out = it->get<std::string>();
  return std::nullopt;
}

// A /completion or (`infill`) /infill body, validated and parsed into `cr`.
std::optional<ApiError> parse_native(std::string_view text, bool infill, CompletionRequest& cr, NativeOptions& o) {
  if (json_nesting_exceeds(text, kMaxJsonDepth))
    return bad_request("The request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels.", {},
                       "invalid_json");
  const Json body = Json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object())
    return bad_request("The request body must be a JSON object.", {}, "invalid_json");
  Json c = Json::object();
  if (auto e = translate_sampling(body, c, o)) return e;
  FimRequest fim;
  if (infill) {
    std::string prefix;
    if (auto e = get_text(body, "input_prefix", "input_prefix", prefix)) return e;
    if (auto e = get_text(body, "input_suffix", "input_suffix", fim.suffix)) return e;
    if (auto e = get_text(body, "prompt", "prompt", fim.middle)) return e;
    if (auto it = body.find("input_extra"); it != body.end() && !it->is_null()) {
      if (!it->is_array()) return wrong_type("input_extra", "an array of {\"filename\", \"text\"} objects", *it);
      for (size_t k = 0; k < it->size(); ++k) {
        const Json& item = (*it)[k];
        const std::string where = "input_extra[" + std::to_string(k) + "]";
        if (!item.is_object()) return wrong_type(where, "an object with 'filename' and 'text'", item);
        std::string name, file_text;
        if (auto e = get_text(item, "filename", where + ".filename", name)) return e;
        if (auto e = get_text(item, "text", where + ".text", file_text)) return e;
        fim.extra.emplace_back(std::move(name), std::move(file_text));
      }
    }
    c["prompt"] = prefix;
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null())
      return bad_request("Missing required parameter: 'prompt' (a string or an array of token ids).", "prompt",
                         "missing_required_parameter");
    c["prompt"] = *it;
  }
  if (auto e = parse_completion_request_json(c, Endpoint::kCompletion, cr)) return native_error(*e);
  if (!cr.prompts.empty())  // several prompts: /v1/completions answers them (one choice each)
    return native_error(bad_request("Invalid 'prompt': this route takes one prompt per request (got " +
                                        std::to_string(cr.prompts.size()) + "); /v1/completions takes several.",
                                    "prompt", "invalid_value"));
  if (infill) cr.fim = std::move(fim);
  cr.logit_bias_text = std::move(o.text_bias);
  if (o.evaluate_only) cr.sampling.max_tokens = 0;
  if (o.n_probs > 0) cr.sampling.logprobs = o.n_probs;
  o.stream = cr.stream;
  return std::nullopt;
}

// llama.cpp's "generation_settings" / "params" view of sampling parameters.
json settings_json(const engine::SamplingParams& p, int64_t n_ctx, const std::string& model, bool stream,
                   int32_t n_probs = 0) {
  json bias = json::array();
  for (const auto& [id, b] : p.logit_bias) bias.push_back(json::array({id, b}));
  return json{{"n_ctx", n_ctx},
              {"n_predict", p.max_tokens},
              {"model", model},
              {"seed", p.seed},
              {"temperature", p.temperature},
              {"top_k", p.top_k},
              {"top_p", p.top_p},
              {"min_p", p.min_p},
              {"repeat_last_n", p.repeat_last_n},
              {"repeat_penalty", p.repeat_penalty},
              {"presence_penalty", p.presence_penalty},
              {"frequency_penalty", p.frequency_penalty},
              {"stop", p.stop},
              {"ignore_eos", p.ignore_eos},
              {"logit_bias", std::move(bias)},
              {"grammar", p.grammar != nullptr},
              {"stream", stream},
              {"n_probs", n_probs}};
}

// "timings": prompt tokens computed (not cached) and generated, their times and rates.
json timings_json(const engine::GenerationResult& r) {
  const int64_t prompt_n = std::max<int64_t>(0, r.prompt_tokens - r.cached_tokens);
  const int64_t predicted_n = r.completion_tokens;
  auto per_token = [](double ms, int64_t n) { return n > 0 ? ms / static_cast<double>(n) : 0.0; };
  auto per_second = [](double ms, int64_t n) { return ms > 0 ? 1000.0 * static_cast<double>(n) / ms : 0.0; };
  return json{{"prompt_n", prompt_n},
              {"prompt_ms", r.prompt_ms},
              {"prompt_per_token_ms", per_token(r.prompt_ms, prompt_n)},
              {"prompt_per_second", per_second(r.prompt_ms, prompt_n)},
              {"predicted_n", predicted_n},
              {"predicted_ms", r.gen_ms},
              {"predicted_per_token_ms", per_token(r.gen_ms, predicted_n)},
              {"predicted_per_second", per_second(r.gen_ms, predicted_n)}};
}

// One candidate of llama.cpp's completion_probabilities: {"id", "token" (its
// bytes as text; a control token's text), "bytes" (the token's bytes as
// numbers), "logprob" (natural log)}.
json candidate_json(const tokenizer::Tokenizer& tok, int32_t id, float logprob) {
  const std::string text = tok.is_control(id) ? std::string(tok.token_text(id)) : tok.token_to_bytes(id);
  json bytes = json::array();
  for (const char ch : text) bytes.push_back(static_cast<int>(static_cast<unsigned char>(ch)));
  return json{{"id", id}, {"token", text}, {"bytes", std::move(bytes)}, {"logprob", logprob}};
}

// llama.cpp's completion_probabilities of `lps` (one entry per generated
// token): the token's candidate_json plus "top_logprobs", its n_probs most
// likely tokens (most likely first) in the same shape.
json probabilities_json(const tokenizer::Tokenizer& tok, std::span<const engine::TokenLogprob> lps) {
  json out = json::array();
  for (const auto& lp : lps) {
    json entry = candidate_json(tok, lp.token, lp.logprob);
    json top = json::array();
    for (const auto& [id, l] : lp.top) top.push_back(candidate_json(tok, id, l));
    entry["top_logprobs"] = std::move(top);
    out.push_back(std::move(entry));
  }
  return out;
}

// The answer to one /completion or /infill job (see routes_llama.h for the shapes).
struct NativeAnswer : JobAnswer {
  SubmittedChat job;
  NativeOptions opt;
  Exchange* ex = nullptr;
  bool alive = true;
  bool headers_sent = false;
  size_t probs_sent = 0;  // completion_probabilities entries streamed so far

  NativeAnswer(SubmittedChat j, NativeOptions o) : job(std::move(j)), opt(o) {}

  std::string missing_result_message() const override { return "the request ended without a result"; }

  bool write(const json& payload) {
    return alive &&
           (alive = ex->send("data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"));
  }
  void start(JobPump& pump) override { ex = &pump.exchange(); }
  void open_stream() {
    if (headers_sent) return;
    headers_sent = true;
    ex->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  }
  bool hold(JobPump& pump) override {
    if (!(opt.stream && alive && ex->over_high_water())) return false;
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
    if (!opt.stream) return true;  // the whole text comes with the result
    open_stream();
    json piece{{"index", 0}, {"content", ev.text}, {"stop", false}};
    if (opt.n_probs > 0) {
      piece["completion_probabilities"] = probabilities_json(*job.tokenizer, ev.logprobs);
      probs_sent += ev.logprobs.size();
    }
    return write(piece);
  }

  // How the generation ended, llama.cpp's way: "eos" (an end-of-generation
  // token), "word" (a stop string: the engine's GenerationResult::stop_sequence,
  // returned as the second), "limit" (n_predict, the context, or the request's deadline).
  static std::pair<std::string, std::string> stop_of(const engine::GenerationResult& r) {
    if (r.finish_reason != engine::FinishReason::kStop) return {"limit", ""};
    if (!r.stop_sequence.empty()) return {"word", r.stop_sequence};
    return {"eos", ""};
  }

  json whole(const engine::GenerationResult& r, bool with_text) const {
    const auto [stop_type, word] = stop_of(r);
    json tokens = json::array();
    if (opt.return_tokens)
      for (int32_t id : r.tokens) tokens.push_back(id);
    json out{{"index", 0},
             {"content", with_text ? r.text : std::string()},
             {"tokens", std::move(tokens)},
             {"model", job.model},
             {"stop", true},
             {"tokens_predicted", r.completion_tokens},
             {"tokens_evaluated", job.prompt.size()},
             {"tokens_cached", r.cached_tokens},
             {"prompt", prompt_text(*job.tokenizer, job.prompt)},
             {"has_new_line", r.text.find('\n') != std::string::npos},
             {"truncated", false},  // a prompt longer than the context is a 400, never cut
             {"stop_type", stop_type},
             {"stopping_word", word},
             {"stopped_eos", stop_type == "eos"},
             {"stopped_word", stop_type == "word"},
             {"stopped_limit", stop_type == "limit"},
             {"generation_settings", settings_json(job.params, job.n_ctx, job.model, opt.stream, opt.n_probs)},
             {"timings", timings_json(r)}};
    if (opt.n_probs > 0) {  // streamed: the tokens no piece carried (a held-back tail)
      const size_t from = with_text ? 0 : std::min(probs_sent, r.logprobs.size());
      out["completion_probabilities"] =
          probabilities_json(*job.tokenizer, std::span<const engine::TokenLogprob>(r.logprobs).subspan(from));
    }
    return out;
  }

  void finish(JobPump& pump, JobProgress& pr) override {
    if (job.account) job.account(pr);
    const bool gone = pr.cut == CutReason::kClientGone;
    std::optional<ApiError> err;
    if (pr.failed)
      err = job_failure_error(pump.context(), *pr.failed, job.model, gone);
    else if (pr.done.empty() || !pr.done[0] || pr.done[0]->finish_reason == engine::FinishReason::kCancelled)
      err = job_cut_error(gone);
    if (err && !headers_sent) {  // not streamed yet: a status and one error body
      HttpResponse res;
      send_error(res, *err);
      ex->respond(std::move(res));
    } else if (err) {
      if (!gone) write(err->to_json());
      ex->end_stream();
    } else if (opt.stream) {
      open_stream();  // a generation that released no text opens it here
      write(whole(*pr.done[0], /*with_text=*/false));
      ex->end_stream();
    } else {
      HttpResponse res;
      send_json(res, 200, whole(*pr.done[0], /*with_text=*/true));
      ex->respond(std::move(res));
    }
    job = SubmittedChat{};  // the model and the job go now
  }
};

std::optional<SubmittedJob> create(const std::string& body, HttpResponse& res, engine::Clock::time_point admitted,
                                   bool infill, const ChatSubmitter& submit) {
  auto fail = [&res](const ApiError& e) -> std::optional<SubmittedJob> {
    send_error(res, e);
    return std::nullopt;
  };
  CompletionRequest cr;
  NativeOptions o;
  if (auto e = parse_native(body, infill, cr, o)) return fail(*e);
  auto job = submit(std::move(cr), admitted);
  if (!job) return fail(native_error(job.error()));
  auto handle = job->handle;
  return SubmittedJob{std::move(handle), 1, std::make_shared<NativeAnswer>(std::move(*job), o)};
}

void handle_props(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  auto m = acquire_model(ctx, req.query_param("model"));
  if (!m) return send_error(res, m.error());
  const engine::ModelHandle hold = std::move(*m);  // gives the model back on every path
  const engine::LoadedModel& lm = *hold;
  if (!lm.tokenizer) return send_error(res, overloaded("The model is not ready.", "model_loading"));
  const tokenizer::Tokenizer& tok = *lm.tokenizer;
  auto token = [&tok](int32_t id) {
    return id == tokenizer::kNoToken ? std::string() : std::string(tok.token_text(id));
  };
  send_json(res, 200,
            json{{"default_generation_settings",
                  {{"n_ctx", lm.n_ctx}, {"params", settings_json(lm.spec.defaults, lm.n_ctx, lm.id, false)}}},
                 {"total_slots", lm.scheduler ? lm.scheduler->options().max_sequences : 0},
                 {"model_path", lm.spec.path},
                 {"model_alias", lm.id},
                 {"chat_template", tok.chat_template().source()},
                 {"bos_token", token(tok.bos_id())},
                 {"eos_token", token(tok.eos_id())},
                 {"modalities", {{"vision", false}, {"audio", false}}}});
}

void handle_slots(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  auto m = acquire_model(ctx, req.query_param("model"));
  if (!m) return send_error(res, m.error());
  const engine::ModelHandle hold = std::move(*m);
  const engine::LoadedModel& lm = *hold;
  if (!lm.scheduler) return send_error(res, overloaded("The model is not ready.", "model_loading"));
  const int slots = lm.scheduler->options().max_sequences;
  const int64_t running = lm.scheduler->stats().running;
  json out = json::array();
  for (int i = 0; i < slots; ++i)
    out.push_back(json{{"id", i}, {"n_ctx", lm.n_ctx}, {"is_processing", i < running}, {"model", lm.id}});
  send_json(res, 200, out);
}

}  // namespace

std::expected<std::vector<int32_t>, ApiError> build_fim_prompt(const tokenizer::Tokenizer& tok, std::string_view prefix,
                                                               const FimRequest& fim, size_t max_prompt_bytes) {
  size_t bytes = prefix.size() + fim.suffix.size() + fim.middle.size();
  for (const auto& [name, text] : fim.extra) bytes += name.size() + text.size() + 1;
  if (bytes > max_prompt_bytes)
    return std::unexpected(bad_request("The fill-in-the-middle texts are " + std::to_string(bytes) +
                                           " bytes, more than this server tokenizes for this model (" +
                                           std::to_string(max_prompt_bytes) + " bytes).",
                                       "prompt", "context_length_exceeded"));
  const auto pre = special_token(tok, kFimPrefix), suf = special_token(tok, kFimSuffix),
             mid = special_token(tok, kFimMiddle);
  if (!pre || !suf || !mid)
    return std::unexpected(bad_request("This model's vocabulary has no fill-in-the-middle tokens (" +
                                           std::string(kFimPrefix) + ", " + std::string(kFimSuffix) + ", " +
                                           std::string(kFimMiddle) + "), so it cannot fill in the middle.",
                                       "suffix", "unsupported_value"));
  std::vector<int32_t> ids;
  if (tok.add_bos_token() && tok.bos_id() != tokenizer::kNoToken) ids.push_back(tok.bos_id());
  auto append = [&ids, &tok](std::string_view text) {
    for (int32_t id : tok.encode(text, /*parse_special=*/false)) ids.push_back(id);
  };
  if (!fim.extra.empty()) {
    const auto sep = special_token(tok, kFileSep);
    if (!sep)
      return std::unexpected(bad_request("This model's vocabulary has no " + std::string(kFileSep) +
                                             " token to separate the files of 'input_extra'; leave it out.",
                                         "input_extra", "unsupported_value"));
    for (const auto& [name, text] : fim.extra) {
      ids.push_back(*sep);
      append(name + "\n" + text);
    }
  }
  ids.push_back(*pre);
  append(prefix);
  ids.push_back(*suf);
  append(fim.suffix);
  ids.push_back(*mid);
  append(fim.middle);
  return ids;
}

std::string prompt_text(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += tok.is_control(id) ? std::string(tok.token_text(id)) : tok.token_to_bytes(id);
  return out;
}

bool is_llama_route(std::string_view path) {
  return path == "/completion" || path == "/completions" || path == "/infill" || path == "/props" || path == "/slots";
}

void add_llama_routes(HttpTransport& http, ServerContext& ctx, ChatSubmitter submit) {
  auto shared = std::make_shared<ChatSubmitter>(std::move(submit));
  for (const char* path : {"/completion", "/completions", "/infill"}) {
    const bool infill = std::string_view(path) == "/infill";
    add_job_route(http, ctx, path,
                  [shared, infill](const std::string& body, HttpResponse& res, engine::Clock::time_point admitted) {
                    return create(body, res, admitted, infill, *shared);
                  });
  }
  http.get("/props", [&ctx](const HttpRequest& req, HttpResponse& res) { handle_props(ctx, req, res); });
  http.get("/slots", [&ctx](const HttpRequest& req, HttpResponse& res) { handle_slots(ctx, req, res); });
}

}  // namespace bonsai::server
