// POST /v1/messages and /v1/messages/count_tokens. See routes_anthropic.h.
#include "server/routes_anthropic.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <utility>

#include "server/job_pump.h"  // JobPump, JobAnswer, add_job_route

namespace bonsai::server {

namespace {

using Json = nlohmann::ordered_json;  // request side: document order (tool schemas, tool inputs)
using nlohmann::json;                 // answer side

constexpr std::string_view kPath = "/v1/messages";

// Anthropic's smallest thinking.budget_tokens (docs.anthropic.com, Messages API, `thinking`).
constexpr int64_t kMinThinkingBudget = 1024;

ApiError missing(const std::string& field) { return bad_request(field + ": Field required.", field, "missing"); }

ApiError bad_value(const std::string& field, const Json& got, const std::string& supported) {
  return bad_request("Invalid value for '" + field + "': " + got.dump() + ". Supported values are: " + supported + ".",
                     field, "invalid_value");
}

ApiError unsupported_block(const std::string& where, const std::string& type) {
  return bad_request("Invalid value for '" + where + ".type': '" + type +
                         "' content blocks are not supported: the models this server runs read text only.",
                     where + ".type", "unsupported_value");
}

// `obj[key]` when present and not null, else nullptr.
const Json* member(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> required_string(const Json& obj, const char* key, const std::string& where, std::string& out) {
  const Json* v = member(obj, key);
  if (!v) return missing(where + "." + key);
  if (!v->is_string()) return wrong_type(where + "." + key, "a string", *v);
  out = v->get<std::string>();
  return std::nullopt;
}

// The `type` of content block `block` at `where`.
std::optional<ApiError> block_type(const Json& block, const std::string& where, std::string& type) {
  if (!block.is_object()) return wrong_type(where, "an object (a content block)", block);
  return required_string(block, "type", where, type);
}

// Text of `content` (a string, or text blocks, joined by `sep`); other
// block types are refused (images and documents: text-only models).
std::optional<ApiError> text_of(const Json& content, const std::string& where, const char* sep, std::string& out) {
  if (content.is_string()) {
    out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return wrong_type(where, "a string or an array of content blocks", content);
  for (size_t k = 0; k < content.size(); ++k) {
    const std::string bw = where + "[" + std::to_string(k) + "]";
    std::string type, text;
    if (auto e = block_type(content[k], bw, type)) return e;
    if (type == "image" || type == "document") return unsupported_block(bw, type);
    if (type != "text") return bad_value(bw + ".type", content[k]["type"], "'text'");
    if (auto e = required_string(content[k], "text", bw, text)) return e;
    if (k > 0) out += sep;
    out += text;
  }
  return std::nullopt;
}

// One user turn: tool_result blocks become chat "tool" messages (in order),
// then the turn's text one user message.
std::optional<ApiError> translate_user(const Json& content, const std::string& where, Json& messages) {
  if (content.is_string()) {
    messages.push_back(Json{{"role", "user"}, {"content", content}});
    return std::nullopt;
  }
  if (!content.is_array()) return wrong_type(where, "a string or an array of content blocks", content);
  std::string text;
  bool has_text = false;
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& block = content[k];
    const std::string bw = where + "[" + std::to_string(k) + "]";
    std::string type;
    if (auto e = block_type(block, bw, type)) return e;
    if (type == "text") {
      std::string t;
      if (auto e = required_string(block, "text", bw, t)) return e;
      text += t;
      has_text = true;
    } else if (type == "tool_result") {
      std::string id, result;
      if (auto e = required_string(block, "tool_use_id", bw, id)) return e;
      if (const Json* c = member(block, "content"))
        if (auto e = text_of(*c, bw + ".content", "\n", result)) return e;
      if (const Json* err = member(block, "is_error")) {
        if (!err->is_boolean()) return wrong_type(bw + ".is_error", "a boolean", *err);
        // The chat templates have no error flag: the model reads it in the text.
        if (err->get<bool>()) result = "Error: " + result;
      }
      messages.push_back(Json{{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(result)}});
    } else if (type == "image" || type == "document") {
      return unsupported_block(bw, type);
    } else {
      return bad_value(bw + ".type", block["type"], "'text' and 'tool_result'");
    }
  }
  if (has_text) messages.push_back(Json{{"role", "user"}, {"content", std::move(text)}});
  return std::nullopt;
}

// One assistant turn: text -> content, thinking -> reasoning_content,
// tool_use -> tool_calls (input as its JSON text); redacted_thinking is
// dropped (nothing here can read it).
std::optional<ApiError> translate_assistant(const Json& content, const std::string& where, Json& messages) {
  Json m{{"role", "assistant"}, {"content", nullptr}};
  if (content.is_string()) {
    m["content"] = content;
    messages.push_back(std::move(m));
    return std::nullopt;
  }
  if (!content.is_array()) return wrong_type(where, "a string or an array of content blocks", content);
  std::string text, reasoning;
  Json calls = Json::array();
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& block = content[k];
    const std::string bw = where + "[" + std::to_string(k) + "]";
    std::string type;
    if (auto e = block_type(block, bw, type)) return e;
    if (type == "text") {
      std::string t;
      if (auto e = required_string(block, "text", bw, t)) return e;
      text += t;
    } else if (type == "thinking") {
      std::string t;
      if (auto e = required_string(block, "thinking", bw, t)) return e;
      reasoning += t;
    } else if (type == "redacted_thinking") {
      continue;
    } else if (type == "tool_use") {
      std::string id, name;
      if (auto e = required_string(block, "id", bw, id)) return e;
      if (auto e = required_string(block, "name", bw, name)) return e;
      const Json* input = member(block, "input");
      if (!input) return missing(bw + ".input");
      if (!input->is_object()) return wrong_type(bw + ".input", "an object", *input);
      calls.push_back(
          Json{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", input->dump()}}}});
    } else {
      return bad_value(bw + ".type", block["type"], "'text', 'thinking', 'redacted_thinking' and 'tool_use'");
    }
  }
  if (!text.empty() || calls.empty()) m["content"] = std::move(text);
  if (!reasoning.empty()) m["reasoning_content"] = std::move(reasoning);
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  messages.push_back(std::move(m));
  return std::nullopt;
}

// `system` and `messages` into chat messages.
std::optional<ApiError> translate_messages(const Json& body, Json& chat) {
  Json messages = Json::array();
  if (const Json* s = member(body, "system")) {
    std::string system;
    if (auto e = text_of(*s, "system", "\n\n", system)) return e;
    messages.push_back(Json{{"role", "system"}, {"content", std::move(system)}});
  }
  const Json* in = member(body, "messages");
  if (!in) return missing("messages");
  if (!in->is_array()) return wrong_type("messages", "an array of messages", *in);
  if (in->empty()) return bad_request("messages: at least one message is required.", "messages", "invalid_value");
  for (size_t i = 0; i < in->size(); ++i) {
    const Json& msg = (*in)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return wrong_type(where, "an object (a message)", msg);
    std::string role;
    if (auto e = required_string(msg, "role", where, role)) return e;
    const Json* content = member(msg, "content");
    if (!content) return missing(where + ".content");
    if (role == "user") {
      if (auto e = translate_user(*content, where + ".content", messages)) return e;
    } else if (role == "assistant") {
      if (auto e = translate_assistant(*content, where + ".content", messages)) return e;
    } else {
      return bad_value(where + ".role", msg["role"], "'user' and 'assistant'");
    }
  }
  chat["messages"] = std::move(messages);
  return std::nullopt;
}

// `tools` ({name, description?, input_schema}) into chat's function tools.
std::optional<ApiError> translate_tools(const Json& body, Json& chat) {
  const Json* tools = member(body, "tools");
  if (!tools) return std::nullopt;
  if (!tools->is_array()) return wrong_type("tools", "an array", *tools);
  Json out = Json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& tool = (*tools)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) return wrong_type(where, "an object", tool);
    if (const Json* t = member(tool, "type"); t && *t != "custom")
      return bad_request("Invalid value for '" + where + ".type': " + t->dump() +
                             ". This server supports only custom tools (name, description, input_schema), no "
                             "server or client-defined Anthropic tools.",
                         where + ".type", "unsupported_value");
    std::string name;
    if (auto e = required_string(tool, "name", where, name)) return e;
    const Json* schema = member(tool, "input_schema");
    if (!schema) return missing(where + ".input_schema");
    if (!schema->is_object()) return wrong_type(where + ".input_schema", "an object (a JSON Schema)", *schema);
    Json fn{{"name", name}};
    if (const Json* d = member(tool, "description")) fn["description"] = *d;  // type checked by the chat parser
    fn["parameters"] = *schema;
    out.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  chat["tools"] = std::move(out);
  return std::nullopt;
}

// `tool_choice` {type: auto | any | tool | none, name?, disable_parallel_tool_use?}.
std::optional<ApiError> translate_tool_choice(const Json& body, Json& chat) {
  const Json* c = member(body, "tool_choice");
  if (!c) return std::nullopt;
  if (!c->is_object()) return wrong_type("tool_choice", "an object", *c);
  std::string type;
  if (auto e = required_string(*c, "type", "tool_choice", type)) return e;
  if (type == "auto") {
    chat["tool_choice"] = "auto";
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "none") {
    chat["tool_choice"] = "none";
  } else if (type == "tool") {
    std::string name;
    if (auto e = required_string(*c, "name", "tool_choice", name)) return e;
    chat["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", name}}}};
  } else {
    return bad_value("tool_choice.type", (*c)["type"], "'auto', 'any', 'tool' and 'none'");
  }
  if (const Json* d = member(*c, "disable_parallel_tool_use")) {
    if (!d->is_boolean()) return wrong_type("tool_choice.disable_parallel_tool_use", "a boolean", *d);
    chat["parallel_tool_calls"] = !d->get<bool>();
  }
  return std::nullopt;
}

