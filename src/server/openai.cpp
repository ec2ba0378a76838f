// OpenAI request parsing/validation and response builders. See openai.h.
#include "server/openai.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <random>

#include "server/structured_output.h"  // build_output_grammar
#include "tokenizer/unicode.h"         // sanitize_utf8

namespace bonsai::server {

using nlohmann::json;

json ApiError::to_json() const {
  json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}};
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError overloaded(std::string message, std::string code, int retry_after_s) {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.message = std::move(message);
  e.code = std::move(code);
  e.retry_after_s = retry_after_s;
  return e;
}

namespace {

// Request bodies are read in document order (tool schemas and object-valued
// tool-call arguments keep the client's key order through the chat
// template's tojson), parsed once per request.
using Json = nlohmann::ordered_json;

// Reads an optional number in [lo, hi]; null means absent.
std::optional<ApiError> get_number(const Json& body, const char* field, double lo, double hi,
                                   std::optional<float>& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return wrong_type(field, "a number", *it);
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return bad_request("Invalid value for '" + std::string(field) + "': " + it->dump() + " is not in [" +
                           json(lo).dump() + ", " + json(hi).dump() + "].",
                       field, "invalid_value");
  }
  out = static_cast<float>(v);
  return std::nullopt;
}

// Reads an optional integer in [lo, hi]; 3.0 counts as an integer, 3.5 does not.
std::optional<ApiError> get_int(const Json& body, const char* field, int64_t lo, int64_t hi,
                                std::optional<int64_t>& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  int64_t v = 0;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return bad_request(
          "Invalid value for '" + std::string(field) + "': " + it->dump() + " is above " + std::to_string(hi) + ".",
          field, "invalid_value");
    }
    v = it->get<int64_t>();
  } else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()) {
    const double d = it->get<double>();  // integral: 3.0 and 1e300 are integers, the latter out of range
    if (!(d >= static_cast<double>(lo) && d < static_cast<double>(hi) + 1.0)) {
      return bad_request("Invalid value for '" + std::string(field) + "': " + it->dump() + " is not in [" +
                             std::to_string(lo) + ", " + std::to_string(hi) + "].",
                         field, "invalid_value");
    }
    v = static_cast<int64_t>(d);
  } else {
    return wrong_type(field, "an integer", *it);
  }
  if (v < lo || v > hi) {
    return bad_request("Invalid value for '" + std::string(field) + "': " + std::to_string(v) + " is not in [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "].",
                       field, "invalid_value");
  }
  out = v;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const Json& body, const char* field, bool& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(field, "a boolean", *it);
  out = it->get<bool>();
  return std::nullopt;
}

ApiError missing(const std::string& field) {
  return bad_request("Missing required parameter: '" + field + "'.", field, "missing_required_parameter");
}

// An optional string member `key` of `obj` (null means absent); `where` is
// obj's path ("" for the request body itself).
std::optional<ApiError> check_optional_string(const Json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null() || it->is_string()) return std::nullopt;
  return wrong_type(where.empty() ? std::string(key) : where + "." + key, "a string", *it);
}

// The function-tool names declared in `tools` (validated by parse_tools).
std::vector<std::string> tool_names(const Json& tools) {
  std::vector<std::string> names;
  for (const Json& t : tools) names.push_back(t["function"]["name"].get<std::string>());
  return names;
}

