// Built-in renderers for the ChatML template family. The Qwen3 and Qwen3.5
// renderers are line-by-line transcriptions of the Jinja templates those
// models ship in tokenizer_config.json / GGUF `tokenizer.chat_template`
// (comments quote them).
#include "tokenizer/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja.h"  // the interpreter of --jinja

namespace bonsai::tokenizer {

namespace {

// Python str.lstrip/rstrip/strip with a set of characters.
std::string_view lstrip(std::string_view s, std::string_view chars) {
  const size_t p = s.find_first_not_of(chars);
  return p == std::string_view::npos ? std::string_view() : s.substr(p);
}
std::string_view rstrip(std::string_view s, std::string_view chars) {
  const size_t p = s.find_last_not_of(chars);
  return p == std::string_view::npos ? std::string_view() : s.substr(0, p + 1);
}
std::string_view strip(std::string_view s, std::string_view chars) { return rstrip(lstrip(s, chars), chars); }

// Python s.split(sep)[0] and s.split(sep)[-1].
std::string_view before_first(std::string_view s, std::string_view sep) {
  const size_t p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

// Appends segments, merging consecutive ones from the same source.
class Emitter {
 public:
  void tmpl(std::string_view s) { add(s, true); }
  void user(std::string_view s) { add(s, false); }
  RenderedChat take() { return std::move(out_); }

 private:
  void add(std::string_view s, bool from_template) {
    if (s.empty()) return;
    if (!out_.segments.empty() && out_.segments.back().from_template == from_template) {
      out_.segments.back().text.append(s);
    } else {
      out_.segments.push_back(ChatSegment{std::string(s), from_template});
    }
  }
  RenderedChat out_;
};

void append_python_json(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        jinja::append_json_string(it.key(), out);
        out += ": ";
        append_python_json(it.value(), out);
      }
      out.push_back('}');
      break;
    }
    case nlohmann::ordered_json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        append_python_json(e, out);
      }
      out.push_back(']');
      break;
    }
    case nlohmann::ordered_json::value_t::string:
      jinja::append_json_string(v.get_ref<const std::string&>(), out);
      break;
    case nlohmann::ordered_json::value_t::number_float:
      out += jinja::python_float_repr(v.get<double>());
      break;
    default:  // integers, booleans, null: JSON's spelling is Python json.dumps'
      out += v.dump();
      break;
  }
}

bool valid_role(std::string_view r) { return r == "system" || r == "user" || r == "assistant" || r == "tool"; }

core::Expected<void> check(std::span<const ChatMessage> messages, const ChatOptions& options) {
  if (messages.empty()) {
    return core::fail(core::Errc::kInvalidArgument, "chat template: 'messages' is empty");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!valid_role(messages[i].role)) {
      return core::fail(core::Errc::kInvalidArgument, "chat template: messages[" + std::to_string(i) + "].role '" +
                                                          messages[i].role +
                                                          "' is not one of system, user, assistant, tool");
    }
  }
  if (!options.tools.is_null() && !options.tools.is_array()) {
    return core::fail(core::Errc::kInvalidArgument, "chat template: 'tools' must be an array");
  }
  return {};
}

// Plain ChatML (llama.cpp LLM_CHAT_TEMPLATE_CHATML).
RenderedChat render_chatml(std::span<const ChatMessage> messages, const ChatOptions& options) {
  Emitter e;
  for (const ChatMessage& m : messages) {
    e.tmpl("<|im_start|>" + m.role + "\n");
    e.user(m.content);
    e.tmpl("<|im_end|>\n");
  }
  if (options.add_generation_prompt) e.tmpl("<|im_start|>assistant\n");
  return e.take();
}