// `thinking` {type: enabled | adaptive | disabled, budget_tokens?}:
// enable_thinking (the budget is not enforced: max_tokens bounds the whole
// answer). budget_tokens, when sent, must be at least kMinThinkingBudget
// (Anthropic's documented minimum, docs.anthropic.com "Extended thinking");
// that it is below max_tokens is checked with max_tokens.
std::optional<ApiError> translate_thinking(const Json& body, Json& chat) {
  const Json* t = member(body, "thinking");
  if (!t) return std::nullopt;
  if (!t->is_object()) return wrong_type("thinking", "an object", *t);
  std::string type;
  if (auto e = required_string(*t, "type", "thinking", type)) return e;
  if (type != "enabled" && type != "disabled" && type != "adaptive")
    return bad_value("thinking.type", (*t)["type"], "'enabled', 'adaptive' and 'disabled'");
  if (const Json* b = member(*t, "budget_tokens")) {
    if (!b->is_number_integer()) return wrong_type("thinking.budget_tokens", "an integer", *b);
    if (b->get<int64_t>() < kMinThinkingBudget)
      return bad_request("thinking.budget_tokens: Input should be greater than or equal to " +
                             std::to_string(kMinThinkingBudget) + " (got " + b->dump() + ").",
                         "thinking.budget_tokens", "invalid_value");
  }
  chat["chat_template_kwargs"] = Json{{"enable_thinking", type != "disabled"}};
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_messages_request(std::string_view body_text, MessagesRequest& out, bool count_only) {
  out = MessagesRequest{};
  if (json_nesting_exceeds(body_text, kMaxJsonDepth))
    return bad_request(
        "The JSON body of your request nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels.",
        {}, "invalid_json");
  Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return bad_request("The request body is not valid JSON.", {}, "invalid_json");
  if (!body.is_object()) return bad_request("The request body must be a JSON object.", {}, "invalid_json");

  Json& chat = out.chat;
  if (const Json* m = member(body, "model")) chat["model"] = *m;  // type checked by the chat parser
  if (auto e = translate_messages(body, chat)) return e;
  if (auto e = translate_tools(body, chat)) return e;
  if (auto e = translate_tool_choice(body, chat)) return e;
  if (auto e = translate_thinking(body, chat)) return e;
  if (const Json* k = member(body, "chat_template_kwargs"); k && !chat.contains("chat_template_kwargs"))
    chat["chat_template_kwargs"] = *k;  // llama.cpp's extension; `thinking` wins
  if (count_only) return std::nullopt;

  const Json* max_tokens = member(body, "max_tokens");
  if (!max_tokens) return missing("max_tokens");
  if (!max_tokens->is_number_integer()) return wrong_type("max_tokens", "an integer", *max_tokens);
  chat["max_tokens"] = *max_tokens;  // range checked by the chat parser
  // Anthropic: the thinking budget is part of max_tokens, so it must be below it.
  if (const Json* t = member(body, "thinking"); t && t->is_object())
    if (const Json* b = member(*t, "budget_tokens"); b && b->get<int64_t>() >= max_tokens->get<int64_t>())
      return bad_request("thinking.budget_tokens: must be less than max_tokens (got budget_tokens " + b->dump() +
                             ", max_tokens " + max_tokens->dump() + ").",
                         "thinking.budget_tokens", "invalid_value");
  if (const Json* s = member(body, "stop_sequences")) {
    if (!s->is_array()) return wrong_type("stop_sequences", "an array of strings", *s);
    for (size_t k = 0; k < s->size(); ++k) {
      if (!(*s)[k].is_string()) return wrong_type("stop_sequences[" + std::to_string(k) + "]", "a string", (*s)[k]);
      out.stop_sequences.push_back((*s)[k].get<std::string>());
    }
    chat["stop"] = *s;  // count checked by the chat parser
  }
  if (const Json* m = member(body, "metadata")) {
    if (!m->is_object()) return wrong_type("metadata", "an object", *m);
    if (const Json* u = member(*m, "user_id")) {
      if (!u->is_string()) return wrong_type("metadata.user_id", "a string", *u);
      chat["user"] = *u;
    }
  }
  if (const Json* s = member(body, "stream")) {
    if (!s->is_boolean()) return wrong_type("stream", "a boolean", *s);
    out.stream = s->get<bool>();
  }
  // Checked by the chat parser under the same names: Anthropic's, and
  // llama.cpp's sampling extensions as on chat completions.
  for (const char* key : {"temperature", "top_p", "top_k", "seed", "min_p", "repeat_penalty", "presence_penalty",
                          "frequency_penalty", "logit_bias", "ignore_eos", "grammar"})
    if (const Json* v = member(body, key)) chat[key] = *v;
  // Anthropic's temperature range is [0, 1] (the chat parser allows OpenAI's [0, 2]).
  if (const Json* v = member(body, "temperature");
      v && v->is_number() && !(v->get<double>() >= 0 && v->get<double>() <= 1))
    return bad_request("temperature: Input should be between 0 and 1 (got " + v->dump() + ").", "temperature",
                       "invalid_value");
  return std::nullopt;
}

ApiError anthropic_error(ApiError e) {
  if (e.param.empty()) return e;
  const std::string_view p = e.param;
  auto starts = [&](std::string_view s) { return p.substr(0, s.size()) == s; };
  std::string renamed(p);
  if (p == "stop") {
    renamed = "stop_sequences";
  } else if (starts("tool_choice.function")) {
    renamed = "tool_choice" + std::string(p.substr(20));
  } else if (starts("tools[")) {
    const size_t close = p.find(']');
    constexpr std::string_view kFn = ".function";
    if (close != std::string_view::npos && p.substr(close + 1, kFn.size()) == kFn) {
      std::string rest(p.substr(close + 1 + kFn.size()));
      if (rest.rfind(".parameters", 0) == 0) rest = ".input_schema" + rest.substr(11);
      renamed = std::string(p.substr(0, close + 1)) + rest;
    }
  }
  if (renamed == e.param) return e;
  const std::string from = "'" + e.param + "'", to = "'" + renamed + "'";
  for (size_t at = e.message.find(from); at != std::string::npos; at = e.message.find(from, at + to.size()))
    e.message.replace(at, from.size(), to);
  e.param = std::move(renamed);
  return e;
}

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json anthropic_error_json(const ApiError& e) {
  return json{{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.message}}}};
}