// OpenAI chat `tools` (API reference, "Create chat completion" > tools): an
// array of {"type": "function", "function": {"name": string, "description"?:
// string, "parameters"?: object (a JSON Schema), "strict"?: boolean}}. The
// entries are handed to the chat template as they are, so each one is
// checked here; a malformed entry is a 400 naming it ("tools[1].function.name").
// Then `tool_choice`: "none" | "auto" | "required", or {"type": "function",
// "function": {"name": one of the tools}}; anything but "none"/"auto" needs
// tools. And `parallel_tool_calls`: a boolean.
std::optional<ApiError> parse_tools(const Json& body) {
  const Json* tools = nullptr;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return wrong_type("tools", "an array", *t);
    tools = &*t;
    for (size_t i = 0; i < t->size(); ++i) {
      const Json& tool = (*t)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object()) return wrong_type(where, "an object", tool);
      auto type = tool.find("type");
      if (type == tool.end() || type->is_null()) return missing(where + ".type");
      if (!type->is_string()) return wrong_type(where + ".type", "a string", *type);
      if (*type != "function")
        return bad_request(
            "Invalid value for '" + where + ".type': " + type->dump() + ". Supported values are: 'function'.",
            where + ".type", "invalid_value");
      auto fn = tool.find("function");
      if (fn == tool.end() || fn->is_null()) return missing(where + ".function");
      if (!fn->is_object()) return wrong_type(where + ".function", "an object", *fn);
      const std::string fw = where + ".function";
      auto name = fn->find("name");
      if (name == fn->end() || name->is_null()) return missing(fw + ".name");
      if (!name->is_string()) return wrong_type(fw + ".name", "a string", *name);
      const std::string& nm = name->get_ref<const std::string&>();
      if (nm.empty())
        return bad_request("Invalid '" + fw + ".name': empty string. Expected a string with minimum length 1.",
                           fw + ".name", "empty_string");
      // OpenAI's rule for function names: a-z, A-Z, 0-9, '_' and '-', at most 64 characters.
      const bool name_ok = nm.size() <= 64 && std::all_of(nm.begin(), nm.end(), [](char ch) {
                             return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                                    ch == '_' || ch == '-';
                           });
      if (!name_ok)
        return bad_request("Invalid '" + fw +
                               ".name': string does not match pattern. Expected a string that "
                               "matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.",
                           fw + ".name", "invalid_value");
      if (auto e = check_optional_string(*fn, "description", fw)) return e;
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object())
        return wrong_type(fw + ".parameters", "an object (a JSON Schema)", *p);
      if (auto s = fn->find("strict"); s != fn->end() && !s->is_null() && !s->is_boolean())
        return wrong_type(fw + ".strict", "a boolean", *s);
    }
  }
  const bool have_tools = tools != nullptr && !tools->empty();
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_string()) {
      const std::string& v = c->get_ref<const std::string&>();
      if (v != "none" && v != "auto" && v != "required")
        return bad_request(
            "Invalid value for 'tool_choice': " + c->dump() + ". Supported values are: 'none', 'auto' and 'required'.",
            "tool_choice", "invalid_value");
      if (v == "required" && !have_tools)
        return bad_request("Invalid value for 'tool_choice': 'required' is only allowed when 'tools' are specified.",
                           "tool_choice", "invalid_value");
    } else if (c->is_object()) {
      auto type = c->find("type");
      if (type == c->end() || type->is_null()) return missing("tool_choice.type");
      if (!type->is_string()) return wrong_type("tool_choice.type", "a string", *type);
      if (*type != "function")
        return bad_request(
            "Invalid value for 'tool_choice.type': " + type->dump() + ". Supported values are: 'function'.",
            "tool_choice.type", "invalid_value");
      auto fn = c->find("function");
      if (fn == c->end() || fn->is_null()) return missing("tool_choice.function");
      if (!fn->is_object()) return wrong_type("tool_choice.function", "an object", *fn);
      auto name = fn->find("name");
      if (name == fn->end() || name->is_null()) return missing("tool_choice.function.name");
      if (!name->is_string()) return wrong_type("tool_choice.function.name", "a string", *name);
      const std::vector<std::string> names = have_tools ? tool_names(*tools) : std::vector<std::string>{};
      if (std::find(names.begin(), names.end(), name->get<std::string>()) == names.end())
        return bad_request(
            "Invalid value for 'tool_choice': no function named " + name->dump() + " is declared in 'tools'.",
            "tool_choice.function.name", "invalid_value");
    } else {
      return wrong_type("tool_choice", "a string or an object", *c);
    }
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null() && !p->is_boolean())
    return wrong_type("parallel_tool_calls", "a boolean", *p);
  return std::nullopt;
}

// OpenAI `response_format` (both endpoints accept it here): {"type": "text"},
// {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name":
// string, "description"?: string, "schema"?: object, "strict"?: boolean}}.
// The shape is checked here; build_output_grammar (structured_output.h) turns it into the grammar.
std::optional<ApiError> check_response_format(const Json& body) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return wrong_type("response_format", "an object", *it);
  auto type = it->find("type");
  if (type == it->end() || type->is_null()) return missing("response_format.type");
  if (!type->is_string()) return wrong_type("response_format.type", "a string", *type);
  if (*type == "text" || *type == "json_object") return std::nullopt;
  if (*type != "json_schema")
    return bad_request("Invalid value for 'response_format.type': " + type->dump() +
                           ". Supported values are: 'text', 'json_object' and 'json_schema'.",
                       "response_format.type", "invalid_value");
  auto js = it->find("json_schema");
  if (js == it->end() || js->is_null()) return missing("response_format.json_schema");
  if (!js->is_object()) return wrong_type("response_format.json_schema", "an object", *js);
  auto name = js->find("name");
  if (name == js->end() || name->is_null()) return missing("response_format.json_schema.name");
  if (!name->is_string()) return wrong_type("response_format.json_schema.name", "a string", *name);
  if (auto e = check_optional_string(*js, "description", "response_format.json_schema")) return e;
  if (auto s = js->find("schema"); s != js->end() && !s->is_null() && !s->is_object())
    return wrong_type("response_format.json_schema.schema", "an object (a JSON Schema)", *s);
  if (auto s = js->find("strict"); s != js->end() && !s->is_null() && !s->is_boolean())
    return wrong_type("response_format.json_schema.strict", "a boolean", *s);
  return std::nullopt;
}

