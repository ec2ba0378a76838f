// Streaming split of Qwen3 / Qwen3.5 output into reasoning, content and tool calls. See chat_output.h.
#include "engine/chat_output.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace bonsai::engine {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Length of the longest suffix of `s` that is a proper prefix of `tag`
// (text that may still turn into the tag once more arrives).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  const size_t max = std::min(s.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

// Reads "NAME>" after an XML tag opener from the front of `s`: NAME
// non-empty, on one line, surrounding spaces dropped. Empty when not so.
std::string_view take_tag_name(std::string_view& s) {
  const size_t gt = s.find('>');
  if (gt == std::string_view::npos) return {};
  const std::string_view name = trim(s.substr(0, gt));
  if (name.empty() || name.find('\n') != std::string_view::npos) return {};
  s.remove_prefix(gt + 1);
  return name;
}

// The schema of parameter `key` of tool `name` in an OpenAI `tools` array
// (and in `params` the tool's `parameters`, what its $refs point into);
// nullptr when the tool or the parameter is not declared.
const nlohmann::ordered_json* parameter_schema(const nlohmann::ordered_json* tools, std::string_view name,
                                               std::string_view key, const nlohmann::ordered_json*& params_out) {
  if (tools == nullptr || !tools->is_array()) return nullptr;
  for (const auto& tool : *tools) {
    if (!tool.is_object()) continue;
    const auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) continue;
    const auto n = fn->find("name");
    if (n == fn->end() || !n->is_string() || n->get_ref<const std::string&>() != name) continue;
    const auto params = fn->find("parameters");
    if (params == fn->end() || !params->is_object()) return nullptr;
    const auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return nullptr;
    params_out = &*params;
    const auto p = props->find(std::string(key));
    return p == props->end() ? nullptr : &*p;
  }
  return nullptr;
}

}  // namespace

bool schema_resolves_to_string(const nlohmann::ordered_json& schema_in, const nlohmann::ordered_json* root) {
  const nlohmann::ordered_json* schema_ptr = &schema_in;
  for (int hops = 0; root != nullptr && hops < 16 && schema_ptr->is_object(); ++hops) {
    const auto ref = schema_ptr->find("$ref");
    if (ref == schema_ptr->end() || !ref->is_string()) break;
    const std::string& r = ref->get_ref<const std::string&>();
    if (!r.starts_with("#/")) return false;  // another document, or the whole (object) schema
    // A JSON pointer that is malformed or points nowhere: not a string.
    try {
      const nlohmann::ordered_json::json_pointer ptr(r.substr(1));
      if (!root->contains(ptr)) return false;
      schema_ptr = &root->at(ptr);
    } catch (const nlohmann::json::exception&) {
      return false;
    }
  }
  const nlohmann::ordered_json& schema = *schema_ptr;
  if (!schema.is_object()) return false;
  const auto t = schema.find("type");
  if (t == schema.end()) return false;
  if (t->is_string()) return *t == "string";
  if (t->is_array()) {
    for (const auto& e : *t)
      if (e == "string") return true;
  }
  return false;
}

ChatOutputParser::Options chat_output_options(const tokenizer::ChatTemplate& tmpl, const tokenizer::ChatOptions& chat,
                                              bool parse_reasoning, bool parse_tool_calls) {
  ChatOutputParser::Options o;
  o.parse_reasoning = parse_reasoning;
  o.parse_tool_calls = parse_tool_calls;
  o.starts_in_reasoning = tmpl.prompt_opens_reasoning(chat);
  o.tool_call_syntax = tmpl.tool_call_syntax();
  if (chat.tools.is_array()) o.tools = std::make_shared<const nlohmann::ordered_json>(chat.tools);
  return o;
}

ChatOutputParser::ChatOutputParser(Options options) : opt_(options) {
  if (!opt_.starts_in_reasoning) return;
  if (opt_.parse_reasoning) {
    mode_ = Mode::kReasoning;
    skip_ws_ = true;
  } else {
    // Raw output: the "<think>\n" the prompt ended in opens the content, so
    // the "</think>" the model writes is balanced (llama-server's
    // --reasoning-format none).
    buf_ = std::string(kThinkOpen) + "\n";
  }
}