void send_anthropic_error(HttpResponse& res, const ApiError& e) {
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  send_json(res, e.status, anthropic_error_json(e));
}

bool is_anthropic_path(std::string_view path) {
  return path == kPath || (path.size() > kPath.size() && path.starts_with(kPath) && path[kPath.size()] == '/');
}

// ---- content blocks ---------------------------------------------------------

void MessageContent::emit(const char* event, json data) {
  if (!sink_) return;
  data["type"] = event;
  sink_(event, std::move(data));
}

void MessageContent::open(Open kind) {
  if (open_ == kind) return;
  close();
  open_ = kind;
  json block = kind == Open::kThinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                       : json{{"type", "text"}, {"text", ""}};
  blocks_.push_back(block);
  emit("content_block_start", json{{"index", blocks_.size() - 1}, {"content_block", std::move(block)}});
}

void MessageContent::close() {
  if (open_ == Open::kNone) return;
  const size_t index = blocks_.size() - 1;
  if (open_ == Open::kThinking)  // Anthropic sends the block's signature last; nothing is signed here
    emit("content_block_delta", json{{"index", index}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
  emit("content_block_stop", json{{"index", index}});
  open_ = Open::kNone;
}

void MessageContent::add_thinking(const std::string& text) {
  open(Open::kThinking);
  blocks_.back()["thinking"] = blocks_.back()["thinking"].get<std::string>() + text;
  emit("content_block_delta",
       json{{"index", blocks_.size() - 1}, {"delta", {{"type", "thinking_delta"}, {"thinking", text}}}});
}

void MessageContent::add_text(const std::string& text) {
  if (open_ != Open::kText &&
      std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c) != 0; })) {
    pending_ws_ += text;
    return;
  }
  open(Open::kText);
  const std::string delta = std::exchange(pending_ws_, {}) + text;
  text_ += delta;
  blocks_.back()["text"] = blocks_.back()["text"].get<std::string>() + delta;
  emit("content_block_delta",
       json{{"index", blocks_.size() - 1}, {"delta", {{"type", "text_delta"}, {"text", delta}}}});
}