// `messages`: the array is checked here, each message by the one OpenAI
// message reader (tokenizer::parse_chat_message), on the body in document
// order (object-valued tool-call arguments keep the client's key order, as
// the chat template's tojson writes them).
std::optional<ApiError> parse_messages(const Json& body, CompletionRequest& out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null())
    return bad_request("Missing required parameter: 'messages'.", "messages", "missing_required_parameter");
  if (!it->is_array()) return wrong_type("messages", "an array", *it);
  if (it->empty())
    return bad_request("Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages",
                       "empty_array");
  for (size_t i = 0; i < it->size(); ++i) {
    // OpenAI requires `content` of user, system, developer and tool messages
    // (an assistant's may be null or left out when it calls tools).
    if (const Json& m = (*it)[i]; m.is_object()) {
      const auto role = m.find("role");
      const auto content = m.find("content");
      if (role != m.end() && role->is_string() && *role != "assistant" && (content == m.end() || content->is_null())) {
        const std::string field = "messages[" + std::to_string(i) + "].content";
        return bad_request("Missing required parameter: '" + field + "'.", field, "missing_required_parameter");
      }
    }
    auto msg = tokenizer::parse_chat_message((*it)[i], i);
    if (!msg) return bad_request(msg.error().message, msg.error().param, msg.error().code);
    out.messages.push_back(std::move(*msg));
  }
  if (auto e = parse_tools(body)) return e;
  if (auto c = body.find("tool_choice"); c != body.end() && c->is_string() && *c == "none") out.tool_choice_none = true;
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) return wrong_type("chat_template_kwargs", "an object", *k);
    if (auto e = get_bool(*k, "enable_thinking", out.enable_thinking)) {
      e->param = "chat_template_kwargs.enable_thinking";
      return e;
    }
  }
  if (auto t = body.find("tools"); t != body.end() && t->is_array()) out.tools = *t;
  // llama-server's reasoning_format, per request (overrides --reasoning-format).
  if (auto f = body.find("reasoning_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string()) return wrong_type("reasoning_format", "a string", *f);
    const std::string v = f->get<std::string>();
    if (v != "none" && v != "deepseek" && v != "deepseek-legacy" && v != "auto")
      return bad_request("Invalid value for 'reasoning_format': '" + v +
                             "'. Supported values are: 'none', 'deepseek', 'deepseek-legacy' and 'auto'.",
                         "reasoning_format", "invalid_value");
    out.parse_reasoning = v != "none";
  }
  // OpenAI's reasoning_effort: "none" turns thinking off (as
  // chat_template_kwargs.enable_thinking false does, which wins when sent);
  // the other levels leave the model's thinking on (no budget is enforced).
  if (auto r = body.find("reasoning_effort"); r != body.end() && !r->is_null()) {
    if (!r->is_string()) return wrong_type("reasoning_effort", "a string", *r);
    const std::string v = r->get<std::string>();
    if (v != "none" && v != "minimal" && v != "low" && v != "medium" && v != "high" && v != "xhigh")
      return bad_request("Invalid value for 'reasoning_effort': '" + v +
                             "'. Supported values are: 'none', 'minimal', 'low', 'medium', 'high' and 'xhigh'.",
                         "reasoning_effort", "invalid_value");
    const auto k = body.find("chat_template_kwargs");
    const bool kwargs_say =
        k != body.end() && k->is_object() && k->contains("enable_thinking") && !(*k)["enable_thinking"].is_null();
    if (v == "none" && !kwargs_say) out.enable_thinking = false;
  }
  if (auto c = body.find("continue_final_message"); c != body.end() && !c->is_null()) {
    if (!c->is_boolean()) return wrong_type("continue_final_message", "a boolean", *c);
    out.continue_final_message = c->get<bool>();
  }
  return std::nullopt;
}

}  // namespace

bool continues_final_message(const CompletionRequest& cr) {
  if (cr.continue_final_message) return *cr.continue_final_message;
  return !cr.messages.empty() && cr.messages.back().role == "assistant" && cr.messages.back().tool_calls.empty();
}

namespace {

std::optional<ApiError> parse_prompt(const Json& body, CompletionRequest& out) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null())
    return bad_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter");
  if (it->is_string()) {
    out.prompt = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return wrong_type("prompt", "a string, an array of strings or an array of tokens", *it);
  if (it->empty()) return bad_request("Invalid 'prompt': empty array.", "prompt", "empty_array");
  // A token array: non-negative int32 ids (`field` names it in the 400).
  auto token_ids = [](const Json& arr, const std::string& field, std::vector<int32_t>& ids) -> std::optional<ApiError> {
    for (const Json& v : arr) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
        return bad_request("Invalid '" + field + "': a token array must hold non-negative integers.", field,
                           "invalid_value");
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return std::nullopt;
  };
  // llama-server's mixed prompt: token ids and strings in one array, one prompt.
  auto is_mixed = [](const Json& arr) {
    bool ids = false, texts = false;
    for (const Json& v : arr) {
      if (v.is_string()) {
        texts = true;
      } else if (v.is_number()) {
        ids = true;
      } else {
        return false;
      }
    }
    return ids && texts;
  };
  auto mixed = [](const Json& arr, const std::string& field,
                  std::vector<engine::PromptPiece>& pieces) -> std::optional<ApiError> {
    for (size_t k = 0; k < arr.size(); ++k) {
      const Json& v = arr[k];
      if (v.is_string()) {
        pieces.push_back(engine::PromptPiece{-1, v.get<std::string>()});
      } else if (v.is_number_integer() && v.get<int64_t>() >= 0 &&
                 v.get<int64_t>() <= std::numeric_limits<int32_t>::max()) {
        pieces.push_back(engine::PromptPiece{static_cast<int32_t>(v.get<int64_t>()), {}});
      } else {
        return bad_request("Invalid '" + field + "[" + std::to_string(k) +
                               "]': a prompt mixing token ids and strings holds non-negative integer ids.",
                           field, "invalid_value");
      }
    }
    return std::nullopt;
  };
  if (is_mixed(*it)) return mixed(*it, "prompt", out.prompt_pieces);
  if ((*it)[0].is_number_integer()) return token_ids(*it, "prompt", out.prompt_ids);
  // An array of prompts: strings or token arrays.
  if (it->size() > static_cast<size_t>(kMaxPrompts))
    return bad_request("Invalid 'prompt': at most " + std::to_string(kMaxPrompts) + " prompts per request (got " +
                           std::to_string(it->size()) + ").",
                       "prompt", "invalid_value");
  std::vector<CompletionRequest::BatchPrompt> prompts(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& p = (*it)[i];
    const std::string field = "prompt[" + std::to_string(i) + "]";
    if (p.is_string()) {
      prompts[i].text = p.get<std::string>();
    } else if (p.is_array()) {
      if (p.empty()) return bad_request("Invalid '" + field + "': empty token array.", field, "empty_array");
      if (auto e = is_mixed(p) ? mixed(p, field, prompts[i].pieces) : token_ids(p, field, prompts[i].ids)) return e;
    } else {
      return wrong_type(field, "a string or an array of tokens", p);
    }
  }
  if (prompts.size() == 1) {
    out.prompt = std::move(prompts[0].text);
    out.prompt_ids = std::move(prompts[0].ids);
    out.prompt_pieces = std::move(prompts[0].pieces);
  } else {
    out.prompts = std::move(prompts);
  }
  return std::nullopt;
}

}  // namespace

