// Structured outputs: request fields -> one compiled grammar. See structured_output.h.
#include "server/structured_output.h"

#include <algorithm>
#include <cassert>
#include <vector>

#include "engine/chat_output.h"      // schema_resolves_to_string
#include "structured/grammar.h"      // Grammar::parse, Matcher (the start-state check)
#include "structured/json_schema.h"  // json_schema_doc_to_gbnf, json_object_gbnf
#include "structured/token_mask.h"   // GrammarState::create (start-state check)

namespace bonsai::server {

using nlohmann::ordered_json;

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// A GBNF string literal for `s` (raw UTF-8; quote, backslash and control bytes escaped).
std::string gbnf_literal(std::string_view s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// Converts a JSON Schema to GBNF; an error names `param`.
std::optional<ApiError> schema_gbnf(const ordered_json& schema, const std::string& param, std::string& out) {
  auto g = structured::json_schema_doc_to_gbnf(schema);
  if (!g) return bad_request("Invalid schema for '" + param + "': " + g.error().message, param, "invalid_value");
  out = std::move(*g);
  return std::nullopt;
}

// The content constraint (response_format json / grammar / json_schema) or none.
std::optional<ApiError> content_gbnf(const ordered_json& body, std::string& gbnf, std::string& source) {
  std::vector<std::string> given;
  if (auto rf = body.find("response_format"); rf != body.end() && rf->is_object()) {
    const auto type = rf->value("type", std::string());
    if (type == "json_object") {
      gbnf = structured::json_object_gbnf();
      given.push_back("response_format");
    } else if (type == "json_schema") {
      const ordered_json& js = (*rf)["json_schema"];
      if (auto s = js.find("schema"); s != js.end() && s->is_object()) {
        if (auto e = schema_gbnf(*s, "response_format.json_schema.schema", gbnf)) return e;
      } else {
        gbnf = structured::json_object_gbnf();  // no schema: any JSON object
      }
      given.push_back("response_format");
    }
  }
  if (auto g = body.find("grammar"); g != body.end() && !g->is_null()) {
    if (!g->is_string())
      return bad_request("Invalid type for 'grammar': expected a string (GBNF).", "grammar", "invalid_type");
    if (!g->get_ref<const std::string&>().empty()) {
      if (given.empty()) gbnf = g->get<std::string>();
      given.push_back("grammar");
    }
  }
  if (auto s = body.find("json_schema"); s != body.end() && !s->is_null()) {
    if (!s->is_object())
      return bad_request("Invalid type for 'json_schema': expected an object (a JSON Schema).", "json_schema",
                         "invalid_type");
    if (given.empty()) {
      if (auto e = schema_gbnf(*s, "json_schema", gbnf)) return e;
    }
    given.push_back("json_schema");
  }
  if (given.size() > 1)
    return bad_request("'" + given[0] + "' and '" + given[1] +
                           "' both constrain the output; give at most one of response_format (json_object / "
                           "json_schema), grammar and json_schema.",
                       given[1], "invalid_value");
  if (!given.empty()) source = given[0];
  return std::nullopt;
}

}  // namespace

std::string prefix_gbnf_rules(const std::string& gbnf, const std::string& prefix) {
  std::string out;
  out.reserve(gbnf.size() + 64);
  size_t i = 0;
  const size_t n = gbnf.size();
  while (i < n) {
    const char c = gbnf[i];
    if (c == '"' || c == '[') {  // literal or class: copied with its escapes
      const char close = c == '"' ? '"' : ']';
      out += c;
      ++i;
      while (i < n && gbnf[i] != close) {
        if (gbnf[i] == '\\' && i + 1 < n) out += gbnf[i++];
        out += gbnf[i++];
      }
      if (i < n) out += gbnf[i++];
    } else if (c == '#') {  // comment to end of line
      while (i < n && gbnf[i] != '\n') out += gbnf[i++];
    } else if (c == '{') {  // repetition counts
      while (i < n && gbnf[i] != '}') out += gbnf[i++];
    } else if (is_name_char(c)) {
      size_t j = i;
      while (j < n && is_name_char(gbnf[j])) ++j;
      out += prefix;
      out.append(gbnf, i, j - i);
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::string text_without_gbnf(std::string_view pattern, const std::string& name) {
  assert(!pattern.empty() && pattern.find(pattern[0], 1) == std::string_view::npos);
  // State i: the text so far ends in pattern[0, i). The pattern's first
  // character always leads to state 1; pattern[i] to state i + 1 (never to
  // the full match); anything else back to state 0. Any state may end.
  const auto cls = [](char c) {
    return c == ']' || c == '\\' || c == '^' || c == '-' ? std::string("\\") + c : std::string(1, c);
  };
  const std::string first = std::string(1, pattern[0]);
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    out += name + "-" + std::to_string(i) + " ::= ( ";
    if (i == 0) {
      out += "[^" + cls(pattern[0]) + "] " + name + "-0 | " + gbnf_literal(first) + " " + name + "-1";
    } else {
      out += "[^" + cls(pattern[0]) + cls(pattern[i]) + "] " + name + "-0 | " + gbnf_literal(first) + " " + name + "-1";
      if (i + 1 < pattern.size())
        out += " | " + gbnf_literal(std::string(1, pattern[i])) + " " + name + "-" + std::to_string(i + 1);
    }
    out += " )?\n";
  }
  return out;
}

namespace {

// Qwen3.5's XML block body for one tool (rules prefixed `prefix`): its
// declared parameters in order, required ones always, others optional.
std::optional<ApiError> xml_call_gbnf(const ordered_json& fn, size_t i, const std::string& prefix, std::string& call,
                                      std::string& rules) {
  const std::string name = fn["name"].get<std::string>();
  call = gbnf_literal(name + ">\n");
  const auto params = fn.find("parameters");
  if (params == fn.end() || !params->is_object()) return std::nullopt;
  const auto props = params->find("properties");
  if (props == params->end() || !props->is_object()) return std::nullopt;
  std::vector<std::string> required;
  if (auto r = params->find("required"); r != params->end() && r->is_array())
    for (const auto& k : *r)
      if (k.is_string()) required.push_back(k.get<std::string>());
  size_t j = 0;
  for (auto it = props->begin(); it != props->end(); ++it, ++j) {
    const std::string rule = prefix + "p" + std::to_string(j);
    std::string value;
    if (engine::schema_resolves_to_string(*it, &*params)) {
      value = "xml-text-0";
    } else {
      // The property's schema as a document of its own, with the
      // definitions its $refs may point to.
      ordered_json doc = it->is_object() ? *it : ordered_json::object();
      for (const char* defs : {"$defs", "definitions"})
        if (auto d = params->find(defs); d != params->end() && !doc.contains(defs)) doc[defs] = *d;
      std::string g;
      const std::string field = "tools[" + std::to_string(i) + "].function.parameters.properties." + it.key();
      if (auto e = schema_gbnf(doc, field, g)) return e;
      rules += prefix_gbnf_rules(g, rule + "-");
      value = rule + "-root";
    }
    rules += rule + " ::= " + gbnf_literal("<parameter=" + it.key() + ">\n") + " " + value + " " +
             gbnf_literal("\n</parameter>\n") + "\n";
    const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
    call += " " + rule + (req ? "" : "?");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> tool_call_gbnf(const ordered_json& tools, const std::optional<std::string>& only, bool parallel,
                                       std::string& out, tokenizer::ToolCallSyntax syntax) {
  const std::string repeat =
      parallel ? " ( \"\\n\" tool-call ){0," + std::to_string(kMaxParallelToolCalls - 1) + "}" : "";
  if (syntax == tokenizer::ToolCallSyntax::kXml) {
    std::string alts, rules;
    for (size_t i = 0; i < tools.size(); ++i) {
      const ordered_json& fn = tools[i]["function"];
      if (only && fn["name"].get<std::string>() != *only) continue;
      std::string call;
      if (auto e = xml_call_gbnf(fn, i, "t" + std::to_string(i) + "-", call, rules)) return e;
      alts += std::string(alts.empty() ? "" : " | ") + "( " + call + " )";
    }
    if (alts.empty()) return bad_request("No tool matches 'tool_choice'.", "tool_choice", "invalid_value");
    out = "root ::= tool-call" + repeat + "\n" + "tool-call ::= " + gbnf_literal("<tool_call>\n<function=") + " call " +
          gbnf_literal("</function>\n</tool_call>") + "\n" + "call ::= " + alts + "\n" + rules +
          text_without_gbnf("</parameter>", "xml-text");
    return std::nullopt;
  }
  // One alternative per tool: the call's fixed text as Qwen3's template writes
  // it, around the arguments' grammar (the tool's own rules, prefixed "tK-").
  std::string alts, rules;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (only && name != *only) continue;
    ordered_json params = ordered_json{{"type", "object"}, {"properties", ordered_json::object()}};
    if (auto p = fn.find("parameters"); p != fn.end() && p->is_object()) params = *p;
    std::string args;
    if (auto e = schema_gbnf(params, "tools[" + std::to_string(i) + "].function.parameters", args)) return e;
    const std::string prefix = "t" + std::to_string(i) + "-";
    alts += std::string(alts.empty() ? "" : " | ") + gbnf_literal("{\"name\": \"" + name + "\", \"arguments\": ") +
            " " + prefix + "root " + gbnf_literal("}");
    rules += prefix_gbnf_rules(args, prefix);
  }
  if (alts.empty()) return bad_request("No tool matches 'tool_choice'.", "tool_choice", "invalid_value");
  out = std::string("root ::= tool-call") + repeat + "\n" + "tool-call ::= " + gbnf_literal("<tool_call>\n") +
        " call " + gbnf_literal("\n</tool_call>") + "\n" + "call ::= " + alts + "\n" + rules;
  return std::nullopt;
}

std::optional<ApiError> build_output_grammar(const ordered_json& body, Endpoint endpoint, OutputGrammar& out,
                                             const GrammarForm& form) {
  out = OutputGrammar{};
  std::string content, source;
  if (auto e = content_gbnf(body, content, source)) return e;

  // Tool calls (chat only): tool_choice "required" / named forces them; "auto"
  // (the default with tools) lets a content constraint be an alternative to them.
  std::string tools_gbnf;
  bool forced = false;
  const auto tools = body.find("tools");
  const bool have_tools = endpoint == Endpoint::kChat && tools != body.end() && tools->is_array() && !tools->empty();
  if (have_tools) {
    std::string choice = "auto";
    std::optional<std::string> only;
    if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
      if (c->is_string()) {
        choice = c->get<std::string>();
      } else if (c->is_object()) {
        choice = "function";
        only = (*c)["function"]["name"].get<std::string>();
      }
    }
    bool parallel = true;
    if (auto p = body.find("parallel_tool_calls"); p != body.end() && p->is_boolean()) parallel = p->get<bool>();
    forced = choice == "required" || choice == "function";
    if (forced || (choice == "auto" && !content.empty())) {
      if (auto e = tool_call_gbnf(*tools, only, parallel, tools_gbnf, form.tool_call_syntax)) return e;
    }
  }

  std::string gbnf;
  if (forced) {
    gbnf = tools_gbnf;
    source = "tool_choice";
  } else if (!tools_gbnf.empty()) {  // auto + content constraint: either one
    gbnf = "root ::= tools-root | content-root\n" + prefix_gbnf_rules(tools_gbnf, "tools-") +
           prefix_gbnf_rules(content, "content-");
  } else {
    gbnf = std::move(content);
  }
  if (gbnf.empty()) return std::nullopt;
  if (form.opens_reasoning) {
    gbnf = "root ::= think-0 " + gbnf_literal("</think>\n\n") + " answer-root\n" +
           text_without_gbnf("</think>", "think") + prefix_gbnf_rules(gbnf, "answer-");
  }
  auto g = structured::Grammar::parse(gbnf);
  const std::string param = source == "response_format" ? "response_format.json_schema.schema" : source;
  if (!g) return bad_request("Invalid grammar for '" + source + "': " + g.error().message, param, "invalid_value");
  // The matcher's start state (what the first token is checked against) must
  // fit its parse-stack limits; refused here, it is the request's 400 rather
  // than an engine failure once the job runs.
  if (auto st = structured::Matcher(*g).initial(); !st) {
    return bad_request("Invalid grammar for '" + source + "': " + st.error().message +
                           "; too many alternatives can start at once (write large enums as JSON Schema 'enum', "
                           "which is matched as a prefix tree, or factor common prefixes)",
                       param, "invalid_value");
  }
  out.grammar = std::move(*g);
  out.gbnf = std::move(gbnf);
  out.source = std::move(source);
  out.forced_tool_call = forced;
  return std::nullopt;
}

}  // namespace bonsai::server
