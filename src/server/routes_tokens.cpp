// /tokenize, /detokenize, /v1/embeddings. See routes_tokens.h.
#include "server/routes_tokens.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/inference_engine.h"  // GenerationResult::embedding
#include "engine/model_pool.h"        // LoadedModel
#include "engine/scheduler.h"         // Scheduler::submit_embedding, JobHandle
#include "server/job_pump.h"          // JobPump, JobAnswer, add_job_route
#include "server/openai.h"            // ApiError, bad_request
#include "tokenizer/tokenizer.h"      // Tokenizer
#include "tokenizer/unicode.h"        // valid_utf8_prefix

namespace bonsai::server {

using json = nlohmann::json;

std::string base64_encode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                       static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                       static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 2]));
    for (int s = 18; s >= 0; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  if (const size_t rest = bytes.size() - i; rest > 0) {
    uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (rest == 2) v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

namespace {

// The body as a JSON object, or the 400 saying why not.
std::optional<ApiError> parse_object(const std::string& text, json& out) {
  if (json_nesting_exceeds(text, kMaxJsonDepth))
    return bad_request("The request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels.", {},
                       "invalid_json");
  out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) return bad_request("The request body is not valid JSON.", {}, "invalid_json");
  if (!out.is_object()) return bad_request("The request body must be a JSON object.", {}, "invalid_json");
  return std::nullopt;
}

// An optional string field (empty when absent or null).
std::optional<ApiError> opt_string(const json& body, const char* field, std::string& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string())
    return bad_request(std::string("Invalid type for '") + field + "': expected a string.", field, "invalid_type");
  out = it->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> opt_bool(const json& body, const char* field, bool& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean())
    return bad_request(std::string("Invalid type for '") + field + "': expected a boolean.", field, "invalid_type");
  out = it->get<bool>();
  return std::nullopt;
}

// A JSON array of token ids in [0, n_vocab) (`where` names it in errors).
std::optional<ApiError> token_array(const json& arr, const std::string& where, const std::string& param,
                                    int32_t n_vocab, std::vector<int32_t>& out) {
  out.clear();
  for (size_t k = 0; k < arr.size(); ++k) {
    const json& v = arr[k];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_vocab)
      return bad_request("Invalid value for '" + where + "[" + std::to_string(k) + "]': " + v.dump() +
                             " is not a token id in [0, " + std::to_string(n_vocab) + ").",
                         param, "invalid_value");
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return std::nullopt;
}

void handle_tokenize(ServerContext& ctx, const std::string& text, HttpResponse& res) {
  json body;
  if (auto e = parse_object(text, body)) return send_error(res, *e);
  std::string model_id, content;
  bool add_special = false, parse_special = true, with_pieces = false;
  if (auto e = opt_string(body, "model", model_id)) return send_error(res, *e);
  if (!body.contains("content") || !body["content"].is_string())
    return send_error(res, bad_request("'content' must be a string.", "content", "invalid_type"));
  content = body["content"].get<std::string>();
  for (auto [f, v] : {std::pair{"add_special", &add_special}, std::pair{"parse_special", &parse_special},
                      std::pair{"with_pieces", &with_pieces}})
    if (auto e = opt_bool(body, f, *v)) return send_error(res, *e);
  auto m = acquire_model(ctx, model_id);
  if (!m) return send_error(res, m.error());
  const engine::ModelHandle hold = std::move(*m);  // gives the model back on every path
  if (!hold->tokenizer) return send_error(res, overloaded("The model is not ready.", "model_loading"));
  const tokenizer::Tokenizer& tok = *hold->tokenizer;
  const auto ids = add_special ? tok.encode_prompt(content, parse_special) : tok.encode(content, parse_special);
  json tokens = json::array();
  for (const int32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    // A control token's piece is its text ("<|im_start|>"), as llama-server's; others their bytes.
    const std::string piece = tok.is_control(id) ? std::string(tok.token_text(id)) : tok.token_to_bytes(id);
    json p;
    if (tokenizer::unicode::sanitize_utf8(piece) == piece) {
      p = piece;
    } else {  // a partial UTF-8 character: its byte values (llama-server does the same)
      p = json::array();
      for (const char ch : piece) p.push_back(static_cast<int>(static_cast<unsigned char>(ch)));
    }
    tokens.push_back({{"id", id}, {"piece", std::move(p)}});
  }
  send_json(res, 200, json{{"tokens", std::move(tokens)}});
}

void handle_detokenize(ServerContext& ctx, const std::string& text, HttpResponse& res) {
  json body;
  if (auto e = parse_object(text, body)) return send_error(res, *e);
  std::string model_id;
  if (auto e = opt_string(body, "model", model_id)) return send_error(res, *e);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array())
    return send_error(res, bad_request("'tokens' must be an array of token ids.", "tokens", "invalid_type"));
  auto m = acquire_model(ctx, model_id);
  if (!m) return send_error(res, m.error());
  const engine::ModelHandle hold = std::move(*m);  // gives the model back on every path
  if (!hold->tokenizer) return send_error(res, overloaded("The model is not ready.", "model_loading"));
  const tokenizer::Tokenizer& tok = *hold->tokenizer;
  std::vector<int32_t> ids;
  if (auto e = token_array(*it, "tokens", "tokens", tok.n_vocab(), ids)) return send_error(res, *e);
  send_json(res, 200, json{{"content", tok.decode(ids)}});
}