const char* json_type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    default:
      return "unknown";
  }
}

ApiError wrong_type(const std::string& field, const char* expected, const Json& got) {
  return bad_request(
      "Invalid type for '" + field + "': expected " + expected + ", but got " + json_type_name(got) + ".", field,
      "invalid_type");
}

bool json_nesting_exceeds(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

namespace {

// The body text as a JSON object (parsed once, in document order), or the
// 400 saying why not.
std::optional<ApiError> parse_body(std::string_view body_text, Json& body) {
  if (json_nesting_exceeds(body_text, kMaxJsonDepth))
    return bad_request(
        "The JSON body of your request nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels.",
        {}, "invalid_json");
  body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    return bad_request(
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
        "your HTTP library correctly. The OpenAI API expects a JSON payload.)",
        {}, "invalid_json");
  if (!body.is_object()) return bad_request("The request body must be a JSON object.", {}, "invalid_json");
  return std::nullopt;
}

// `model`, then what is generated from: chat `messages` (+ tools) or
// completions `prompt`.
std::optional<ApiError> parse_input(const Json& body, Endpoint endpoint, CompletionRequest& out) {
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return wrong_type("model", "a string", *it);
    out.model = it->get<std::string>();
  }
  return endpoint == Endpoint::kChat ? parse_messages(body, out) : parse_prompt(body, out);
}

// Log probabilities (engine/logprobs.h: log-softmax of the raw logits).
// Chat: logprobs (bool) + top_logprobs (0..20, only with logprobs true, as
// OpenAI checks). Completions: logprobs = k (0..20; OpenAI's legacy limit is
// 5, vLLM's 20). Sets out.sampling.logprobs (-1: off).
std::optional<ApiError> parse_logprobs(const Json& body, Endpoint endpoint, CompletionRequest& out) {
  int32_t k = -1;
  if (endpoint == Endpoint::kChat) {
    bool lp = false;
    if (auto e = get_bool(body, "logprobs", lp)) return e;
    std::optional<int64_t> tl;
    if (auto e = get_int(body, "top_logprobs", 0, engine::kMaxTopLogprobs, tl)) return e;
    if (tl && *tl > 0 && !lp)
      return bad_request("Invalid value for 'top_logprobs': it may only be set when 'logprobs' is true.",
                         "top_logprobs", "invalid_value");
    if (lp) k = static_cast<int32_t>(tl.value_or(0));
  } else {
    std::optional<int64_t> lp;
    if (auto e = get_int(body, "logprobs", 0, engine::kMaxTopLogprobs, lp)) return e;
    if (lp) k = static_cast<int32_t>(*lp);
    std::optional<int64_t> tl;  // not a completions field; checked so a bad value is named
    if (auto e = get_int(body, "top_logprobs", 0, engine::kMaxTopLogprobs, tl)) return e;
  }
  out.sampling.logprobs = k;
  return std::nullopt;
}

// Completions only: `echo`, `suffix` (a non-empty one asks for
// fill-in-the-middle: CompletionRequest::fim; it needs a text prompt), and
// the legacy field that changes what is generated, refused rather than
// silently ignored: `best_of` only at 1 (it must also be >= n, as OpenAI checks).
std::optional<ApiError> parse_legacy_completion_fields(const Json& body, CompletionRequest& out) {
  if (auto e = get_bool(body, "echo", out.echo)) return e;
  auto not_done = [](const char* field, const char* what) {
    return bad_request(std::string("'") + field + "' is not supported by this server (" + what +
                           "); omit it or leave it at its default.",
                       field, "unsupported_value");
  };
  if (auto e = check_optional_string(body, "suffix", "")) return e;
  if (auto it = body.find("suffix"); it != body.end() && it->is_string() && !it->get<std::string>().empty()) {
    if (!out.prompt_ids.empty() || !out.prompt_pieces.empty())
      return bad_request("Invalid 'suffix': fill-in-the-middle needs a text 'prompt' (got token ids).", "suffix",
                         "invalid_value");
    if (!out.prompts.empty())
      return bad_request(
          "Invalid 'suffix': fill-in-the-middle takes one prompt (got " + std::to_string(out.prompts.size()) + ").",
          "suffix", "invalid_value");
    out.fim = FimRequest{it->get<std::string>(), {}, {}};
  }
  std::optional<int64_t> best_of;
  if (auto e = get_int(body, "best_of", 1, 20, best_of)) return e;
  if (best_of && *best_of > 1) return not_done("best_of", "candidates are not generated and ranked server-side");
  return std::nullopt;
}

// The numeric sampling fields, each checked against the API's range once
// (CompletionRequest::sampling lists them).
std::optional<ApiError> parse_sampling_numbers(const Json& body, engine::SamplingOverrides& s) {
  std::optional<int64_t> iv;
  // max_completion_tokens is the newer name; either may be sent (it wins if both).
  for (const char* f : {"max_tokens", "max_completion_tokens"}) {
    iv.reset();
    if (auto e = get_int(body, f, 1, std::numeric_limits<int32_t>::max(), iv)) return e;
    if (iv) s.max_tokens = static_cast<int32_t>(*iv);
  }
  if (auto e = get_number(body, "temperature", 0.0, 2.0, s.temperature)) return e;
  if (auto e = get_number(body, "top_p", 0.0, 1.0, s.top_p)) return e;
  if (s.top_p && *s.top_p <= 0.0f) s.top_p = 1e-6f;  // 0 = keep only the top token
  iv.reset();
  if (auto e = get_int(body, "top_k", 0, std::numeric_limits<int32_t>::max(), iv)) return e;
  if (iv) s.top_k = static_cast<int32_t>(*iv);
  if (auto e = get_number(body, "min_p", 0.0, 1.0, s.min_p)) return e;
  if (auto e = get_number(body, "repeat_penalty", 1e-6, 100.0, s.repeat_penalty)) return e;
  if (auto e = get_number(body, "presence_penalty", -2.0, 2.0, s.presence_penalty)) return e;
  if (auto e = get_number(body, "frequency_penalty", -2.0, 2.0, s.frequency_penalty)) return e;
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return wrong_type("seed", "an integer", *it);
    if (!it->is_number_unsigned() && it->get<int64_t>() == -1)
      s.seed = fresh_seed();  // llama.cpp's "random"; a missing seed stays unset (the server's default)
    else
      s.seed = it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  return std::nullopt;
}

// `stream_options`: {"include_usage"?: bool}.
std::optional<ApiError> parse_stream_options(const Json& body, CompletionRequest& out) {
  auto it = body.find("stream_options");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return wrong_type("stream_options", "an object", *it);
  if (auto e = get_bool(*it, "include_usage", out.include_usage)) {
    e->param = "stream_options.include_usage";
    e->message = "Invalid type for 'stream_options.include_usage': expected a boolean.";
    return e;
  }
  return std::nullopt;
}

// OpenAI `logit_bias`: {"token id": bias in [-100, 100]}. The pairs come out
// in key order (as strings: "42" before "7"), whatever the body's order.
std::optional<ApiError> parse_logit_bias(const Json& body, std::vector<std::pair<int32_t, float>>& out) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return wrong_type("logit_bias", "an object mapping token ids to biases", *it);
  std::vector<std::pair<std::string, const Json*>> items;
  for (const auto& [key, val] : it->items()) items.emplace_back(key, &val);
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [key, valp] : items) {
    const Json& val = *valp;
    int64_t id = -1;
    auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || ptr != key.data() + key.size() || id < 0 || id > std::numeric_limits<int32_t>::max())
      return bad_request("Invalid key in 'logit_bias': '" + key + "' is not a token id.", "logit_bias",
                         "invalid_value");
    if (!val.is_number()) return wrong_type("logit_bias." + key, "a number", val);
    const double b = val.get<double>();
    if (!(b >= -100.0 && b <= 100.0))
      return bad_request(
          "Invalid value in 'logit_bias' for token " + key + ": " + val.dump() + " is not in [-100, 100].",
          "logit_bias", "invalid_value");
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return std::nullopt;
}