// Qwen3's template. Client-supplied text (message content, reasoning, tool
// JSON, tool-call names and arguments) goes out as user segments.
RenderedChat render_qwen3(std::span<const ChatMessage> messages, const ChatOptions& options) {
  Emitter e;
  const size_t n = messages.size();
  const bool has_tools = options.tools.is_array() && !options.tools.empty();
  // {%- if tools %} ... system block with the tool signatures
  if (has_tools) {
    e.tmpl("<|im_start|>system\n");
    if (messages[0].role == "system") {
      e.user(messages[0].content);
      e.tmpl("\n\n");
    }
    e.tmpl(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (const auto& tool : options.tools) {
      e.tmpl("\n");
      e.user(to_python_json(tool));
    }
    e.tmpl(
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
  } else if (messages[0].role == "system") {
    e.tmpl("<|im_start|>system\n");
    e.user(messages[0].content);
    e.tmpl("<|im_end|>\n");
  }
  // ns.last_query_index: the last user message that is not a wrapped tool
  // response, scanning from the end while ns.multi_step_tool holds.
  size_t last_query_index = n - 1;
  for (size_t k = n; k-- > 0;) {
    const ChatMessage& m = messages[k];
    const std::string_view c = m.content;
    if (m.role == "user" && !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) {
      last_query_index = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == n;
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      e.tmpl("<|im_start|>" + m.role + "\n");
      e.user(m.content);
      e.tmpl("<|im_end|>\n");
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (m.reasoning_content.has_value()) {
        reasoning = *m.reasoning_content;
      } else if (content.find("</think>") != std::string_view::npos) {
        // content = content.split('</think>')[-1].lstrip('\n')
        // reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        reasoning = lstrip(after_last(rstrip(before_first(m.content, "</think>"), "\n"), "<think>"), "\n");
        content = lstrip(after_last(m.content, "</think>"), "\n");
      }
      if (i > last_query_index && (last || !reasoning.empty())) {
        e.tmpl("<|im_start|>" + m.role + "\n<think>\n");
        e.user(strip(reasoning, "\n"));
        e.tmpl("\n</think>\n\n");
        e.user(lstrip(content, "\n"));
      } else {
        e.tmpl("<|im_start|>" + m.role + "\n");
        e.user(content);
      }
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        const ToolCall& tc = m.tool_calls[j];
        if ((j == 0 && !content.empty()) || j > 0) e.tmpl("\n");
        e.tmpl("<tool_call>\n{\"name\": \"");
        e.user(tc.name);
        e.tmpl("\", \"arguments\": ");
        e.user(tc.arguments);
        e.tmpl("}\n</tool_call>");
      }
      e.tmpl("<|im_end|>\n");
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") e.tmpl("<|im_start|>user");
      e.tmpl("\n<tool_response>\n");
      e.user(m.content);
      e.tmpl("\n</tool_response>");
      if (last || messages[i + 1].role != "tool") e.tmpl("<|im_end|>\n");
    }
  }
  if (options.add_generation_prompt) {
    e.tmpl("<|im_start|>assistant\n");
    if (!options.enable_thinking) e.tmpl("<think>\n\n</think>\n\n");
  }
  return e.take();
}

// Python's str.isspace() code points (what Jinja's `trim` strips):
// \t \n \v \f \r, U+001C..U+001F, space, U+0085, U+00A0, U+1680,
// U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Decodes the UTF-8 character of `len` bytes at `p` (a valid sequence, or
// U+FFFD-like 0xFFFFFFFF for anything else, which is never space).
char32_t decode_at(std::string_view s, size_t p, size_t len) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[p + i]); };
  if (len == 1) return b(0);
  char32_t c = b(0) & (0x7F >> len);
  for (size_t i = 1; i < len; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0xFFFFFFFF;
    c = (c << 6) | (b(i) & 0x3F);
  }
  return c;
}

// Bytes of the UTF-8 sequence led by byte `lead` (1 for a stray byte).
size_t utf8_len(unsigned char lead) {
  if (lead >= 0xF0 && lead < 0xF8) return 4;
  if (lead >= 0xE0) return lead < 0xF0 ? 3 : 1;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Jinja's `trim` filter: Python str.strip() with no argument (Unicode
// whitespace, not only ASCII), over UTF-8 text.
std::string_view py_strip(std::string_view s) {
  while (!s.empty()) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(s[0])), s.size());
    if (!python_space(decode_at(s, 0, len))) break;
    s.remove_prefix(len);
  }
  while (!s.empty()) {
    size_t start = s.size() - 1;  // back up over continuation bytes (at most 3)
    while (start > 0 && s.size() - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const size_t len = s.size() - start;
    if (utf8_len(static_cast<unsigned char>(s[start])) != len || !python_space(decode_at(s, start, len))) break;
    s.remove_suffix(len);
  }
  return s;
}

