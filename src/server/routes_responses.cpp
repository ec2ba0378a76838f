// POST /v1/responses, GET and DELETE /v1/responses/{id}. See routes_responses.h.
#include "server/routes_responses.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>

namespace bonsai::server {

namespace {

using Json = nlohmann::ordered_json;  // request side: document order (tool schemas, arguments)
using nlohmann::json;                 // answer side

constexpr std::string_view kPrefix = "/v1/responses/";

ApiError missing(const std::string& field) {
  return bad_request("Missing required parameter: '" + field + "'.", field, "missing_required_parameter");
}

ApiError bad_value(const std::string& field, const Json& got, const std::string& supported) {
  return bad_request("Invalid value for '" + field + "': " + got.dump() + ". Supported values are: " + supported + ".",
                     field, "invalid_value");
}

// `obj[key]` when present and not null, else nullptr.
const Json* member(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// A required string member `key` of `obj` (at `where`) into `out`.
std::optional<ApiError> required_string(const Json& obj, const char* key, const std::string& where, std::string& out) {
  const Json* v = member(obj, key);
  if (!v) return missing(where + "." + key);
  if (!v->is_string()) return wrong_type(where + "." + key, "a string", *v);
  out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> optional_of(const Json& obj, const char* key, const std::string& field,
                                    bool (Json::*is)() const, const char* expected) {
  const Json* v = member(obj, key);
  if (v && !(v->*is)()) return wrong_type(field, expected, *v);
  return std::nullopt;
}

// Message content: a string, or parts {"type": "input_text" | "output_text",
// "text"} (joined with "\n" as chat content parts are, parse_chat_message;
// "refusal" parts read as their text). Images, files and
// audio are refused: the models served read text only.
std::optional<ApiError> content_text(const Json& content, const std::string& where, std::string& out) {
  if (content.is_string()) {
    out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return wrong_type(where, "a string or an array of content parts", content);
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& part = content[k];
    const std::string pw = where + "[" + std::to_string(k) + "]";
    if (!part.is_object()) return wrong_type(pw, "an object", part);
    std::string type;
    if (auto e = required_string(part, "type", pw, type)) return e;
    std::string text;
    if (type == "input_text" || type == "output_text") {
      if (auto e = required_string(part, "text", pw, text)) return e;
    } else if (type == "refusal") {
      if (auto e = required_string(part, "refusal", pw, text)) return e;
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      return bad_request("Invalid value for '" + pw + ".type': '" + type +
                             "' is not supported: the models this server runs read text only.",
                         pw + ".type", "unsupported_value");
    } else {
      return bad_value(pw + ".type", part["type"], "'input_text' and 'output_text'");
    }
    if (!out.empty()) out += '\n';
    out += text;
  }
  return std::nullopt;
}

// Text of a reasoning item: its reasoning_text content, else its summary.
std::optional<ApiError> reasoning_text(const Json& item, const std::string& where, std::string& out) {
  for (const char* key : {"content", "summary"}) {
    const Json* parts = member(item, key);
    if (!parts) continue;
    if (!parts->is_array()) return wrong_type(where + "." + key, "an array", *parts);
    std::string text;
    for (size_t k = 0; k < parts->size(); ++k) {
      const Json& p = (*parts)[k];
      const std::string pw = where + "." + key + "[" + std::to_string(k) + "]";
      if (!p.is_object()) return wrong_type(pw, "an object", p);
      std::string t;
      if (auto e = required_string(p, "text", pw, t)) return e;
      text += t;
    }
    if (!text.empty() && out.empty()) out = std::move(text);
  }
  return std::nullopt;
}

// `input` into OpenAI chat messages. function_call items join the assistant
// message before them (parallel calls are one assistant turn, as the chat
// template renders them); a reasoning item's text goes with the next
// assistant message as its reasoning_content.
std::optional<ApiError> translate_input(const Json& body, Json& messages) {
  const Json* input = member(body, "input");
  if (!input) return missing("input");
  if (input->is_string()) {
    messages.push_back(Json{{"role", "user"}, {"content", *input}});
    return std::nullopt;
  }
  if (!input->is_array()) return wrong_type("input", "a string or an array of input items", *input);
  std::string reasoning;  // waits for the next assistant message
  bool last_is_assistant = false;
  auto assistant = [&]() -> Json& {
    if (!last_is_assistant) {
      messages.push_back(Json{{"role", "assistant"}, {"content", nullptr}});
      last_is_assistant = true;
    }
    Json& m = messages.back();
    if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, {});
    return m;
  };
  for (size_t i = 0; i < input->size(); ++i) {
    const Json& item = (*input)[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return wrong_type(where, "an object", item);
    std::string type = "message";  // EasyInputMessage: {role, content} without a type
    if (const Json* t = member(item, "type")) {
      if (!t->is_string()) return wrong_type(where + ".type", "a string", *t);
      type = t->get<std::string>();
    }
    if (type == "message") {
      std::string role;
      if (auto e = required_string(item, "role", where, role)) return e;
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad_value(where + ".role", item["role"], "'user', 'assistant', 'system' and 'developer'");
      const Json* content = member(item, "content");
      if (!content) return missing(where + ".content");
      std::string text;
      if (auto e = content_text(*content, where + ".content", text)) return e;
      if (role == "assistant") {
        Json& m = assistant();
        if (m["content"].is_string()) text = m["content"].get<std::string>() + text;
        m["content"] = std::move(text);
      } else {
        messages.push_back(Json{{"role", role}, {"content", std::move(text)}});
        last_is_assistant = false;
      }
    } else if (type == "function_call") {
      std::string call_id, name, arguments;
      if (auto e = required_string(item, "call_id", where, call_id)) return e;
      if (auto e = required_string(item, "name", where, name)) return e;
      if (auto e = required_string(item, "arguments", where, arguments)) return e;
      Json& m = assistant();
      m["tool_calls"].push_back(
          Json{{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
    } else if (type == "function_call_output") {
      std::string call_id, output;
      if (auto e = required_string(item, "call_id", where, call_id)) return e;
      const Json* out = member(item, "output");
      if (!out) return missing(where + ".output");
      if (auto e = content_text(*out, where + ".output", output)) return e;
      messages.push_back(Json{{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(output)}});
      last_is_assistant = false;
    } else if (type == "reasoning") {
      if (auto e = reasoning_text(item, where, reasoning)) return e;
    } else {
      return bad_value(where + ".type", item["type"],
                       "'message', 'function_call', 'function_call_output' and 'reasoning'");
    }
  }
  return std::nullopt;
}

// `tools` (function tools, flat: {"type": "function", "name", "description"?,
// "parameters"?, "strict"?}) into chat's nested shape. Names, schemas and
// tool_choice against the names are checked by the chat parser.
std::optional<ApiError> translate_tools(const Json& body, Json& chat) {
  const Json* tools = member(body, "tools");
  if (!tools) return std::nullopt;
  if (!tools->is_array()) return wrong_type("tools", "an array", *tools);
  Json out = Json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& tool = (*tools)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) return wrong_type(where, "an object", tool);
    std::string type;
    if (auto e = required_string(tool, "type", where, type)) return e;
    if (type != "function")
      return bad_request("Invalid value for '" + where + ".type': '" + type +
                             "'. This server supports only 'function' tools (no hosted tools).",
                         where + ".type", "unsupported_value");
    std::string name;
    if (auto e = required_string(tool, "name", where, name)) return e;
    Json fn{{"name", name}};
    for (const char* key : {"description", "parameters", "strict"})
      if (const Json* v = member(tool, key)) fn[key] = *v;  // types checked by the chat parser
    out.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  chat["tools"] = std::move(out);
  return std::nullopt;
}

// `tool_choice`: "none" / "auto" / "required" (checked by the chat parser),
// or {"type": "function", "name"} (chat: {"type", "function": {"name"}}).
std::optional<ApiError> translate_tool_choice(const Json& body, Json& chat) {
  if (const Json* c = member(body, "tool_choice")) {
    if (c->is_object()) {
      std::string type;
      if (auto e = required_string(*c, "type", "tool_choice", type)) return e;
      if (type != "function") return bad_value("tool_choice.type", (*c)["type"], "'function'");
      std::string name;
      if (auto e = required_string(*c, "name", "tool_choice", name)) return e;
      chat["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", name}}}};
    } else {
      chat["tool_choice"] = *c;  // "none" / "auto" / "required", checked by the chat parser
    }
  }
  return std::nullopt;
}

// `text.format` into chat's response_format.
std::optional<ApiError> translate_text(const Json& body, Json& chat) {
  const Json* text = member(body, "text");
  if (!text) return std::nullopt;
  if (!text->is_object()) return wrong_type("text", "an object", *text);
  const Json* format = member(*text, "format");
  if (!format) return std::nullopt;
  if (!format->is_object()) return wrong_type("text.format", "an object", *format);
  std::string type;
  if (auto e = required_string(*format, "type", "text.format", type)) return e;
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    chat["response_format"] = Json{{"type", "json_object"}};
    return std::nullopt;
  }
  if (type != "json_schema")
    return bad_value("text.format.type", (*format)["type"], "'text', 'json_object' and 'json_schema'");
  std::string name;
  if (auto e = required_string(*format, "name", "text.format", name)) return e;
  const Json* schema = member(*format, "schema");
  if (!schema) return missing("text.format.schema");
  if (!schema->is_object()) return wrong_type("text.format.schema", "an object (a JSON Schema)", *schema);
  Json js{{"name", name}, {"schema", *schema}};
  for (const char* key : {"description", "strict"})
    if (const Json* v = member(*format, key)) js[key] = *v;
  chat["response_format"] = Json{{"type", "json_schema"}, {"json_schema", std::move(js)}};
  return std::nullopt;
}

json to_answer_json(const Json& v) { return json::parse(v.dump()); }

// The request fields a Response object repeats, with OpenAI's values when absent.
void fill_echo(const Json& body, json& echo) {
  auto get = [&](const char* key, json dflt) {
    const Json* v = member(body, key);
    echo[key] = v ? to_answer_json(*v) : std::move(dflt);
  };
  get("instructions", nullptr);
  get("max_output_tokens", nullptr);
  get("metadata", json::object());
  get("parallel_tool_calls", true);
  get("temperature", nullptr);
  get("top_p", nullptr);
  get("tool_choice", "auto");
  get("tools", json::array());
  get("truncation", "disabled");
  get("user", nullptr);
  json text{{"format", {{"type", "text"}}}};
  if (const Json* t = member(body, "text"); t && member(*t, "format")) text["format"] = to_answer_json((*t)["format"]);
  echo["text"] = std::move(text);
  json reasoning{{"effort", nullptr}, {"summary", nullptr}};
  if (const Json* r = member(body, "reasoning"))
    for (const char* key : {"effort", "summary"})
      if (const Json* v = member(*r, key)) reasoning[key] = to_answer_json(*v);
  echo["reasoning"] = std::move(reasoning);
}

// "<prefix>_" + 24 random hex digits (the generator of new_response_id).
std::string new_id(const char* prefix) {
  return std::string(prefix) + "_" + new_response_id(Endpoint::kCompletion).substr(5);
}

}  // namespace

std::optional<ApiError> parse_responses_request(std::string_view body_text, ResponsesRequest& out) {
  out = ResponsesRequest{};
  if (json_nesting_exceeds(body_text, kMaxJsonDepth))
    return bad_request(
        "The JSON body of your request nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels.",
        {}, "invalid_json");
  Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    return bad_request("We could not parse the JSON body of your request. The OpenAI API expects a JSON payload.", {},
                       "invalid_json");
  if (!body.is_object()) return bad_request("The request body must be a JSON object.", {}, "invalid_json");

  if (auto e = translate_input(body, out.input_messages)) return e;
  if (const Json* v = member(body, "instructions")) {
    if (!v->is_string()) return wrong_type("instructions", "a string", *v);
    out.instructions = v->get<std::string>();
  }
  if (const Json* v = member(body, "previous_response_id")) {
    if (!v->is_string()) return wrong_type("previous_response_id", "a string", *v);
    out.previous_response_id = v->get<std::string>();
  }
  for (auto [key, flag] : {std::pair{"store", &out.store}, std::pair{"stream", &out.stream}}) {
    if (const Json* v = member(body, key)) {
      if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
      *flag = v->get<bool>();
    }
  }
  if (const Json* m = member(body, "metadata")) {
    if (!m->is_object()) return wrong_type("metadata", "an object of string values", *m);
    if (m->size() > 16)
      return bad_request("Invalid 'metadata': at most 16 keys are allowed.", "metadata", "invalid_value");
    for (const auto& [k, v] : m->items())
      if (!v.is_string()) return wrong_type("metadata." + k, "a string", v);
  }
  if (auto e = optional_of(body, "truncation", "truncation", &Json::is_string, "a string")) return e;
  Json& chat = out.chat;
  if (const Json* r = member(body, "reasoning")) {
    if (!r->is_object()) return wrong_type("reasoning", "an object", *r);
    if (auto e = optional_of(*r, "effort", "reasoning.effort", &Json::is_string, "a string")) return e;
    if (const Json* effort = member(*r, "effort"); effort && *effort == "none")
      chat["chat_template_kwargs"] = Json{{"enable_thinking", false}};
  }
  if (auto e = translate_tools(body, chat)) return e;
  if (auto e = translate_tool_choice(body, chat)) return e;
  if (auto e = translate_text(body, chat)) return e;
  if (const Json* v = member(body, "max_output_tokens")) chat["max_completion_tokens"] = *v;
  // Checked by the chat parser under the same names.
  for (const char* key :
       {"model", "temperature", "top_p", "parallel_tool_calls", "user", "seed", "top_k", "min_p", "repeat_penalty",
        "presence_penalty", "frequency_penalty", "stop", "logit_bias", "ignore_eos", "grammar"})
    if (const Json* v = member(body, key)) chat[key] = *v;
  if (const Json* k = member(body, "chat_template_kwargs"); k && !chat.contains("chat_template_kwargs"))
    chat["chat_template_kwargs"] = *k;
  fill_echo(body, out.echo);
  return std::nullopt;
}

std::string responses_param(std::string_view p) {
  auto starts = [&](std::string_view s) { return p.substr(0, s.size()) == s; };
  if (starts("response_format.json_schema")) return "text.format" + std::string(p.substr(27));
  if (starts("response_format")) return "text.format" + std::string(p.substr(15));
  if (p == "max_completion_tokens" || p == "max_tokens") return "max_output_tokens";
  if (starts("messages")) return "input";
  if (starts("tool_choice.function")) return "tool_choice" + std::string(p.substr(20));
  if (starts("tools[")) {
    const size_t close = p.find(']');
    constexpr std::string_view kFn = ".function";
    if (close != std::string_view::npos && p.substr(close + 1, kFn.size()) == kFn)
      return std::string(p.substr(0, close + 1)) + std::string(p.substr(close + 1 + kFn.size()));
  }
  return std::string(p);
}

ApiError responses_error(ApiError e) {
  if (e.param.empty()) return e;
  const std::string renamed = responses_param(e.param);
  if (renamed == e.param) return e;
  const std::string from = "'" + e.param + "'", to = "'" + renamed + "'";
  for (size_t at = e.message.find(from); at != std::string::npos; at = e.message.find(from, at + to.size()))
    e.message.replace(at, from.size(), to);
  e.param = renamed;
  return e;
}

// ---- output items ---------------------------------------------------------

void ResponseOutput::emit(const char* type, json fields) {
  if (sink_) sink_(type, std::move(fields));
}

void ResponseOutput::open(Open kind) {
  if (open_ == kind) return;
  close(false);
  open_ = kind;
  open_text_.clear();
  const size_t index = items_.size();
  json item;
  json part;
  if (kind == Open::kReasoning) {
    item = json{{"id", new_id("rs")},
                {"type", "reasoning"},
                {"summary", json::array()},
                {"content", json::array()},
                {"status", "in_progress"}};
    part = json{{"type", "reasoning_text"}, {"text", ""}};
  } else {
    item = json{{"id", new_id("msg")},
                {"type", "message"},
                {"status", "in_progress"},
                {"role", "assistant"},
                {"content", json::array()}};
    part = json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}};
  }
  const std::string id = item["id"].get<std::string>();
  items_.push_back(item);
  emit("response.output_item.added", json{{"output_index", index}, {"item", std::move(item)}});
  items_.back()["content"].push_back(part);
  emit("response.content_part.added",
       json{{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", std::move(part)}});
}

void ResponseOutput::close(bool incomplete) {
  if (open_ == Open::kNone) return;
  const size_t index = items_.size() - 1;
  json& item = items_.back();
  const std::string id = item["id"].get<std::string>();
  json& part = item["content"][0];
  part["text"] = open_text_;
  const bool reasoning = open_ == Open::kReasoning;
  json done{{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", open_text_}};
  if (!reasoning) done["logprobs"] = json::array();
  emit(reasoning ? "response.reasoning_text.done" : "response.output_text.done", std::move(done));
  emit("response.content_part.done",
       json{{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  item["status"] = incomplete ? "incomplete" : "completed";
  emit("response.output_item.done", json{{"output_index", index}, {"item", item}});
  open_ = Open::kNone;
  open_text_.clear();
}

void ResponseOutput::add_reasoning(const std::string& text) {
  open(Open::kReasoning);
  open_text_ += text;
  reasoning_ += text;
  items_.back()["content"][0]["text"] = open_text_;
  emit("response.reasoning_text.delta", json{{"item_id", items_.back()["id"]},
                                             {"output_index", items_.size() - 1},
                                             {"content_index", 0},
                                             {"delta", text}});
}

void ResponseOutput::add_text(const std::string& text) {
  if (open_ != Open::kMessage &&
      std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c) != 0; })) {
    pending_ws_ += text;
    return;
  }
  open(Open::kMessage);
  const std::string delta = std::exchange(pending_ws_, {}) + text;
  open_text_ += delta;
  text_ += delta;
  items_.back()["content"][0]["text"] = open_text_;
  emit("response.output_text.delta", json{{"item_id", items_.back()["id"]},
                                          {"output_index", items_.size() - 1},
                                          {"content_index", 0},
                                          {"delta", delta},
                                          {"logprobs", json::array()}});
}

void ResponseOutput::add_call(const engine::ParsedToolCall& call) {
  close(false);
  pending_ws_.clear();
  const size_t index = items_.size();
  const std::string call_id = new_tool_call_id();
  json item{{"id", new_id("fc")}, {"type", "function_call"}, {"status", "in_progress"},
            {"call_id", call_id}, {"name", call.name},       {"arguments", ""}};
  const std::string id = item["id"].get<std::string>();
  items_.push_back(item);
  emit("response.output_item.added", json{{"output_index", index}, {"item", item}});
  emit("response.function_call_arguments.delta",
       json{{"item_id", id}, {"output_index", index}, {"delta", call.arguments}});
  emit("response.function_call_arguments.done",
       json{{"item_id", id}, {"output_index", index}, {"name", call.name}, {"arguments", call.arguments}});
  items_.back()["arguments"] = call.arguments;
  items_.back()["status"] = "completed";
  emit("response.output_item.done", json{{"output_index", index}, {"item", items_.back()}});
  calls_.push_back(
      Json{{"id", call_id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
}

void ResponseOutput::add(const engine::ChatOutputDelta& d) {
  if (!d.reasoning.empty()) add_reasoning(d.reasoning);
  if (!d.content.empty()) add_text(d.content);
  for (const auto& call : d.tool_calls) add_call(call);
}

void ResponseOutput::finish(bool incomplete) {
  if (items_.empty()) {
    open(Open::kMessage);  // the answer was empty or blank: one message with what there is
    const std::string ws = std::exchange(pending_ws_, {});
    open_text_ += ws;
    text_ += ws;
  }
  close(incomplete);
}

Json ResponseOutput::assistant_message() const {
  Json m{{"role", "assistant"}, {"content", text_}};
  if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
  if (!calls_.empty()) m["tool_calls"] = calls_;
  return m;
}

// ---- store ----------------------------------------------------------------

void ResponseStore::put(const std::string& id, json response, Json conversation) {
  auto e = std::make_shared<Entry>();
  e->bytes = response.dump().size() + conversation.dump().size() + id.size();
  e->response = std::move(response);
  e->conversation = std::move(conversation);
  if (e->bytes > max_bytes_ || max_entries_ == 0) return;
  std::lock_guard lock(mu_);
  if (auto it = index_.find(id); it != index_.end()) {
    bytes_ -= it->second->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  bytes_ += e->bytes;
  lru_.emplace_front(id, std::move(e));
  index_[id] = lru_.begin();
  while (lru_.size() > max_entries_ || bytes_ > max_bytes_) {
    bytes_ -= lru_.back().second->bytes;
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

std::shared_ptr<const ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= it->second->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

// ---- the routes -------------------------------------------------------------

namespace {

ApiError response_not_found(const std::string& id, const std::string& param = {}) {
  ApiError e =
      bad_request((param.empty() ? "Response" : "Previous response") + std::string(" with id '") + id + "' not found.",
                  param, param.empty() ? std::string() : "previous_response_not_found");
  e.status = 404;
  return e;
}

// One admitted /v1/responses request: its identity, what the Response
// object repeats, and what a stored response keeps.
struct ResponseJob {
  std::string id;
  int64_t created_at = 0;
  bool stream = false;
  bool store = true;
  std::string previous_response_id;
  json echo;
  Json conversation;  // earlier turns + this input (chat messages), without instructions
  SubmittedChat chat;
  std::shared_ptr<ResponseStore> responses;
};

// A Response object ("status": in_progress / completed / incomplete / failed).
json response_object(const ResponseJob& job, const std::string& status, json output, json usage, json error = nullptr) {
  json r{{"id", job.id},
         {"object", "response"},
         {"created_at", job.created_at},
         {"status", status},
         {"background", false},
         {"error", std::move(error)},
         {"incomplete_details", nullptr},
         {"model", job.chat.model},
         {"output", std::move(output)},
         {"previous_response_id", job.previous_response_id.empty() ? json(nullptr) : json(job.previous_response_id)},
         {"store", job.store},
         {"usage", std::move(usage)}};
  if (status == "incomplete") r["incomplete_details"] = json{{"reason", "max_output_tokens"}};
  for (const auto& [k, v] : job.echo.items()) r[k] = v;
  return r;
}

// OpenAI's Responses usage of a finished generation.
json usage_of(const ResponseJob& job, const engine::GenerationResult& r) {
  return json{{"input_tokens", job.chat.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", std::max<int64_t>(r.cached_tokens, 0)}}},
              {"output_tokens", r.completion_tokens},
              // Reasoning tokens are not counted apart from the answer's here.
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", job.chat.prompt_tokens + r.completion_tokens}};
}

// The answer to one /v1/responses job (ChatJobAnswer): typed SSE events as
// the text comes (stream), or one Response object at the end.
struct ResponsesAnswer : ChatJobAnswer {
  std::shared_ptr<ResponseJob> job;
  int64_t seq = 0;
  ResponseOutput out;

  explicit ResponsesAnswer(std::shared_ptr<ResponseJob> j)
      : ChatJobAnswer(j->chat, j->stream, send_error),
        job(std::move(j)),
        out(job->stream ? ResponseOutput::Sink([this](const char* type, json f) { event(type, std::move(f)); })
                        : ResponseOutput::Sink()) {}

  // One typed event: "event: TYPE\ndata: {"type": TYPE, ..., "sequence_number": n}\n\n".
  void event(const char* type, json fields) {
    if (!alive()) return;
    fields["type"] = type;
    fields["sequence_number"] = seq++;
    send("event: " + std::string(type) + "\ndata: " + fields.dump(-1, ' ', false, json::error_handler_t::replace) +
         "\n\n");
  }

  void begin_stream() override {
    exchange().start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
    const json r = response_object(*job, "in_progress", json::array(), nullptr);
    event("response.created", json{{"response", r}});
    event("response.in_progress", json{{"response", r}});
  }
  void take(const engine::ChatOutputDelta& d) override { out.add(d); }
  void stream_error(const ApiError& err) override {
    json e{{"code", err.code.empty() ? "server_error" : err.code}, {"message", err.message}};
    event("response.failed", json{{"response", response_object(*job, "failed", out.items(), nullptr, e)}});
  }
  void complete(const engine::GenerationResult& r) override {
    const bool incomplete = r.finish_reason == engine::FinishReason::kLength;
    out.finish(incomplete);
    json response = response_object(*job, incomplete ? "incomplete" : "completed", out.items(), usage_of(*job, r));
    if (job->store) {
      Json conversation = std::move(job->conversation);
      conversation.push_back(out.assistant_message());
      job->responses->put(job->id, response, std::move(conversation));
    }
    if (job->stream) {
      event(incomplete ? "response.incomplete" : "response.completed", json{{"response", std::move(response)}});
      exchange().end_stream();
    } else {
      HttpResponse res;
      send_json(res, 200, response);
      exchange().respond(std::move(res));
    }
  }
};

// Every tool message of `conversation` (a function_call_output item, this
// request's or a stored turn's) answers a tool call of an assistant message
// before it: else OpenAI's 400 "No tool call found for function call output
// with call_id ..." (param "input").
std::optional<ApiError> check_call_ids(const Json& conversation) {
  std::set<std::string> calls;
  for (const Json& m : conversation) {
    if (auto tc = m.find("tool_calls"); tc != m.end() && tc->is_array())
      for (const Json& call : *tc)
        if (auto id = call.find("id"); id != call.end() && id->is_string()) calls.insert(id->get<std::string>());
    if (m.value("role", "") != "tool") continue;
    const std::string id = m.value("tool_call_id", "");
    if (!calls.contains(id))
      return bad_request("No tool call found for function call output with call_id " + id + ".", "input");
  }
  return std::nullopt;
}

// POST /v1/responses: translate, continue a stored conversation, submit
// through the chat path.
std::optional<SubmittedJob> create(const std::string& body, HttpResponse& res, engine::Clock::time_point admitted,
                                   const ChatSubmitter& submit, const std::shared_ptr<ResponseStore>& store) {
  auto fail = [&res](const ApiError& e) -> std::optional<SubmittedJob> {
    send_error(res, e);
    return std::nullopt;
  };
  ResponsesRequest rr;
  if (auto e = parse_responses_request(body, rr)) return fail(*e);
  auto job = std::make_shared<ResponseJob>();
  job->conversation = Json::array();
  if (!rr.previous_response_id.empty()) {
    auto prev = store->get(rr.previous_response_id);
    if (!prev) return fail(response_not_found(rr.previous_response_id, "previous_response_id"));
    job->conversation = prev->conversation;
  }
  for (auto& m : rr.input_messages) job->conversation.push_back(std::move(m));
  if (auto e = check_call_ids(job->conversation)) return fail(*e);
  Json messages = Json::array();
  if (rr.instructions) messages.push_back(Json{{"role", "system"}, {"content", *rr.instructions}});
  for (const auto& m : job->conversation) messages.push_back(m);
  rr.chat["messages"] = std::move(messages);

  CompletionRequest cr;
  if (auto e = parse_completion_request_json(rr.chat, Endpoint::kChat, cr)) return fail(responses_error(*e));
  auto chat = submit(std::move(cr), admitted);
  if (!chat) return fail(responses_error(chat.error()));
  job->id = new_id("resp");
  job->created_at = unix_now();
  job->stream = rr.stream;
  job->store = rr.store;
  job->previous_response_id = rr.previous_response_id;
  job->echo = std::move(rr.echo);
  job->chat = std::move(*chat);
  job->responses = store;
  auto handle = job->chat.handle;
  return SubmittedJob{std::move(handle), 1, std::make_shared<ResponsesAnswer>(std::move(job))};
}

}  // namespace

void add_responses_routes(HttpTransport& http, ServerContext& ctx, ChatSubmitter submit) {
  auto store = std::make_shared<ResponseStore>(kResponseStoreMaxEntries, kResponseStoreMaxBytes);
  add_job_route(http, ctx, "/v1/responses",
                [submit = std::move(submit), store](const std::string& body, HttpResponse& res,
                                                    engine::Clock::time_point admitted) {
                  return create(body, res, admitted, submit, store);
                });
  const std::string pattern = std::string(kPrefix) + "*";
  http.get(pattern, [store](const HttpRequest& req, HttpResponse& res) {
    const std::string id = req.path.substr(kPrefix.size());
    auto e = store->get(id);
    if (!e) return send_error(res, response_not_found(id));
    send_json(res, 200, e->response);
  });
  http.route("DELETE", pattern, [store](const std::shared_ptr<Exchange>& ex) {
    const std::string id = ex->request().path.substr(kPrefix.size());
    HttpResponse res;
    if (store->erase(id)) {
      send_json(res, 200, json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
    } else {
      send_error(res, response_not_found(id));
    }
    ex->respond(std::move(res));
  });
}

}  // namespace bonsai::server