// `stop`: a string or up to kMaxStop strings; empty ones are dropped.
std::optional<ApiError> parse_stop(const Json& body, std::vector<std::string>& out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    out.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (size_t k = 0; k < it->size(); ++k) {
      if (!(*it)[k].is_string()) return wrong_type("stop[" + std::to_string(k) + "]", "a string", (*it)[k]);
      out.push_back((*it)[k].get<std::string>());
    }
  } else {
    return wrong_type("stop", "a string or an array of strings", *it);
  }
  if (out.size() > kMaxStop)
    return bad_request("Invalid 'stop': at most " + std::to_string(kMaxStop) + " stop sequences are allowed.", "stop",
                       "invalid_value");
  std::erase_if(out, [](const std::string& s) { return s.empty(); });
  return std::nullopt;
}

// Structured outputs (structured_output.h): compiled here so a bad schema
// or grammar is this request's 400.
std::optional<ApiError> parse_output_grammar(const Json& body, Endpoint endpoint, CompletionRequest& out) {
  std::shared_ptr<const structured::Grammar> grammar;
  const bool constrained = body.contains("response_format") || body.contains("grammar") ||
                           body.contains("json_schema") || (endpoint == Endpoint::kChat && body.contains("tools"));
  if (constrained) {
    OutputGrammar og;
    if (auto e = build_output_grammar(body, endpoint, og)) return e;
    grammar = std::move(og.grammar);
    out.forced_tool_call = og.forced_tool_call;
  }
  out.sampling.grammar = std::move(grammar);
  return std::nullopt;
}

}  // namespace