// One /v1/embeddings request's answer after its submission: a job of the
// model's scheduler (HTTP threads never run the model), answered by its
// JobPump once every input is done or the job failed.
struct EmbedAnswer : JobAnswer {
  ServerContext* ctx = nullptr;
  std::shared_ptr<engine::ModelPool> pool;  // outlives `model` (declared first)
  engine::ModelHandle model;                // the model stays loaded until answered
  std::string model_id;
  bool base64 = false;
  int64_t total_tokens = 0;
  EmbeddingsDialect dialect;  // body unset: OpenAI's list object

  std::string missing_result_message() const override {
    return "the request ended without an embedding for every input";
  }

  void finish(JobPump& pump, JobProgress& pr) override {
    HttpResponse res;
    answer(res, pr);
    pump.exchange().respond(std::move(res));
  }

  void answer(HttpResponse& res, JobProgress& pr) {
    auto send_error = [this](HttpResponse& r, const ApiError& e) { dialect.error(r, e); };
    const bool gone = pr.cut == CutReason::kClientGone && !ctx->stopping;
    if (pr.failed) return send_error(res, job_failure_error(*ctx, *pr.failed, model_id, gone));
    json data = json::array();
    std::vector<std::vector<float>> vectors;  // dialect.body's
    for (size_t k = 0; k < pr.done.size(); ++k) {
      engine::GenerationResult& r = *pr.done[k];
      if (r.finish_reason == engine::FinishReason::kCancelled) return send_error(res, job_cut_error(gone));
      if (r.timed_out)
        return send_error(res, overloaded("The request timed out before its embeddings were computed.", "timeout", 1));
      if (r.embedding.empty())
        return send_error(res, from_core_error(core::Error{core::Errc::kInternal, "input " + std::to_string(k) +
                                                                                      " ended without an embedding"},
                                               500));
      if (dialect.body) {
        vectors.push_back(std::move(r.embedding));
        continue;
      }
      json vec;
      if (base64) {
        static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
        vec = base64_encode(
            std::string_view(reinterpret_cast<const char*>(r.embedding.data()), r.embedding.size() * sizeof(float)));
      } else {
        vec = r.embedding;
      }
      data.push_back({{"object", "embedding"}, {"index", k}, {"embedding", std::move(vec)}});
    }
    if (dialect.body) return send_json(res, 200, dialect.body(std::move(vectors), model_id, total_tokens));
    send_json(res, 200,
              json{{"object", "list"},
                   {"data", std::move(data)},
                   {"model", model_id},
                   {"usage", {{"prompt_tokens", total_tokens}, {"total_tokens", total_tokens}}}});
  }
};

}  // namespace

// Validates and tokenizes the request and submits it to the model's scheduler.