core::Expected<RenderedChat> qwen35_refuses(std::string message) {
  return core::fail(core::Errc::kInvalidArgument, "chat template (qwen35): " + std::move(message));
}

// One tool call of the Qwen3.5 template:
//   <tool_call>\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function>\n</tool_call>
// VALUE: `args_value | tojson` for an object or array, else `args_value | string`.
core::Expected<void> render_qwen35_call(const ToolCall& tc, size_t msg, size_t j, Emitter& e) {
  e.user(tc.name);
  e.tmpl(">\n");
  if (!tc.arguments.empty()) {  // {%- if tool_call.arguments is defined %}
    const auto args = nlohmann::ordered_json::parse(tc.arguments, nullptr, /*allow_exceptions=*/false);
    if (!args.is_object()) {
      return core::fail(core::Errc::kInvalidArgument,
                        "chat template (qwen35): messages[" + std::to_string(msg) + "].tool_calls[" +
                            std::to_string(j) +
                            "].function.arguments must be a JSON object (the template writes each of its "
                            "members as a <parameter=...> block)");
    }
    // {%- for args_name, args_value in tool_call.arguments|items %}
    for (auto it = args.begin(); it != args.end(); ++it) {
      e.tmpl("<parameter=");
      e.user(it.key());
      e.tmpl(">\n");
      e.user(to_python_str(it.value()));
      e.tmpl("\n</parameter>\n");
    }
  }
  e.tmpl("</function>\n</tool_call>");
  return {};
}