namespace {
// The fields of a chat or completions body (legacy function-calling shapes
// already translated): parse_completion_request_json's work.
std::optional<ApiError> parse_completion_request_fields(const Json& body, Endpoint endpoint, CompletionRequest& out);
}  // namespace

std::optional<ApiError> parse_completion_request(std::string_view body_text, Endpoint endpoint,
                                                 CompletionRequest& out) {
  Json body;
  if (auto e = parse_body(body_text, body)) {
    out = CompletionRequest{};
    out.endpoint = endpoint;
    return e;
  }
  return parse_completion_request_json(body, endpoint, out);
}

namespace {

// Whether a chat body uses OpenAI's deprecated function calling: request
// fields `functions` / `function_call`, or messages with role "function" or
// an assistant `function_call`.
bool uses_legacy_functions(const Json& body) {
  if (body.contains("functions") || body.contains("function_call")) return true;
  auto m = body.find("messages");
  if (m == body.end() || !m->is_array()) return false;
  for (const Json& msg : *m)
    if (msg.is_object() && (msg.contains("function_call") || (msg.contains("role") && msg["role"] == "function")))
      return true;
  return false;
}

// Rewrites OpenAI's deprecated function-calling shapes in `body` into their
// tools equivalents (API reference, "Create chat completion", deprecated
// fields): `functions` [{name, description?, parameters?}] -> `tools`
// [{"type": "function", "function": f}] (ignored when `tools` is sent too);
// `function_call` "none" | "auto" | {"name"} -> `tool_choice` "none" |
// "auto" | {"type": "function", "function": {"name"}}; an assistant
// message's `function_call` {name, arguments} -> one tool call (id
// "call_" + name unless it also has tool_calls); a role "function" message
// {name, content} -> a tool message answering that call. The answer comes
// in tool_calls (clients of the old fields read the new ones too).
std::optional<ApiError> translate_legacy_functions(Json& body) {
  if (auto f = body.find("functions"); f != body.end()) {
    if (!f->is_null() && !f->is_array()) return wrong_type("functions", "an array", *f);
    if (f->is_array() && !body.contains("tools")) {
      Json tools = Json::array();
      for (const Json& fn : *f) tools.push_back(Json{{"type", "function"}, {"function", fn}});
      body["tools"] = std::move(tools);
    }
    body.erase("functions");
  }
  if (auto c = body.find("function_call"); c != body.end()) {
    if (c->is_string()) {
      if (*c != "none" && *c != "auto")
        return bad_request(
            "Invalid value for 'function_call': " + c->dump() + ". Supported values are: 'none' and 'auto'.",
            "function_call", "invalid_value");
      if (!body.contains("tool_choice")) body["tool_choice"] = *c;
    } else if (c->is_object()) {
      auto name = c->find("name");
      if (name == c->end() || name->is_null()) return missing("function_call.name");
      if (!name->is_string()) return wrong_type("function_call.name", "a string", *name);
      if (!body.contains("tool_choice"))
        body["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", *name}}}};
    } else if (!c->is_null()) {
      return wrong_type("function_call", "a string or an object", *c);
    }
    body.erase("function_call");
  }
  auto msgs = body.find("messages");
  if (msgs == body.end() || !msgs->is_array()) return std::nullopt;
  for (size_t i = 0; i < msgs->size(); ++i) {
    Json& m = (*msgs)[i];
    if (!m.is_object()) continue;
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (auto fc = m.find("function_call"); fc != m.end()) {
      if (!fc->is_null()) {
        if (!fc->is_object()) return wrong_type(where + ".function_call", "an object", *fc);
        auto name = fc->find("name");
        if (name == fc->end() || !name->is_string()) return missing(where + ".function_call.name");
        if (!m.contains("tool_calls")) {
          Json call{{"id", "call_" + name->get<std::string>()},
                    {"type", "function"},
                    {"function", {{"name", *name}, {"arguments", fc->value("arguments", Json("{}"))}}}};
          m["tool_calls"] = Json::array({std::move(call)});
        }
      }
      m.erase("function_call");
    }
    if (m.contains("role") && m["role"] == "function") {
      auto name = m.find("name");
      if (name == m.end() || !name->is_string()) return missing(where + ".name");
      m["role"] = "tool";
      if (!m.contains("tool_call_id")) m["tool_call_id"] = "call_" + name->get<std::string>();
    }
  }
  return std::nullopt;
}

// `e` (from a translated legacy body) with the tools fields named as the client sent them.
ApiError legacy_functions_error(ApiError e) {
  std::string p = e.param;
  if (p.rfind("tools[", 0) == 0) {
    const size_t close = p.find(']');
    std::string rest = close == std::string::npos ? std::string() : p.substr(close + 1);
    if (rest.rfind(".function", 0) == 0) rest = rest.substr(9);
    p = "functions" + p.substr(5, close == std::string::npos ? std::string::npos : close - 4) + rest;
  } else if (p == "tools") {
    p = "functions";
  } else if (p.rfind("tool_choice", 0) == 0) {
    p = "function_call";
  }
  if (p == e.param) return e;
  auto rename = [&e](const std::string& from, const std::string& to) {
    for (size_t at = e.message.find(from); at != std::string::npos; at = e.message.find(from, at + to.size()))
      e.message.replace(at, from.size(), to);
  };
  rename("'" + e.param + "'", "'" + p + "'");
  if (p == "function_call") rename("'tool_choice'", "'function_call'");
  e.param = p;
  return e;
}

}  // namespace