void MessageContent::add_tool_use(const engine::ParsedToolCall& call) {
  close();
  pending_ws_.clear();
  has_tool_use_ = true;
  // The arguments are the JSON text of an object (ChatOutputParser); the
  // block's input is that object, in the order the model wrote it.
  Json input = Json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded() || !input.is_object()) input = Json::object();
  const size_t index = blocks_.size();
  const std::string id = "toolu_" + new_tool_call_id().substr(5);
  blocks_.push_back(json{{"type", "tool_use"}, {"id", id}, {"name", call.name}, {"input", json::object()}});
  emit("content_block_start", json{{"index", index}, {"content_block", blocks_.back()}});
  const std::string input_text = input.dump();
  emit("content_block_delta",
       json{{"index", index}, {"delta", {{"type", "input_json_delta"}, {"partial_json", input_text}}}});
  emit("content_block_stop", json{{"index", index}});
  blocks_.back()["input"] = json::parse(input_text);
}

void MessageContent::add(const engine::ChatOutputDelta& d) {
  if (!d.reasoning.empty()) add_thinking(d.reasoning);
  if (!d.content.empty()) add_text(d.content);
  for (const auto& call : d.tool_calls) add_tool_use(call);
}

void MessageContent::finish() {
  if (blocks_.empty() && !pending_ws_.empty()) {
    open(Open::kText);  // the answer was blank: one text block with what there is
    const std::string ws = std::exchange(pending_ws_, {});
    text_ += ws;
    blocks_.back()["text"] = ws;
    emit("content_block_delta", json{{"index", 0}, {"delta", {{"type", "text_delta"}, {"text", ws}}}});
  }
  close();
}

