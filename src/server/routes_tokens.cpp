// /tokenize, /detokenize, /v1/embeddings. See routes_tokens.h.
#include "server/routes_tokens.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine_pool.h"       // EnginePool leases
#include "engine/inference_engine.h"  // InferenceEngine::embed
#include "engine/model_pool.h"        // LoadedModel
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
    const std::string piece = tok.token_to_bytes(id);
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

// Embedding requests holding a worker thread (waiting for a replica or
// running) and how many may: the rest get 503, so that they never take every
// worker thread the streamed answers need.
struct EmbedSlots {
  std::atomic<int> busy{0};
  int limit = 1;
};

void handle_embeddings(ServerContext& ctx, EmbedSlots& slots, const std::string& text, HttpResponse& res) {
  if (ctx.stopping) return send_error(res, overloaded("The server is shutting down.", "shutting_down", 5));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(std::min(ctx.opt.timeout_s, 1e9)));
  json body;
  if (auto e = parse_object(text, body)) return send_error(res, *e);
  std::string model_id, format = "float";
  if (auto e = opt_string(body, "model", model_id)) return send_error(res, *e);
  if (auto e = opt_string(body, "encoding_format", format)) return send_error(res, *e);
  if (format != "float" && format != "base64")
    return send_error(
        res, bad_request("Invalid value for 'encoding_format': '" + format + "' (expected 'float' or 'base64').",
                         "encoding_format", "invalid_value"));
  if (auto it = body.find("dimensions"); it != body.end() && !it->is_null())
    return send_error(res, bad_request("'dimensions' is not supported by this server (embeddings have the model's "
                                       "n_embd dimensions); omit it.",
                                       "dimensions", "unsupported_value"));
  auto in = body.find("input");
  if (in == body.end() || in->is_null())
    return send_error(res, bad_request("'input' is required.", "input", "missing_required_parameter"));
  auto m = acquire_model(ctx, model_id);
  if (!m) return send_error(res, m.error());
  const engine::ModelHandle hold = std::move(*m);  // gives the model back on every path
  const engine::LoadedModel& lm = *hold;
  if (!lm.tokenizer || !lm.pool) return send_error(res, overloaded("The model is not ready.", "model_loading"));
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
    if (auto e = token_array(*in, "input", "input", tok.n_vocab(), inputs.back())) return send_error(res, *e);
  } else if (in->is_array() && !in->empty()) {
    for (size_t k = 0; k < in->size(); ++k) {
      const json& item = (*in)[k];
      if (item.is_string()) {
        inputs.push_back(from_string(item));
      } else if (item.is_array()) {
        inputs.emplace_back();
        if (auto e = token_array(item, "input[" + std::to_string(k) + "]", "input", tok.n_vocab(), inputs.back()))
          return send_error(res, *e);
      } else {
        return send_error(res, bad_request("Invalid type for 'input[" + std::to_string(k) +
                                               "]': expected a string or an array of token ids.",
                                           "input", "invalid_type"));
      }
    }
  } else {
    return send_error(res, bad_request("'input' must be a non-empty string, array of strings, array of token ids, "
                                       "or array of token-id arrays.",
                                       "input", "invalid_type"));
  }
  int64_t total = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].empty())
      return send_error(
          res, bad_request("Invalid 'input[" + std::to_string(k) + "]': it is empty.", "input", "invalid_value"));
    if (static_cast<int64_t>(inputs[k].size()) > lm.n_ctx)
      return send_error(
          res, bad_request("Invalid 'input[" + std::to_string(k) + "]': " + std::to_string(inputs[k].size()) +
                               " tokens exceed the model's context length of " + std::to_string(lm.n_ctx) + ".",
                           "input", "context_length_exceeded"));
    total += static_cast<int64_t>(inputs[k].size());
  }

  // One replica for the whole request (the scheduler's step loop uses the others meanwhile).
  struct Busy {
    std::atomic<int>& n;
    ~Busy() { n.fetch_sub(1); }
  } busy{slots.busy};
  if (slots.busy.fetch_add(1) >= slots.limit)
    return send_error(res, overloaded("Too many embedding requests are running (at most " +
                                          std::to_string(slots.limit) + " at a time). Retry later.",
                                      "overloaded", 1));
  auto lease = lm.pool->acquire(deadline);
  if (!lease)
    return send_error(
        res, overloaded(std::string("No engine replica became free: ") + engine::pool_error_name(lease.error()) + ".",
                        "overloaded", 1));
  json data = json::array();
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (ctx.stopping) return send_error(res, overloaded("The server is shutting down.", "shutting_down", 5));
    auto emb = lease->engine().embed(inputs[k]);
    if (!emb) return send_error(res, from_core_error(emb.error(), 500));
    json vec;
    if (format == "base64") {
      static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
      vec = base64_encode(std::string_view(reinterpret_cast<const char*>(emb->data()), emb->size() * sizeof(float)));
    } else {
      vec = *emb;
    }
    data.push_back({{"object", "embedding"}, {"index", k}, {"embedding", std::move(vec)}});
  }
  send_json(res, 200,
            json{{"object", "list"},
                 {"data", std::move(data)},
                 {"model", lm.id},
                 {"usage", {{"prompt_tokens", total}, {"total_tokens", total}}}});
}

}  // namespace

void add_token_routes(HttpTransport& http, ServerContext& ctx) {
  auto slots = std::make_shared<EmbedSlots>();
  slots->limit = std::max(1, (ctx.opt.http_threads > 0 ? ctx.opt.http_threads : 8) / 2);
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
  http.post_json(
      "/v1/embeddings",
      [&ctx, slots](const HttpRequest&, const std::string& body, HttpResponse& res) {
        handle_embeddings(ctx, *slots, body, res);
      },
      bad_body);
}

}  // namespace bonsai::server