std::optional<ApiError> parse_completion_request_json(const nlohmann::ordered_json& body, Endpoint endpoint,
                                                      CompletionRequest& out) {
  if (endpoint == Endpoint::kChat && body.is_object() && uses_legacy_functions(body)) {
    Json translated = body;
    if (auto e = translate_legacy_functions(translated)) {
      out = CompletionRequest{};
      out.endpoint = endpoint;
      return e;
    }
    if (auto e = parse_completion_request_fields(translated, endpoint, out)) return legacy_functions_error(*e);
    return std::nullopt;
  }
  return parse_completion_request_fields(body, endpoint, out);
}

namespace {

std::optional<ApiError> parse_completion_request_fields(const Json& body, Endpoint endpoint, CompletionRequest& out) {
  out = CompletionRequest{};
  out.endpoint = endpoint;
  if (auto e = parse_input(body, endpoint, out)) return e;
  if (auto e = check_response_format(body)) return e;
  if (auto e = check_optional_string(body, "user", "")) return e;
  if (auto e = parse_logprobs(body, endpoint, out)) return e;
  if (endpoint == Endpoint::kCompletion) {
    if (auto e = parse_legacy_completion_fields(body, out)) return e;
  }
  engine::SamplingOverrides& s = out.sampling;
  if (auto e = parse_sampling_numbers(body, s)) return e;
  std::optional<int64_t> n;
  if (auto e = get_int(body, "n", 1, kMaxChoices, n)) return e;
  if (n) out.n = static_cast<int>(*n);
  if (!out.prompts.empty() && out.prompts.size() * static_cast<size_t>(out.n) > static_cast<size_t>(kMaxPrompts))
    return bad_request("Invalid 'prompt': " + std::to_string(out.prompts.size()) + " prompts with n " +
                           std::to_string(out.n) + " ask for " + std::to_string(out.prompts.size() * out.n) +
                           " choices; at most " + std::to_string(kMaxPrompts) + " per request.",
                       "prompt", "invalid_value");
  if (auto e = get_bool(body, "stream", out.stream)) return e;
  if (auto e = get_bool(body, "cache_prompt", out.cache_prompt)) return e;  // llama-server's
  bool ignore_eos = false;
  if (auto e = get_bool(body, "ignore_eos", ignore_eos)) return e;
  s.ignore_eos = ignore_eos;
  if (auto e = parse_stream_options(body, out)) return e;
  if (auto e = parse_logit_bias(body, s.logit_bias.emplace())) return e;
  if (auto e = parse_stop(body, s.stop.emplace())) return e;
  if (auto e = parse_output_grammar(body, endpoint, out)) return e;
  if (out.echo && out.logprobs() >= 0) s.prompt_logprobs = out.logprobs();  // echo: the prompt's too
  // Kept for a grammar compiled again in the model's answer form (the
  // server learns the model's template only after parsing).
  if (s.grammar.has_value() && *s.grammar != nullptr) out.grammar_source = body;
  return std::nullopt;
}

}  // namespace

json Usage::to_json() const {
  json j{{"prompt_tokens", prompt_tokens},
         {"completion_tokens", completion_tokens},
         {"total_tokens", prompt_tokens + completion_tokens}};
  if (cached_tokens >= 0) j["prompt_tokens_details"] = json{{"cached_tokens", cached_tokens}};
  return j;
}

uint64_t fresh_seed() {
  static std::mutex mu;
  static std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
                             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::lock_guard lock(mu);
  return rng();
}

std::string new_response_id(Endpoint endpoint) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
  uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i) id += hex[(a >> (4 * i)) & 15];
  for (int i = 0; i < 8; ++i) id += hex[(b >> (4 * i)) & 15];
  return id;
}

std::string new_tool_call_id() {
  std::string id = new_response_id(Endpoint::kCompletion);  // "cmpl-" + 24 hex digits
  return "call_" + id.substr(5);
}

namespace {

json envelope(const ResponseMeta& meta, bool chunk) {
  json j;
  j["id"] = meta.id;
  if (meta.endpoint == Endpoint::kChat) {
    j["object"] = chunk ? "chat.completion.chunk" : "chat.completion";
  } else {
    j["object"] = "text_completion";
  }
  j["created"] = meta.created;
  j["model"] = meta.model;
  j["system_fingerprint"] = "bonsai";
  return j;
}

}  // namespace