ChatOutputDelta ChatOutputParser::feed(std::string_view text) {
  ChatOutputDelta out;
  buf_.append(text);
  drain(out, /*final=*/false);
  return out;
}

ChatOutputDelta ChatOutputParser::finish() {
  ChatOutputDelta out;
  if (opt_.only_tool_calls && mode_ == Mode::kContent && !buf_.empty()) {
    // buf_ holds the undecided tail (a prefix of a tag, maybe after
    // whitespace). With calls only, the one tag that can start here is the
    // next call's.
    std::string_view tail = buf_;
    while (!tail.empty() && is_ws(tail.front())) tail.remove_prefix(1);
    if (!tail.empty() && tail.size() < kCallOpen.size() && kCallOpen.substr(0, tail.size()) == tail) {
      buf_.clear();
      cut_call_ = true;
    }
  }
  drain(out, /*final=*/true);
  if (mode_ == Mode::kToolCall) {
    // Never closed: a cut call is no content (and no call).
    cut_call_ = true;
    call_text_.clear();
    mode_ = Mode::kContent;
  }
  buf_.clear();
  return out;
}

void ChatOutputParser::emit_text(ChatOutputDelta& out, std::string_view text) {
  if (text.empty()) return;
  (mode_ == Mode::kReasoning ? out.reasoning : out.content).append(text);
}

bool ChatOutputParser::parse_json_call(ParsedToolCall& call) const {
  const std::string_view body = trim(call_text_);
  const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  bool ok = j.is_object() && j.contains("name") && j["name"].is_string() && !j["name"].get<std::string>().empty();
  if (ok) {
    call.name = j["name"].get<std::string>();
    auto it = j.find("arguments");
    if (it == j.end() || it->is_null()) {
      call.arguments = "{}";
    } else if (it->is_string()) {
      // Arguments given as a JSON string: its content must itself be JSON.
      const auto inner = nlohmann::json::parse(it->get<std::string>(), nullptr, false);
      if (inner.is_discarded())
        ok = false;
      else
        call.arguments = inner.dump();
    } else {
      call.arguments = it->dump();
    }
  }
  return ok;
}

bool ChatOutputParser::parse_xml_call(ParsedToolCall& call) const {
  std::string_view s = trim(call_text_);
  if (!s.starts_with(kFunctionOpen)) return false;
  s.remove_prefix(kFunctionOpen.size());
  const std::string_view name = take_tag_name(s);
  if (name.empty()) return false;
  auto args = nlohmann::ordered_json::object();
  while (true) {
    s = trim(s);
    if (s.starts_with(kFunctionClose)) {
      if (!trim(s.substr(kFunctionClose.size())).empty()) return false;  // one function per block
      break;
    }
    if (!s.starts_with(kParamOpen)) return false;
    s.remove_prefix(kParamOpen.size());
    const std::string_view key = take_tag_name(s);
    if (key.empty()) return false;
    const size_t end = s.find(kParamClose);
    if (end == std::string_view::npos) return false;
    std::string_view value = s.substr(0, end);
    s.remove_prefix(end + kParamClose.size());
    // The template's own newlines around the value.
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const nlohmann::ordered_json* params = nullptr;
    const nlohmann::ordered_json* schema = parameter_schema(opt_.tools.get(), name, key, params);
    nlohmann::ordered_json typed = nlohmann::ordered_json::value_t::discarded;
    if (schema != nullptr && !schema_resolves_to_string(*schema, params))
      typed = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (typed.is_discarded()) {
      args[std::string(key)] = std::string(value);
    } else {
      args[std::string(key)] = std::move(typed);
    }
  }
  call.name = std::string(name);
  // Replace (not throw on) bytes that are not UTF-8: the model wrote them.
  call.arguments = args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return true;
}