std::optional<SubmittedJob> submit_embeddings(ServerContext& ctx, const std::string& text, HttpResponse& res,
                                              engine::Clock::time_point admitted, EmbeddingsDialect dialect) {
  auto fail = [&res, &dialect](const ApiError& e) -> std::optional<SubmittedJob> {
    dialect.error(res, e);
    return std::nullopt;
  };
  const engine::Clock::time_point deadline = deadline_after(admitted, ctx.opt.timeout_s);
  json body;
  if (auto e = parse_object(text, body)) return fail(*e);
  std::string model_id, format = "float";
  if (auto e = opt_string(body, "model", model_id)) return fail(*e);
  if (auto e = opt_string(body, "encoding_format", format)) return fail(*e);
  if (format != "float" && format != "base64")
    return fail(bad_request("Invalid value for 'encoding_format': '" + format + "' (expected 'float' or 'base64').",
                            "encoding_format", "invalid_value"));
  if (auto it = body.find("dimensions"); it != body.end() && !it->is_null())
    return fail(
        bad_request("'dimensions' is not supported by this server (embeddings have the model's "
                    "n_embd dimensions); omit it.",
                    "dimensions", "unsupported_value"));
  auto in = body.find("input");
  if (in == body.end() || in->is_null())
    return fail(bad_request("'input' is required.", "input", "missing_required_parameter"));
  auto answer = std::make_shared<EmbedAnswer>();
  answer->ctx = &ctx;
  answer->pool = ctx.models;
  auto m = acquire_model(ctx, model_id);
  if (!m) return fail(m.error());
  answer->model = std::move(*m);  // gives the model back on every path
  const engine::LoadedModel& lm = *answer->model;
  if (!lm.tokenizer || !lm.pool || !lm.scheduler) return fail(overloaded("The model is not ready.", "model_loading"));
  const tokenizer::Tokenizer& tok = *lm.tokenizer;

  // The inputs as token sequences: a string, an array of strings, one token
  // array, or an array of token arrays (OpenAI's four forms).
  std::vector<std::vector<int32_t>> inputs;
  // An empty string is refused below (as OpenAI does), not embedded as BOS alone.
  auto from_string = [&](const json& s) {
    const std::string& t = s.get_ref<const std::string&>();
    return t.empty() ? std::vector<int32_t>{} : tok.encode_prompt(t, /*parse_special=*/true);
  };
  if (in->is_string()) {
    inputs.push_back(from_string(*in));
  } else if (in->is_array() && !in->empty() && (*in)[0].is_number()) {
    inputs.emplace_back();
    if (auto e = token_array(*in, "input", "input", tok.n_vocab(), inputs.back())) return fail(*e);
  } else if (in->is_array() && !in->empty()) {
    for (size_t k = 0; k < in->size(); ++k) {
      const json& item = (*in)[k];
      if (item.is_string()) {
        inputs.push_back(from_string(item));
      } else if (item.is_array()) {
        inputs.emplace_back();
        if (auto e = token_array(item, "input[" + std::to_string(k) + "]", "input", tok.n_vocab(), inputs.back()))
          return fail(*e);
      } else {
        return fail(bad_request(
            "Invalid type for 'input[" + std::to_string(k) + "]': expected a string or an array of token ids.", "input",
            "invalid_type"));
      }
    }
  } else {
    return fail(
        bad_request("'input' must be a non-empty string, array of strings, array of token ids, "
                    "or array of token-id arrays.",
                    "input", "invalid_type"));
  }
  int64_t total = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].empty())
      return fail(bad_request("Invalid 'input[" + std::to_string(k) + "]': it is empty.", "input", "invalid_value"));
    if (static_cast<int64_t>(inputs[k].size()) > lm.n_ctx && dialect.truncate)
      inputs[k].resize(static_cast<size_t>(lm.n_ctx));
    if (static_cast<int64_t>(inputs[k].size()) > lm.n_ctx)
      return fail(bad_request("Invalid 'input[" + std::to_string(k) + "]': " + std::to_string(inputs[k].size()) +
                                  " tokens exceed the model's context length of " + std::to_string(lm.n_ctx) + ".",
                              "input", "context_length_exceeded"));
    total += static_cast<int64_t>(inputs[k].size());
  }

  // Bounded admission, as completions: the model's scheduler queues the job
  // (503 + Retry-After when its queue bound is reached).
  const size_t n_inputs = inputs.size();
  engine::EmbeddingJob job;
  job.inputs = std::move(inputs);
  job.deadline = deadline;
  job.submitted = admitted;
  auto handle = lm.scheduler->submit_embedding(std::move(job));
  if (!handle) return fail(submit_refusal(ctx, lm.id, handle.error()));
  answer->model_id = lm.id;
  answer->base64 = format == "base64";
  answer->total_tokens = total;
  answer->dialect = std::move(dialect);
  return SubmittedJob{std::move(*handle), static_cast<int>(n_inputs), std::move(answer)};
}

void add_token_routes(HttpTransport& http, ServerContext& ctx) {
  auto bad_body = [](const HttpRequest&, HttpResponse& res) {
    send_error(res, bad_request("The request body must be JSON (got multipart/form-data).", {}, "invalid_json"));
  };
  http.post_json(
      "/tokenize",
      [&ctx](const HttpRequest&, const std::string& body, HttpResponse& res) { handle_tokenize(ctx, body, res); },
      bad_body);
  http.post_json(
      "/detokenize",
      [&ctx](const HttpRequest&, const std::string& body, HttpResponse& res) { handle_detokenize(ctx, body, res); },
      bad_body);
  // Answered later, from the scheduler job's events (EmbedAnswer).
  for (const char* path : {"/v1/embeddings", "/embeddings"})  // the second: llama-server's name without /v1
    add_job_route(http, ctx, path,
                  [&ctx](const std::string& body, HttpResponse& res, engine::Clock::time_point admitted) {
                    return submit_embeddings(ctx, body, res, admitted);
                  });
}

}  // namespace bonsai::server
