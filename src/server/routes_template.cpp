// POST /apply-template. See routes_template.h.
#include "server/routes_template.h"

#include <nlohmann/json.hpp>
#include <string>

#include "engine/model_pool.h"    // LoadedModel
#include "server/openai.h"        // parse_completion_request, bad_request
#include "tokenizer/tokenizer.h"  // Tokenizer::chat_template

namespace bonsai::server {

namespace {

void handle_apply_template(ServerContext& ctx, const std::string& body, HttpResponse& res) {
  CompletionRequest cr;
  if (auto e = parse_completion_request(body, Endpoint::kChat, cr)) return send_error(res, *e);
  // The one field a chat completion does not have (llama-server's, default true).
  tokenizer::ChatOptions options;
  const auto parsed = nlohmann::json::parse(body, nullptr, false);
  if (auto it = parsed.find("add_generation_prompt"); it != parsed.end() && !it->is_null()) {
    if (!it->is_boolean()) return send_error(res, wrong_type("add_generation_prompt", "a boolean", *it));
    options.add_generation_prompt = it->get<bool>();
  }
  options.enable_thinking = cr.enable_thinking;
  options.tools = cr.tools;
  auto m = acquire_model(ctx, cr.model);
  if (!m) return send_error(res, m.error());
  const engine::ModelHandle hold = std::move(*m);  // gives the model back on every path
  if (!hold->tokenizer) return send_error(res, overloaded("The model is not ready.", "model_loading"));
  auto rendered = hold->tokenizer->chat_template().render(cr.messages, options);
  if (!rendered) return send_error(res, bad_request(rendered.error().message, "messages", "invalid_value"));
  send_json(res, 200, nlohmann::json{{"prompt", rendered->text()}});
}

}  // namespace

void add_template_routes(HttpTransport& http, ServerContext& ctx) {
  http.post_json(
      "/apply-template",
      [&ctx](const HttpRequest&, const std::string& body, HttpResponse& res) { handle_apply_template(ctx, body, res); },
      [](const HttpRequest&, HttpResponse& res) {
        send_error(res, bad_request("The request body must be JSON (got multipart/form-data).", {}, "invalid_json"));
      });
}

}  // namespace bonsai::server