// ---- the routes -------------------------------------------------------------

namespace {

// One admitted /v1/messages request.
struct MessageJob {
  std::string id;  // "msg_" + 24 hex digits
  bool stream = false;
  std::vector<std::string> stop_sequences;
  SubmittedChat chat;
};

// Anthropic's stop_reason and stop_sequence of a finished generation.
std::pair<std::string, json> stop_of(const MessageJob& job, const engine::GenerationResult& r, bool tool_use) {
  if (r.finish_reason == engine::FinishReason::kLength) return {"max_tokens", nullptr};
  if (!r.stop_sequence.empty() &&
      std::find(job.stop_sequences.begin(), job.stop_sequences.end(), r.stop_sequence) != job.stop_sequences.end())
    return {"stop_sequence", r.stop_sequence};
  return {tool_use ? "tool_use" : "end_turn", nullptr};
}

json message_object(const MessageJob& job, json content, json stop_reason, json stop_sequence, int64_t output_tokens) {
  return json{{"id", job.id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", job.chat.model},
              {"content", std::move(content)},
              {"stop_reason", std::move(stop_reason)},
              {"stop_sequence", std::move(stop_sequence)},
              {"usage", {{"input_tokens", job.chat.prompt_tokens}, {"output_tokens", output_tokens}}}};
}

// The answer to one /v1/messages job (ChatJobAnswer): SSE events as the
// text comes (stream), or one Message at the end.
struct MessagesAnswer : ChatJobAnswer {
  std::shared_ptr<MessageJob> job;
  MessageContent content;

  explicit MessagesAnswer(std::shared_ptr<MessageJob> j)
      : ChatJobAnswer(j->chat, j->stream, send_anthropic_error),
        job(std::move(j)),
        content(job->stream ? MessageContent::Sink([this](const char* name, json data) { event(name, data); })
                            : MessageContent::Sink()) {}

  // One event: "event: NAME\ndata: {"type": NAME, ...}\n\n".
  void event(const char* name, const json& data) {
    send("event: " + std::string(name) + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) +
         "\n\n");
  }

  void begin_stream() override {
    exchange().start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
    event("message_start",
          json{{"type", "message_start"}, {"message", message_object(*job, json::array(), nullptr, nullptr, 0)}});
    event("ping", json{{"type", "ping"}});
  }
  void take(const engine::ChatOutputDelta& d) override { content.add(d); }
  void stream_error(const ApiError& e) override { event("error", anthropic_error_json(e)); }
  void complete(const engine::GenerationResult& r) override {
    content.finish();
    auto [reason, sequence] = stop_of(*job, r, content.has_tool_use());
    if (job->stream) {
      event("message_delta", json{{"type", "message_delta"},
                                  {"delta", {{"stop_reason", reason}, {"stop_sequence", sequence}}},
                                  {"usage", {{"output_tokens", r.completion_tokens}}}});
      event("message_stop", json{{"type", "message_stop"}});
      exchange().end_stream();
    } else {
      HttpResponse res;
      send_json(res, 200, message_object(*job, content.blocks(), reason, sequence, r.completion_tokens));
      exchange().respond(std::move(res));
    }
  }
};

// The chat request a Messages body means, parsed by the chat parser.
std::optional<ApiError> chat_request(const MessagesRequest& mr, CompletionRequest& cr) {
  if (auto e = parse_completion_request_json(mr.chat, Endpoint::kChat, cr)) return anthropic_error(*e);
  return std::nullopt;
}

std::optional<SubmittedJob> create(const std::string& body, HttpResponse& res, engine::Clock::time_point admitted,
                                   const ChatSubmitter& submit) {
  auto fail = [&res](const ApiError& e) -> std::optional<SubmittedJob> {
    send_anthropic_error(res, e);
    return std::nullopt;
  };
  MessagesRequest mr;
  if (auto e = parse_messages_request(body, mr)) return fail(*e);
  CompletionRequest cr;
  if (auto e = chat_request(mr, cr)) return fail(*e);
  auto chat = submit(std::move(cr), admitted);
  if (!chat) return fail(anthropic_error(chat.error()));
  auto job = std::make_shared<MessageJob>();
  job->id = "msg_" + new_tool_call_id().substr(5);
  job->stream = mr.stream;
  job->stop_sequences = std::move(mr.stop_sequences);
  job->chat = std::move(*chat);
  auto handle = job->chat.handle;
  return SubmittedJob{std::move(handle), 1, std::make_shared<MessagesAnswer>(std::move(job))};
}

}  // namespace