json build_response(const ResponseMeta& meta, const std::vector<Choice>& choices, const Usage& usage) {
  json j = envelope(meta, false);
  json arr = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json c;
    c["index"] = i;
    if (meta.endpoint == Endpoint::kChat) {
      const Choice& ch = choices[i];
      json msg{{"role", "assistant"}};
      // OpenAI: content is null for a message that only calls tools.
      msg["content"] = ch.text.empty() && !ch.tool_calls.empty() ? json(nullptr) : json(ch.text);
      if (!ch.reasoning.empty()) msg["reasoning_content"] = ch.reasoning;
      if (!ch.tool_calls.empty()) {
        json calls = json::array();
        for (const auto& tc : ch.tool_calls) {
          calls.push_back({{"id", new_tool_call_id()},
                           {"type", "function"},
                           {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
        }
        msg["tool_calls"] = std::move(calls);
      }
      c["message"] = std::move(msg);
    } else {
      c["text"] = choices[i].text;
    }
    c["logprobs"] = choices[i].logprobs;
    c["finish_reason"] = choices[i].finish_reason;
    arr.push_back(std::move(c));
  }
  j["choices"] = std::move(arr);
  j["usage"] = usage.to_json();
  return j;
}

namespace {

json chunk_with(const ResponseMeta& meta, int index, json delta_or_text, json finish, json logprobs = nullptr) {
  json j = envelope(meta, true);
  json c;
  c["index"] = index;
  if (meta.endpoint == Endpoint::kChat) {
    c["delta"] = std::move(delta_or_text);
  } else {
    c["text"] = std::move(delta_or_text);
  }
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = std::move(finish);
  j["choices"] = json::array({std::move(c)});
  return j;
}

}  // namespace

json build_role_chunk(const ResponseMeta& meta, int index) {
  if (meta.endpoint == Endpoint::kChat)
    return chunk_with(meta, index, json{{"role", "assistant"}, {"content", ""}}, nullptr);
  return chunk_with(meta, index, "", nullptr);
}

json build_content_chunk(const ResponseMeta& meta, int index, std::string_view text, json logprobs) {
  if (meta.endpoint == Endpoint::kChat)
    return chunk_with(meta, index, json{{"content", text}}, nullptr, std::move(logprobs));
  return chunk_with(meta, index, json(text), nullptr, std::move(logprobs));
}

json build_reasoning_chunk(const ResponseMeta& meta, int index, std::string_view text) {
  return chunk_with(meta, index, json{{"reasoning_content", text}}, nullptr);
}

json build_tool_call_chunk(const ResponseMeta& meta, int index, int call_index, const engine::ParsedToolCall& call,
                           const std::string& call_id) {
  json tc{{"index", call_index},
          {"id", call_id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  return chunk_with(meta, index, json{{"tool_calls", json::array({std::move(tc)})}}, nullptr);
}

json build_finish_chunk(const ResponseMeta& meta, int index, std::string_view finish_reason, json logprobs) {
  if (meta.endpoint == Endpoint::kChat)
    return chunk_with(meta, index, json::object(), json(finish_reason), std::move(logprobs));
  return chunk_with(meta, index, "", json(finish_reason), std::move(logprobs));
}

namespace {

json byte_values(const std::string& bytes) {
  json b = json::array();
  for (const char ch : bytes) b.push_back(static_cast<int>(static_cast<unsigned char>(ch)));
  return b;
}

json number_or_null(float v) { return std::isnan(v) ? json(nullptr) : json(v); }

}  // namespace

json build_chat_logprobs(const std::vector<LogprobEntry>& entries) {
  json content = json::array();
  for (const auto& e : entries) {
    json top = json::array();
    for (const auto& [bytes, lp] : e.top)
      top.push_back(
          {{"token", tokenizer::unicode::sanitize_utf8(bytes)}, {"logprob", lp}, {"bytes", byte_values(bytes)}});
    content.push_back({{"token", tokenizer::unicode::sanitize_utf8(e.bytes)},
                       {"logprob", number_or_null(e.logprob)},
                       {"bytes", byte_values(e.bytes)},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}, {"refusal", nullptr}};
}

json build_completion_logprobs(const std::vector<LogprobEntry>& entries, int64_t offset0) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t off = offset0;
  for (const auto& e : entries) {
    tokens.push_back(tokenizer::unicode::sanitize_utf8(e.bytes));
    token_lps.push_back(number_or_null(e.logprob));
    if (std::isnan(e.logprob)) {
      tops.push_back(nullptr);
    } else {
      json t = json::object();  // token text -> logprob; a repeated text keeps the likelier entry
      for (const auto& [bytes, lp] : e.top) {
        const std::string key = tokenizer::unicode::sanitize_utf8(bytes);
        if (!t.contains(key)) t[key] = lp;
      }
      tops.push_back(std::move(t));
    }
    offsets.push_back(std::max<int64_t>(off, 0));
    off += static_cast<int64_t>(e.bytes.size());
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

void append_logprobs(json& into, const json& more) {
  if (more.is_null()) return;
  if (into.is_null()) {
    into = more;
    return;
  }
  for (auto it = more.begin(); it != more.end(); ++it) {
    if (!it->is_array()) continue;  // "refusal": null
    json& dst = into[it.key()];
    for (const auto& v : *it) dst.push_back(v);
  }
}

json build_usage_chunk(const ResponseMeta& meta, const Usage& usage) {
  json j = envelope(meta, true);
  j["choices"] = json::array();
  j["usage"] = usage.to_json();
  return j;
}

std::string sse_event(const json& payload) {
  // dump() escapes newlines inside strings, so the payload is one line.
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

json model_object(const std::string& id, int64_t created) {
  return json{{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "bonsai"}};
}

}  // namespace bonsai::server