// Qwen3.5's template. Every message's text goes through `trim` (Python
// strip); client-supplied text goes out as user segments.
core::Expected<RenderedChat> render_qwen35(std::span<const ChatMessage> messages, const ChatOptions& options) {
  Emitter e;
  const size_t n = messages.size();
  // {%- if tools and tools is iterable and tools is not mapping %}
  if (options.tools.is_array() && !options.tools.empty()) {
    e.tmpl("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
    for (const auto& tool : options.tools) {
      e.tmpl("\n");
      e.user(to_python_json(tool));
    }
    e.tmpl(
        "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
        "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
        "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple "
        "lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow "
        "the specified format: an inner <function=...></function> block must be nested within "
        "<tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional "
        "reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If "
        "there is no function call available, answer the question like normal with your current knowledge and "
        "do not tell the user about function calls\n</IMPORTANT>");
    if (messages[0].role == "system") {
      const std::string_view content = py_strip(messages[0].content);
      if (!content.empty()) {
        e.tmpl("\n\n");
        e.user(content);
      }
    }
    e.tmpl("<|im_end|>\n");
  } else if (messages[0].role == "system") {
    e.tmpl("<|im_start|>system\n");
    e.user(py_strip(messages[0].content));
    e.tmpl("<|im_end|>\n");
  }
  // ns.last_query_index: the last user message that is not only a wrapped
  // tool response; none is an error (raise_exception).
  std::optional<size_t> last_query_index;
  for (size_t k = n; k-- > 0;) {
    if (messages[k].role != "user") continue;
    const std::string_view c = py_strip(messages[k].content);
    if (!(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) {
      last_query_index = k;
      break;
    }
  }
  if (!last_query_index) {
    return qwen35_refuses(
        "no user query found in 'messages' (the template needs a user message that is not only a "
        "<tool_response>)");
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    std::string_view content = py_strip(m.content);
    if (m.role == "system") {
      if (i != 0) {
        return qwen35_refuses("messages[" + std::to_string(i) +
                              "] is a system message; the template accepts one only as the first message");
      }
    } else if (m.role == "user") {
      e.tmpl("<|im_start|>user\n");
      e.user(content);
      e.tmpl("<|im_end|>\n");
    } else if (m.role == "assistant") {
      std::string_view reasoning;
      if (m.reasoning_content.has_value()) {
        reasoning = *m.reasoning_content;
      } else if (content.find("</think>") != std::string_view::npos) {
        // reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        // content = content.split('</think>')[-1].lstrip('\n')
        reasoning = lstrip(after_last(rstrip(before_first(content, "</think>"), "\n"), "<think>"), "\n");
        content = lstrip(after_last(content, "</think>"), "\n");
      }
      reasoning = py_strip(reasoning);
      if (i > *last_query_index) {
        e.tmpl("<|im_start|>assistant\n<think>\n");
        e.user(reasoning);
        e.tmpl("\n</think>\n\n");
        e.user(content);
      } else {
        e.tmpl("<|im_start|>assistant\n");
        e.user(content);
      }
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        if (j == 0) {
          e.tmpl(py_strip(content).empty() ? "<tool_call>\n<function=" : "\n\n<tool_call>\n<function=");
        } else {
          e.tmpl("\n<tool_call>\n<function=");
        }
        if (auto ok = render_qwen35_call(m.tool_calls[j], i, j, e); !ok) return std::unexpected(ok.error());
      }
      e.tmpl("<|im_end|>\n");
    } else {  // tool (check() allows no other role)
      // {%- if loop.previtem and loop.previtem.role != "tool" %}: the first
      // message has no previtem, so a leading tool message opens no turn.
      if (i > 0 && messages[i - 1].role != "tool") e.tmpl("<|im_start|>user");
      e.tmpl("\n<tool_response>\n");
      e.user(content);
      e.tmpl("\n</tool_response>");
      if (i + 1 == n || messages[i + 1].role != "tool") e.tmpl("<|im_end|>\n");
    }
  }
  if (options.add_generation_prompt) {
    e.tmpl("<|im_start|>assistant\n");
    e.tmpl(options.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n");
  }
  return e.take();
}

}  // namespace

std::string RenderedChat::text() const {
  std::string s;
  for (const ChatSegment& seg : segments) s += seg.text;
  return s;
}

std::string to_python_json(const nlohmann::ordered_json& value) {
  std::string out;
  append_python_json(value, out);
  return out;
}

std::string to_python_str(const nlohmann::ordered_json& value) {
  switch (value.type()) {
    case nlohmann::ordered_json::value_t::string:
      return value.get<std::string>();
    case nlohmann::ordered_json::value_t::boolean:
      return value.get<bool>() ? "True" : "False";
    case nlohmann::ordered_json::value_t::null:
      return "None";
    default:  // numbers, objects, arrays
      return to_python_json(value);
  }
}

namespace {

using OJson = nlohmann::ordered_json;

const char* json_type_name(const OJson& v) {
  switch (v.type()) {
    case OJson::value_t::null:
      return "null";
    case OJson::value_t::boolean:
      return "boolean";
    case OJson::value_t::string:
      return "string";
    case OJson::value_t::array:
      return "array";
    case OJson::value_t::object:
      return "object";
    case OJson::value_t::number_float:
      return "number";
    case OJson::value_t::number_integer:
    case OJson::value_t::number_unsigned:
      return "integer";
    default:
      return "unknown";
  }
}

std::unexpected<ChatMessageError> wrong_type(const std::string& field, const char* expected, const OJson& got) {
  return std::unexpected(ChatMessageError{
      "Invalid type for '" + field + "': expected " + expected + ", but got " + json_type_name(got) + ".", field,
      "invalid_type"});
}

std::unexpected<ChatMessageError> missing(const std::string& field) {
  return std::unexpected(
      ChatMessageError{"Missing required parameter: '" + field + "'.", field, "missing_required_parameter"});
}

std::unexpected<ChatMessageError> invalid(std::string message, const std::string& field) {
  return std::unexpected(ChatMessageError{std::move(message), field, "invalid_value"});
}

// OpenAI message content: a string, null, or an array of content parts of
// which {"type":"text","text":...} is accepted: the texts joined with "\n"
// (none before the first non-empty text), as llama.cpp's server
// (common_chat_msgs_to_json_oaicompat) and vLLM join text parts for a
// template that takes string content.
std::expected<void, ChatMessageError> read_content(const OJson& msg, const std::string& where, std::string& out) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return {};
  if (it->is_string()) {
    out = it->get<std::string>();
    return {};
  }
  if (!it->is_array()) return wrong_type(where + ".content", "a string or an array of content parts", *it);
  for (size_t k = 0; k < it->size(); ++k) {
    const OJson& part = (*it)[k];
    const std::string pw = where + ".content[" + std::to_string(k) + "]";
    if (!part.is_object()) return wrong_type(pw, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return missing(pw + ".type");
    if (*type != "text")
      return invalid("Invalid value for '" + pw + ".type': only \"text\" content parts are supported.", pw + ".type");
    auto text = part.find("text");
    if (text == part.end()) return missing(pw + ".text");
    if (!text->is_string()) return wrong_type(pw + ".text", "a string", *text);
    if (!out.empty()) out += '\n';
    out += text->get<std::string>();
  }
  return {};
}

}  // namespace

std::expected<ChatMessage, ChatMessageError> parse_chat_message(const nlohmann::ordered_json& m, size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "]";
  if (!m.is_object()) return wrong_type(where, "an object", m);
  ChatMessage msg;
  auto role = m.find("role");
  if (role == m.end() || role->is_null()) return missing(where + ".role");
  if (!role->is_string()) return wrong_type(where + ".role", "a string", *role);
  msg.role = role->get<std::string>();
  if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for system
  if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool") {
    return invalid("Invalid value for '" + where + ".role': '" + msg.role +
                       "'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'.",
                   where + ".role");
  }
  if (auto ok = read_content(m, where, msg.content); !ok) return std::unexpected(ok.error());
  if (auto c = m.find("content"); c == m.end() || c->is_null()) msg.content_null = true;
  if (auto rc = m.find("reasoning_content"); rc != m.end() && !rc->is_null()) {
    if (!rc->is_string()) return wrong_type(where + ".reasoning_content", "a string", *rc);
    msg.reasoning_content = rc->get<std::string>();
  }
  if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
    if (!tc->is_array()) return wrong_type(where + ".tool_calls", "an array", *tc);
    for (size_t k = 0; k < tc->size(); ++k) {
      const OJson& call = (*tc)[k];
      const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
      if (!call.is_object()) return wrong_type(cw, "an object", call);
      ToolCall t;
      if (auto id = call.find("id"); id != call.end() && id->is_string()) t.id = id->get<std::string>();
      auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) return missing(cw + ".function");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string()) return missing(cw + ".function.name");
      t.name = name->get<std::string>();
      // A string is kept verbatim; any other JSON value is written the way
      // the template's tojson writes it (the client's key order, ", " and
      // ": " separators), so the prompt is what the model was trained on.
      if (auto args = fn->find("arguments"); args != fn->end() && !args->is_null())
        t.arguments = args->is_string() ? args->get<std::string>() : to_python_json(*args);
      msg.tool_calls.push_back(std::move(t));
    }
  }
  if (auto n = m.find("name"); n != m.end() && !n->is_null() && !n->is_string())
    return wrong_type(where + ".name", "a string", *n);
  if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
    if (!id->is_string()) return wrong_type(where + ".tool_call_id", "a string", *id);
    msg.tool_call_id = id->get<std::string>();
  }
  return msg;
}