void add_anthropic_routes(HttpTransport& http, ServerContext& ctx, ChatSubmitter submit, ChatCounter count) {
  add_job_route(
      http, ctx, std::string(kPath),
      [submit = std::move(submit)](const std::string& body, HttpResponse& res, engine::Clock::time_point admitted) {
        return create(body, res, admitted, submit);
      },
      send_anthropic_error);
  http.post_json(
      std::string(kPath) + "/count_tokens",
      [count = std::move(count)](const HttpRequest&, const std::string& body, HttpResponse& res) {
        MessagesRequest mr;
        if (auto e = parse_messages_request(body, mr, /*count_only=*/true)) return send_anthropic_error(res, *e);
        CompletionRequest cr;
        if (auto e = chat_request(mr, cr)) return send_anthropic_error(res, *e);
        auto n = count(std::move(cr));
        if (!n) return send_anthropic_error(res, anthropic_error(n.error()));
        send_json(res, 200, json{{"input_tokens", *n}});
      },
      [](const HttpRequest&, HttpResponse& res) {
        send_anthropic_error(res, bad_request("The request body must be JSON (got multipart/form-data)."));
      });
  // Other paths and methods under /v1/messages: Anthropic's 404 (the
  // transport's own 404 is OpenAI's shape).
  auto unknown = [](const std::shared_ptr<Exchange>& ex) {
    const HttpRequest& req = ex->request();
    ApiError e;
    e.status = 404;
    e.message = "Unknown request URL: " + req.method + " " + req.path + ".";
    HttpResponse res;
    send_anthropic_error(res, e);
    ex->respond(std::move(res));
  };
  for (const char* method : {"GET", "POST", "PUT", "PATCH", "DELETE"}) {
    http.route(method, std::string(kPath) + "/*", unknown, Dispatch::kInline);
    if (std::string_view(method) != "POST") http.route(method, std::string(kPath), unknown, Dispatch::kInline);
  }
}

}  // namespace bonsai::server
