// Structured outputs: the request fields that constrain what the model may
// write, turned into one compiled grammar (structured::Grammar) for
// SamplingParams::grammar.
//
// Fields (both routes unless noted):
//   response_format  OpenAI: {"type": "json_object"} (any JSON object) or
//                    {"type": "json_schema", "json_schema": {"name", "schema",
//                    "strict"}} (an instance of `schema`; no schema: any JSON
//                    object). "text": unconstrained. `strict` is accepted and
//                    changes nothing: the schema is always enforced.
//   grammar          llama.cpp's GBNF text (llama-server's `grammar` field).
//   json_schema      llama.cpp's field: a JSON Schema object (as
//                    response_format's schema).
//   tool_choice      chat, with `tools`: "required" (the answer is one or more
//                    calls of the given tools) or {"type": "function",
//                    "function": {"name"}} (calls of that tool), written in
//                    Qwen3's format, one block per call:
//                      <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
//                    ARGS valid against the tool's `parameters` (no
//                    parameters: {}); blocks separated by "\n".
//                    parallel_tool_calls false: exactly one block (default
//                    true: one to kMaxParallelToolCalls). For a model whose
//                    template writes Qwen3.5's XML calls (GrammarForm), a
//                    block is instead
//                      <tool_call>\n<function=NAME>\n PARAMS </function>\n</tool_call>
//                    PARAMS: each declared parameter in the schema's order,
//                    "<parameter=KEY>\nVALUE\n</parameter>\n", required ones
//                    always, the others optionally; VALUE any text without
//                    "</parameter>" for a parameter whose schema resolves to
//                    a string (engine::schema_resolves_to_string), else JSON
//                    valid against its schema. "auto" (the default with tools) with
//                    a content constraint: either tool calls or the
//                    constrained content; "auto" alone and "none": no grammar.
// A model whose prompt opened <think> (GrammarForm::opens_reasoning) may
// reason first: any text without "</think>", then "</think>\n\n", then
// what the fields above constrain.
// At most one of response_format (json), grammar and json_schema may be given
// (400 naming the second). A forced tool call ignores the content constraint
// (the answer is a call, not content).
//
// Errors are 400 invalid_request_error whose `param` names the field
// ("response_format.json_schema.schema", "json_schema", "grammar",
// "tools[1].function.parameters") and whose message carries the converter's
// or compiler's reason (an unsupported keyword is named with its JSON
// pointer, a GBNF error with line:col). Never aborts on input.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/openai.h"            // ApiError, Endpoint
#include "tokenizer/chat_template.h"  // ToolCallSyntax

namespace bonsai::structured {
class Grammar;  // structured/grammar.h
}

namespace bonsai::server {

// Most calls in one answer with parallel_tool_calls (a bound, so a model that
// keeps calling still ends; llama.cpp leaves it unbounded).
inline constexpr int kMaxParallelToolCalls = 8;

// What constrains one request's answer.
struct OutputGrammar {
  std::shared_ptr<const structured::Grammar> grammar;  // nullptr: unconstrained
  std::string gbnf;                                    // the grammar's text (empty when none)
  std::string source;             // the field it came from ("response_format", "grammar", "json_schema", "tool_choice")
  bool forced_tool_call = false;  // tool_choice required / named: the answer is tool calls
};

// How the model at hand writes its answer, from its chat template
// (tokenizer::ChatTemplate::tool_call_syntax / prompt_opens_reasoning). The
// default is Qwen3's: JSON tool calls, no open <think>.
struct GrammarForm {
  tokenizer::ToolCallSyntax tool_call_syntax = tokenizer::ToolCallSyntax::kJson;
  bool opens_reasoning = false;  // the prompt ends inside <think>: reasoning comes first
};

// Reads the fields above from `body` (the request, parsed in document order
// so the schema's property order is the answer's). Shapes are assumed checked
// already (parse_completion_request's checks run first); what is checked here
// is what the grammar needs. Endpoint kCompletion ignores tools/tool_choice.
std::optional<ApiError> build_output_grammar(const nlohmann::ordered_json& body, Endpoint endpoint, OutputGrammar& out,
                                             const GrammarForm& form = {});

// The GBNF of tool calls for `tools` (OpenAI's array, checked) in `syntax`
// (Qwen3's JSON or Qwen3.5's XML blocks, as above), restricted to the
// function named `only` when set; `parallel`: one to kMaxParallelToolCalls
// calls, else exactly one. Errors name the tool's parameters field.
std::optional<ApiError> tool_call_gbnf(const nlohmann::ordered_json& tools, const std::optional<std::string>& only,
                                       bool parallel, std::string& out,
                                       tokenizer::ToolCallSyntax syntax = tokenizer::ToolCallSyntax::kJson);

// GBNF rules `name`-0 ... `name`-(n-1), n = pattern.size(), where `name`-0
// matches any text (possibly empty) that does not contain `pattern`: one
// deterministic rule per matched prefix of it. `pattern` must be non-empty
// and its first character must not occur again in it ("</parameter>",
// "</think>").
std::string text_without_gbnf(std::string_view pattern, const std::string& name);

// Renames every rule of GBNF text `gbnf` to `prefix` + name (references too;
// string literals, character classes and comments untouched), so two
// grammars can live in one text. `root` becomes prefix + "root".
std::string prefix_gbnf_rules(const std::string& gbnf, const std::string& prefix);

}  // namespace bonsai::server