core::Expected<std::vector<ChatMessage>> chat_messages_from_json(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) {
    return core::fail(core::Errc::kInvalidArgument, "'messages' must be an array");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    auto msg = parse_chat_message(messages[i], i);
    if (!msg) return core::fail(core::Errc::kInvalidArgument, msg.error().message);
    out.push_back(std::move(*msg));
  }
  return out;
}

std::span<const std::string_view> builtin_template_names() {
  static constexpr std::string_view kNames[] = {"chatml", "qwen3", "qwen35"};
  return kNames;
}

namespace {

// The Jinja view of a conversation (see ChatTemplate::render).
OJson messages_json(std::span<const ChatMessage> messages, bool string_arguments, bool null_content) {
  OJson out = OJson::array();
  for (const ChatMessage& m : messages) {
    OJson j = OJson::object();
    j["role"] = m.role;
    j["content"] = (m.content_null && null_content) ? OJson(nullptr) : OJson(m.content);
    if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
    if (!m.tool_calls.empty()) {
      OJson calls = OJson::array();
      for (const ToolCall& tc : m.tool_calls) {
        OJson args = tc.arguments;
        if (!string_arguments) {
          OJson parsed = OJson::parse(tc.arguments.empty() ? std::string("{}") : tc.arguments, nullptr, false);
          if (parsed.is_object()) args = std::move(parsed);
        }
        OJson call = OJson::object();
        if (!tc.id.empty()) call["id"] = tc.id;
        call["type"] = "function";
        call["function"] = OJson{{"name", tc.name}, {"arguments", std::move(args)}};
        calls.push_back(std::move(call));
      }
      j["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    out.push_back(std::move(j));
  }
  return out;
}

OJson trusted_json(const ChatOptions& options, const std::string& bos, const std::string& eos) {
  return OJson{{"add_generation_prompt", options.add_generation_prompt},
               {"enable_thinking", options.enable_thinking},
               {"bos_token", bos},
               {"eos_token", eos}};
}

// Whether `tmpl` renders a tool call whose arguments are the JSON text
// verbatim, and whether it renders an assistant turn with null content
// (llama.cpp's minja probes its templates' capabilities the same way).
// Returns {string_arguments, null_content}.
std::pair<bool, bool> probe_capabilities(const jinja::Template& tmpl, const std::string& bos, const std::string& eos) {
  static constexpr std::string_view kArgs = R"({"probe_argument": "probe_value"})";
  const auto render = [&](bool content_null) -> std::optional<std::string> {
    std::vector<ChatMessage> conv(2);
    conv[0].role = "user";
    conv[0].content = "probe";
    conv[1].role = "assistant";
    conv[1].content_null = content_null;
    conv[1].tool_calls.push_back(ToolCall{"call_probe", "probe_function", std::string(kArgs)});
    const OJson data{{"messages", messages_json(conv, true, true)}};
    auto out = tmpl.render(data, trusted_json(ChatOptions{.add_generation_prompt = false}, bos, eos));
    if (!out) return std::nullopt;
    return std::move(out->text);
  };
  const auto with_empty = render(false), with_null = render(true);
  const auto shows_args = [&](const std::optional<std::string>& r) { return r && r->find(kArgs) != std::string::npos; };
  return {shows_args(with_empty) || shows_args(with_null), with_null.has_value()};
}

}  // namespace

core::Expected<ChatTemplate> ChatTemplate::load(std::string_view gguf_source, const ChatTemplateOptions& options,
                                                std::string bos_token, std::string eos_token) {
  const std::string_view source = options.override_template.empty() ? gguf_source : options.override_template;
  const auto names = builtin_template_names();
  if (std::find(names.begin(), names.end(), source) != names.end()) {
    ChatTemplate t;
    t.family_ = source == "qwen3" ? Family::kQwen3 : source == "qwen35" ? Family::kQwen35 : Family::kChatML;
    return t;
  }
  if (!options.jinja || source.empty()) return from_text(source);
  auto parsed = jinja::Template::parse(source);
  if (!parsed) {
    return core::fail(parsed.error().code,
                      "chat template " +
                          std::string(options.override_template.empty() ? "of the GGUF (tokenizer.chat_template)"
                                                                        : "given with --chat-template(-file)") +
                          " cannot be rendered: " + parsed.error().message +
                          " (use --chat-template chatml, another --chat-template-file, or --no-jinja)");
  }
  ChatTemplate t = from_text(source);
  t.jinja_ = std::make_shared<const jinja::Template>(std::move(*parsed));
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  std::tie(t.string_arguments_, t.null_content_) = probe_capabilities(*t.jinja_, t.bos_token_, t.eos_token_);
  return t;
}

std::string ChatTemplate::describe() const {
  return std::string(jinja_ ? "jinja (family " : "built-in ") + std::string(family_name()) + (jinja_ ? ")" : "");
}

core::Expected<RenderedChat> ChatTemplate::render_jinja(std::span<const ChatMessage> messages,
                                                        const ChatOptions& options) const {
  OJson data{{"messages", messages_json(messages, string_arguments_, null_content_)}};
  if (!options.tools.is_null()) data["tools"] = options.tools;
  auto out = jinja_->render(data, trusted_json(options, bos_token_, eos_token_));
  if (!out) return std::unexpected(out.error());
  // Runs of equal provenance become segments: input bytes are user text.
  RenderedChat r;
  const std::string& text = out->text;
  const std::string& mask = out->input_mask;
  for (size_t b = 0; b < text.size();) {
    size_t e = b;
    while (e < text.size() && mask[e] == mask[b]) ++e;
    r.segments.push_back(ChatSegment{text.substr(b, e - b), mask[b] == '\0'});
    b = e;
  }
  return r;
}

ChatTemplate ChatTemplate::from_text(std::string_view jinja_source) {
  ChatTemplate t;
  t.source_ = std::string(jinja_source);
  const auto has = [&](std::string_view marker) { return jinja_source.find(marker) != std::string_view::npos; };
  // Qwen3: ChatML markers plus its <think> handling. Qwen3.5: the same plus
  // tool calls written as <function=...> / <parameter=...> XML.
  const bool chatml = has("<|im_start|>");
  const bool think = has("<think>") && has("reasoning_content");
  const bool xml_calls = has("<function=") && has("<parameter=");
  if (chatml && think) {
    t.family_ = xml_calls ? Family::kQwen35 : Family::kQwen3;
  } else {
    t.family_ = Family::kChatML;
  }
  return t;
}

std::string_view ChatTemplate::family_name() const {
  switch (family_) {
    case Family::kQwen3:
      return "qwen3";
    case Family::kQwen35:
      return "qwen35";
    case Family::kChatML:
      break;
  }
  return "chatml";
}

ToolCallSyntax ChatTemplate::tool_call_syntax() const {
  return family_ == Family::kQwen35 ? ToolCallSyntax::kXml : ToolCallSyntax::kJson;
}

bool ChatTemplate::prompt_opens_reasoning(const ChatOptions& options) const {
  return family_ == Family::kQwen35 && options.add_generation_prompt && options.enable_thinking &&
         !options.continue_final_message;
}

core::Expected<RenderedChat> ChatTemplate::render(std::span<const ChatMessage> messages,
                                                  const ChatOptions& options) const {
  if (options.continue_final_message) {
    // Rendered as a closed conversation with a marker after the last
    // message's content, then cut at the marker: whatever the template does
    // around that content (a <think> block, stripping reasoning out of it)
    // stays, and its end-of-turn goes. The marker is plain ASCII (templates
    // `trim` content, and Python's strip also removes \x1c-\x1f); being last,
    // it keeps the content's own trailing whitespace: the prompt ends with
    // exactly the client's text.
    static constexpr std::string_view kMark = "<bonsai-continue-final-message-7f3a91>";
    if (messages.empty() || messages.back().role != "assistant" || !messages.back().tool_calls.empty()) {
      return core::fail(core::Errc::kInvalidArgument,
                        "continue_final_message: the last message must be an assistant message without tool calls "
                        "(the text to continue)");
    }
    std::vector<ChatMessage> marked(messages.begin(), messages.end());
    marked.back().content += kMark;
    marked.back().content_null = false;
    ChatOptions closed = options;
    closed.continue_final_message = false;
    closed.add_generation_prompt = false;
    auto r = render(marked, closed);
    if (!r) return r;
    for (size_t i = r->segments.size(); i-- > 0;) {
      std::string& text = r->segments[i].text;
      const size_t at = text.rfind(kMark);
      if (at == std::string::npos) continue;
      text.resize(at);
      r->segments.resize(text.empty() ? i : i + 1);
      return r;
    }
    return core::fail(core::Errc::kInvalidArgument,
                      "continue_final_message: the chat template does not render the content of message " +
                          std::to_string(messages.size() - 1) +
                          " (the final assistant message), so it cannot be "
                          "continued");
  }
  if (auto ok = check(messages, options); !ok) return std::unexpected(ok.error());
  if (jinja_) return render_jinja(messages, options);
  switch (family_) {
    case Family::kQwen3:
      return render_qwen3(messages, options);
    case Family::kQwen35:
      return render_qwen35(messages, options);
    case Family::kChatML:
      break;
  }
  return render_chatml(messages, options);
}

}  // namespace bonsai::tokenizer
