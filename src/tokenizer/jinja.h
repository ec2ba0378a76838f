// A Jinja-subset interpreter for chat templates (the `tokenizer.chat_template`
// string of a GGUF, `chat_template` of a Hugging Face tokenizer_config.json).
//
// Semantics follow Jinja2 as Hugging Face transformers configures it for chat
// templates (https://jinja.palletsprojects.com/en/stable/templates/ and
// transformers' apply_chat_template: trim_blocks, lstrip_blocks, no
// autoescape, `tojson` = json.dumps(ensure_ascii=False), raise_exception,
// strftime_now), checked byte for byte against @huggingface/jinja
// (tests/tokenizer/jinja_oracle_test.sh).
//
// Supported: text, {{ }}, {% %}, {# #} with `-` whitespace control; the
// statements if/elif/else, for (with `else`, an `if` filter, tuple
// unpacking, loop.index/index0/revindex/revindex0/first/last/length/
// previtem/nextitem, break/continue), set (name, tuple, `ns.attr`, block
// set), macro (positional, keyword and default arguments), raw, filter
// blocks are not. Expressions: literals (string, int, float, bool, none,
// list, tuple, dict), arithmetic, comparisons, `in`/`not in`, `and`/`or`/
// `not`, `~`, `x if c else y`, attribute / subscript / slice ([a:b:c]),
// calls, filters (see kFilters in jinja.cpp) and tests (`is [not] NAME`).
// Anything else — an unknown statement, filter, test or method — is refused
// when the template is parsed, with the construct and its line named.
//
// Provenance: every string byte remembers whether it came from the render
// DATA (messages, tools: text a client wrote) or from the template itself
// (its literals, bos_token / eos_token). Concatenation keeps the bytes'
// origins; a filter or method computing a new string from input text marks
// the whole result as input. The output carries this mask so the tokenizer
// recognises special tokens only in template text (injection safety, see
// chat_template.h).
//
// Bounds (a GGUF's template is untrusted input): Limits caps the output size,
// any intermediate string / list size, the number of evaluation steps (loop
// iterations and statements) and the nesting depth of macro calls; the
// parser bounds block nesting and each expression's height, the renderer its
// own recursion. Exceeding a bound is an error (kUnsupported when parsing,
// kResourceExhausted when rendering), never a hang, an abort or a stack
// overflow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"

namespace bonsai::tokenizer::jinja {

// Work bounds of one render.
struct Limits {
  size_t max_output_bytes = size_t{8} << 20;  // the rendered text, and any one string or list value
  uint64_t max_steps = 5'000'000;             // statements executed + loop iterations + filter elements
  int max_call_depth = 32;                    // nested macro calls
};

// A rendered template: `text`, and per byte of it whether that byte came from
// the render data (`input_mask[i]` == 1) or the template (0). Same length.
struct Output {
  std::string text;
  std::string input_mask;
};

struct Program;  // the parsed template (jinja.cpp)

// Appends `s` to `out` as a JSON string literal the way Python's json.dumps
// (ensure_ascii=False) writes it, which is what templates' tojson give: the
// quote, the backslash, \n, \r, \t, \b, \f escaped by name, other bytes below 0x20 as
// \u00XX, every other byte (UTF-8 included) as is. Shared by the
// interpreter's tojson and chat_template's to_python_json.
void append_json_string(std::string_view s, std::string& out);

// Python's repr(float): the shortest digits that read back to `d`, fixed
// when the decimal exponent is in [-4, 16) (an integral value ends in
// ".0"), else d.ddde+XX (at least two exponent digits); "nan", "inf",
// "-inf". Shared by the interpreter and chat_template's to_python_json.
std::string python_float_repr(double d);

// A parsed template. Cheap to copy (shares the immutable AST); thread-safe to
// render concurrently.
class Template {
 public:
  // Parses `source`. Errors (kUnsupported): a syntax error, or a construct
  // outside the supported subset; the message names the construct and its
  // 1-based line ("jinja: line 12: unsupported filter 'wordwrap'").
  static core::Expected<Template> parse(std::string_view source);

  // Renders with the variables of `data` (a JSON object; its strings count as
  // input text: messages, tools) and `trusted` (a JSON object whose strings
  // count as template text: bos_token, eos_token; flags such as
  // add_generation_prompt). A key in both: `trusted` wins. Errors:
  // kInvalidArgument for a runtime error of the template (a type error, an
  // undefined method) or raise_exception(msg) (the message is
  // "jinja: line N: " + msg); kResourceExhausted when a Limits bound is hit.
  core::Expected<Output> render(const nlohmann::ordered_json& data, const nlohmann::ordered_json& trusted,
                                const Limits& limits = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace bonsai::tokenizer::jinja