bool ChatOutputParser::declared(std::string_view name) const {
  if (opt_.tools == nullptr || !opt_.tools->is_array()) return true;
  for (const auto& tool : *opt_.tools) {
    if (!tool.is_object()) continue;
    const auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) continue;
    const auto n = fn->find("name");
    if (n != fn->end() && n->is_string() && n->get_ref<const std::string&>() == name) return true;
  }
  return false;
}

void ChatOutputParser::close_tool_call(ChatOutputDelta& out) {
  ParsedToolCall call;
  const bool ok =
      (opt_.tool_call_syntax == tokenizer::ToolCallSyntax::kXml ? parse_xml_call(call) : parse_json_call(call)) &&
      declared(call.name);
  if (ok) {
    calls_.push_back(call);
    out.tool_calls.push_back(std::move(call));
  } else {
    out.content += std::string(kCallOpen) + call_text_ + std::string(kCallClose);
  }
  call_text_.clear();
}

void ChatOutputParser::drain(ChatOutputDelta& out, bool final) {
  while (true) {
    if (skip_ws_) {
      size_t n = 0;
      while (n < buf_.size() && is_ws(buf_[n])) ++n;
      buf_.erase(0, n);
      if (buf_.empty()) {
        if (final) skip_ws_ = false;
        return;
      }
      skip_ws_ = false;
    }
    const std::string_view b = buf_;
    if (mode_ == Mode::kContent) {
      size_t at = std::string_view::npos;
      std::string_view tag;
      if (opt_.parse_reasoning) {
        const size_t i = b.find(kThinkOpen);
        if (i < at) at = i, tag = kThinkOpen;
      }
      if (opt_.parse_tool_calls) {
        const size_t i = b.find(kCallOpen);
        if (i < at) at = i, tag = kCallOpen;
      }
      if (at != std::string_view::npos) {
        emit_text(out, b.substr(0, at));
        buf_.erase(0, at + tag.size());
        mode_ = tag == kThinkOpen ? Mode::kReasoning : Mode::kToolCall;
        skip_ws_ = mode_ == Mode::kReasoning;
        continue;
      }
      size_t hold = 0;
      if (!final) {
        if (opt_.parse_reasoning) hold = std::max(hold, partial_tag_suffix(b, kThinkOpen));
        if (opt_.parse_tool_calls) hold = std::max(hold, partial_tag_suffix(b, kCallOpen));
      }
      emit_text(out, b.substr(0, b.size() - hold));
      buf_.erase(0, b.size() - hold);
      return;
    }
    if (mode_ == Mode::kReasoning) {
      const size_t i = b.find(kThinkClose);
      if (i != std::string_view::npos) {
        // The whitespace before </think> is not reasoning. (Earlier chunks
        // held their trailing whitespace back, so all of it is still here.)
        std::string_view r = b.substr(0, i);
        while (!r.empty() && is_ws(r.back())) r.remove_suffix(1);
        emit_text(out, r);
        buf_.erase(0, i + kThinkClose.size());
        mode_ = Mode::kContent;
        skip_ws_ = true;
        continue;
      }
      size_t hold = 0;
      if (!final) {
        hold = partial_tag_suffix(b, kThinkClose);
        // Trailing whitespace may be the "\n" before </think>: hold it too.
        size_t end = b.size() - hold;
        while (end > 0 && is_ws(b[end - 1])) --end;
        hold = b.size() - end;
      }
      emit_text(out, b.substr(0, b.size() - hold));
      buf_.erase(0, b.size() - hold);
      return;
    }
    // Tool call body: collected until the closing tag.
    const size_t i = b.find(kCallClose);
    if (i != std::string_view::npos) {
      call_text_.append(b.substr(0, i));
      buf_.erase(0, i + kCallClose.size());
      mode_ = Mode::kContent;
      close_tool_call(out);
      skip_ws_ = true;
      continue;
    }
    const size_t hold = final ? 0 : partial_tag_suffix(b, kCallClose);
    call_text_.append(b.substr(0, b.size() - hold));
    buf_.erase(0, b.size() - hold);
    return;
  }
}

}  // namespace bonsai::engine
