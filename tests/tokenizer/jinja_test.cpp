// The Jinja-subset interpreter (src/tokenizer/jinja.h): each construct with
// its exact output (Jinja2's / Python's semantics as transformers renders
// chat templates), each error (named construct and line), the work bounds,
// and the provenance mask. Whole real templates are compared with
// @huggingface/jinja in tests/tokenizer/jinja_oracle_test.sh and with Jinja2
// in chat_template_test.cpp.
#include "tokenizer/jinja.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/chat_template.h"

namespace bonsai::tokenizer::jinja {
namespace {

using OJson = nlohmann::ordered_json;

// Renders `src` with `data` (input) and no trusted variables; the error's
// message when it fails.
std::string render(const std::string& src, const OJson& data = OJson::object(), const Limits& limits = {}) {
  auto t = Template::parse(src);
  if (!t) return "PARSE ERROR: " + t.error().message;
  auto out = t->render(data, OJson::object(), limits);
  if (!out) return "RENDER ERROR: " + out.error().message;
  return out->text;
}

struct Case {
  const char* src;
  const char* data;  // JSON
  const char* want;
};

TEST(Jinja, Constructs) {
  const Case cases[] = {
      // Text, output, comments, literals.
      {"a{{ 'b' }}c{# no #}d", "{}", "abcd"},
      {"{{ \"x\\n\\t\\u00e9\" 'y' }}", "{}",
       "x\n\té"
       "y"},
      {"{{ 1 }} {{ -2 }} {{ 2.5 }} {{ 1e3 }} {{ true }} {{ none }} {{ [1, 'a'] }} {{ {'k': none} }}", "{}",
       "1 -2 2.5 1000.0 True None [1, 'a'] {'k': None}"},
      {"{{ undefined_name }}|", "{}", "|"},
      // Arithmetic and comparison (Python's floor division and modulo).
      {"{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }}", "{}",
       "3 -4 2 3.5 1024 7 9"},
      {"{{ 1 < 2 }} {{ 'a' >= 'b' }} {{ 1 == 1.0 }} {{ [1] == [1] }} {{ 'x' != 'x' }}", "{}",
       "True False True True False"},
      {"{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}", "{}", "a1None abab [1, 2]"},
      {"{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}", "{}", "True True True True"},
      {"{{ not 0 and 'y' or 'n' }} {{ 0 or '' or 'last' }} {{ 'a' if x else 'b' }} {{ 'c' if none }}|", "{\"x\": 1}",
       "y last a |"},
      // Attribute, subscript, slices (Python semantics, by code point).
      {"{{ m.role }} {{ m['role'] }} {{ m.missing is undefined }} {{ xs[-1] }} {{ xs.0 }}",
       "{\"m\": {\"role\": \"user\"}, \"xs\": [1, 2, 3]}", "user user True 3 1"},
      {"{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'héllo'[1:3] }} {{ 'abc'[::-1] }}",
       "{\"xs\": [1, 2, 3]}", "[2, 3] [1, 2] [3, 2, 1] [1, 3] él cba"},
      // if / elif / else.
      {"{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %}", "{\"x\": 2}", "two"},
      {"{% if x %}yes{% else %}no{% endif %}", "{\"x\": []}", "no"},
      // for: loop variables, else, filter, unpacking, break/continue.
      {"{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
       "{{ loop.revindex0 }},{% endfor %}",
       "{\"xs\": [\"a\", \"b\"]}", "01TrueFalse21,12FalseTrue20,"},
      {"{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", "{\"xs\": [1, 2, 3]}", "-2;1-3;2-;"},
      {"{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", "{\"xs\": []}", "empty"},
      {"{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{% endfor %}", "{\"xs\": [1, 2, 3]}", "2132"},
      {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}",
       "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1;a=2;ba"},
      {"{% for k in d %}{{ k }}{% endfor %}", "{\"d\": {\"x\": 1, \"y\": 2}}", "xy"},
      {"{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}"
       "{% endfor %}",
       "{\"xs\": [1, 2, 3, 4, 5]}", "13"},
      // set: scoping (a loop's set does not leak; a namespace's does), tuples, blocks.
      {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "{}", "1"},
      {"{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", "{}", "4"},
      {"{% set a, b = [1, 2] %}{{ a }}{{ b }}", "{}", "12"},
      {"{% set block %}in {{ 'side' }}{% endset %}[{{ block }}]", "{}", "[in side]"},
      {"{% if true %}{% set y = 'set in if' %}{% endif %}{{ y }}", "{}", "set in if"},
      // Macros: defaults, keywords, caller's globals, namespaces mutated inside.
      {"{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, c=3) }} {{ m('x', 'y') }}",
       "{}", "1BNone 1B3 xyNone"},
      {"{% set n = namespace(k=0) %}{% macro inc() %}{% set n.k = n.k + 1 %}{% endmacro %}{{ inc() }}{{ inc() }}"
       "{{ n.k }}",
       "{}", "2"},
      // raw.
      {"{% raw %}{{ not rendered }}{% endraw %}", "{}", "{{ not rendered }}"},
      // Filters.
      {"{{ '  x  ' | trim }}|{{ 'aXa' | trim('a') }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'hello world' | title "
       "}}"
       "|{{ 'hELLO' | capitalize }}",
       "{}", "x|X|ABC|abc|Hello World|Hello"},
      {"{{ xs | length }} {{ 'héllo' | length }} {{ d | length }} {{ xs | first }} {{ xs | last }} {{ xs | join('-') }}"
       " {{ xs | reverse | list }} {{ xs | sum }} {{ xs | min }} {{ xs | max }}",
       "{\"xs\": [3, 1, 2], \"d\": {\"a\": 1}}", "3 5 1 3 2 3-1-2 [2, 1, 3] 6 1 3"},
      {"{{ x | default('d') }} {{ '' | default('e', true) }} {{ 'v' | d('x') }} {{ 3 | string }} {{ '42' | int + 1 }}"
       " {{ '2.5' | float }} {{ 'a-b' | replace('-', '+') }} {{ [3, 1, 2] | sort }} {{ [1, 1, 2] | unique | list }}",
       "{}", "d e v 3 43 2.5 a+b [1, 2, 3] [1, 2]"},
      {"{{ xs | selectattr('t', 'equalto', 'a') | map(attribute='n') | join(',') }}|"
       "{{ xs | rejectattr('t', 'equalto', 'a') | map(attribute='n') | list }}|"
       "{{ xs | selectattr('n') | list | length }}|{{ [1, 2, 3, 4] | select('even') | list }}|"
       "{{ ['a', 'b'] | map('upper') | list }}",
       "{\"xs\": [{\"t\": \"a\", \"n\": 1}, {\"t\": \"b\", \"n\": 2}, {\"t\": \"a\", \"n\": 0}]}",
       "1,0|[2]|2|[2, 4]|['A', 'B']"},
      {"{{ {'b': 1, 'a': [1.5, 'é', none, true]} | tojson }}|{{ [1, {'a': 2}] | tojson(indent=2) }}|{{ 's\"\\n' | "
       "tojson }}",
       "{}", "{\"b\": 1, \"a\": [1.5, \"é\", null, true]}|[\n  1,\n  {\n    \"a\": 2\n  }\n]|\"s\\\"\\n\""},
      {"{{ d | dictsort }} {{ 'a\\nb' | indent(2) }} {{ '<x>' | safe }} {{ 'one two' | wordcount }}",
       "{\"d\": {\"b\": 1, \"a\": 2}}", "[['a', 2], ['b', 1]] a\n  b <x> 2"},
      // Tests.
      {"{{ x is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} {{ d is mapping }} {{ xs is iterable "
       "}}"
       " {{ xs is sequence }} {{ 1 is number }} {{ 1.5 is float }} {{ true is boolean }} {{ false is false }}"
       " {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 1 is equalto 1 }}"
       " {{ s is not none }} {{ 'ab' is lower }} {{ x is sameas 1 }}",
       "{\"x\": 1, \"n\": null, \"s\": \"ab\", \"d\": {}, \"xs\": []}",
       "True True True True True True True True True True True True True True True True True True True"},
      // String methods (Python's).
      {"{{ s.startswith('ab') }} {{ s.endswith(('x', 'd')) }} {{ s.split('b') }} {{ ' a  b '.split() }}"
       " {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '\\n x \\n'.strip('\\n') }}|"
       "{{ 'xxaxx'.lstrip('x') }} {{ 'xxaxx'.rstrip('x') }} {{ s.upper() }} {{ s.replace('b', 'B') }}"
       " {{ s.find('c') }} {{ '-'.join(['a', 'b']) }} {{ 'Ab1'.isalnum() }}",
       "{\"s\": \"abcd\"}",
       "True True ['a', 'cd'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c']  x |axx xxa ABCD aBcd 2 a-b True"},
      // dict and list methods.
      {"{{ d.get('a') }} {{ d.get('z', 'dz') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d.values() | list }}"
       "{% set l = [] %}{% set _ = l.append(1) %}{% set _ = l.extend([2, 3]) %} {{ l }} {{ l.pop() }} {{ l }}",
       "{\"d\": {\"a\": 1}}", "1 dz None ['a'] [1] [1, 2, 3] 3 [1, 2]"},
      // Globals.
      {"{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ dict(a=1) }}", "{}", "[0, 1, 2] [1, 3, 5] {'a': 1}"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(render(c.src, OJson::parse(c.data)), c.want) << c.src;
  }
}

// Whitespace as transformers configures chat templates: trim_blocks,
// lstrip_blocks, '-' markers, one trailing newline of the template dropped.
TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render("{% if true %}\nA\n{% endif %}\nB"), "A\nB");  // trim_blocks: the newline after a tag
  EXPECT_EQ(render("  {% if true %}x{% endif %}"), "x");          // lstrip_blocks: indentation before a tag
  EXPECT_EQ(render("a  {% if true %}x{% endif %}"), "a  x");      // not at a line start: kept
  EXPECT_EQ(render("  {{ 'v' }}"), "  v");                        // an expression tag is not a block
  EXPECT_EQ(render("a \n {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(render("a\n{%- if true -%}\n  b\n{%- endif %}"), "ab");
  EXPECT_EQ(render("x\n"), "x");
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a {#- c -#} b"), "ab");
}

// Unsupported constructs are refused at parse time, naming the construct and line.
TEST(Jinja, ParseErrorsNameTheConstructAndLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"line one\n{{ x | wordwrap }}", "jinja: line 2: unsupported filter 'wordwrap'"},
      {"{% if x is fancy %}{% endif %}", "jinja: line 1: unsupported test 'fancy'"},
      {"\n\n{% include 'other.j2' %}", "jinja: line 3: unsupported statement '{% include %}'"},
      {"{{ s.format(1) }}", "jinja: line 1: unsupported method 'format()'"},
      {"{{ cycler(1) }}",
       "jinja: line 1: unsupported function 'cycler' (not a macro of the template nor a known global)"},
      {"{% if x %}", "jinja: line 1: missing '{% endif %}'"},
      {"{{ 'unterminated }}", "jinja: line 1: unterminated string literal"},
      {"{{ x ! y }}", "jinja: line 1: unexpected character '!' in a tag"},
      {"{% for x in y %}{% endif %}", "jinja: line 1: unexpected '{% endif %}', expected '{% endfor %}'"},
      {"{% break %}", "jinja: line 1: 'break' outside a for loop"},
      {"{{ x", "jinja: line 1: unclosed tag (missing '}}')"},
  };
  for (const auto& [src, want] : cases) {
    auto t = Template::parse(src);
    ASSERT_FALSE(t.has_value()) << src;
    EXPECT_EQ(t.error().code, core::Errc::kUnsupported) << src;
    EXPECT_EQ(t.error().message, want) << src;
  }
}

TEST(Jinja, RuntimeErrorsAndRaiseException) {
  EXPECT_EQ(render("a\n{{ raise_exception('Roles must alternate') }}"),
            "RENDER ERROR: jinja: line 2: Roles must alternate");
  EXPECT_EQ(render("{{ 'a' + 1 }}"),
            "RENDER ERROR: jinja: line 1: unsupported operand types for +: string and integer");
  EXPECT_EQ(render("{{ x.y.z }}"), "RENDER ERROR: jinja: line 1: 'y' of an undefined value");
  EXPECT_EQ(render("{{ 1 // 0 }}"), "RENDER ERROR: jinja: line 1: integer division or modulo by zero");
  EXPECT_EQ(render("{% set x = 1 %}{% set x.a = 2 %}"),
            "RENDER ERROR: jinja: line 1: cannot assign attribute 'a' of 'x': not a namespace()");
  auto t = Template::parse("{{ raise_exception('no') }}");
  ASSERT_TRUE(t.has_value());
  auto r = t->render(OJson::object(), OJson::object());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, core::Errc::kInvalidArgument);
}

// A hostile template cannot hang the server or exhaust its memory.
TEST(Jinja, WorkIsBounded) {
  Limits small;
  small.max_steps = 10000;
  small.max_output_bytes = 1 << 16;
  small.max_call_depth = 16;
  const auto code_of = [&](const std::string& src) {
    auto t = Template::parse(src);
    EXPECT_TRUE(t.has_value()) << src;
    auto r = t->render(OJson::object(), OJson::object(), small);
    EXPECT_FALSE(r.has_value()) << src;
    return r ? core::Errc::kInternal : r.error().code;
  };
  // Nested loops: 10^12 iterations.
  EXPECT_EQ(code_of("{% for a in range(1000000) %}{% for b in range(1000000) %}x{% endfor %}{% endfor %}"),
            core::Errc::kResourceExhausted);
  // Output growth.
  EXPECT_EQ(code_of("{% for a in range(5000) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}"),
            core::Errc::kResourceExhausted);
  // A string doubled in a variable (no output).
  EXPECT_EQ(code_of("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"),
            core::Errc::kResourceExhausted);
  EXPECT_EQ(code_of("{{ 'x' * 100000000 }}"), core::Errc::kResourceExhausted);
  // Unbounded recursion.
  EXPECT_EQ(code_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), core::Errc::kResourceExhausted);
  // A list grown by append.
  EXPECT_EQ(code_of("{% set l = [] %}{% for i in range(1000000) %}{% set _ = l.append(i) %}{% endfor %}"),
            core::Errc::kResourceExhausted);
  // Deep nesting is refused at parse time, not by overflowing the stack.
  EXPECT_FALSE(Template::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").has_value());
  EXPECT_FALSE(Template::parse("{{ " + std::string(3000, '[') + std::string(3000, ']') + " }}").has_value());
  // A long flat chain is as deep to evaluate (and to free) as a nested one.
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  auto long_chain = Template::parse(chain + " }}");
  ASSERT_FALSE(long_chain.has_value());
  EXPECT_EQ(long_chain.error().message, "jinja: line 1: expression nested too deeply");
  std::string attrs = "{{ x";
  for (int i = 0; i < 100000; ++i) attrs += ".a";
  EXPECT_FALSE(Template::parse(attrs + " }}").has_value());
  // Recursion through macros with deep expressions stops on the nesting bound (default limits).
  std::string deep = "{% macro f(n) %}{{ ";
  for (int i = 0; i < 10; ++i) deep += "(1 + ";
  deep += "f(n + 1)" + std::string(10, ')') + " }}{% endmacro %}{{ f(0) }}";
  auto rec = Template::parse(deep);
  ASSERT_TRUE(rec.has_value()) << rec.error().message;
  Limits many_calls;
  many_calls.max_call_depth = 100000;  // the nesting bound, not the call bound, must stop it
  auto rec_out = rec->render(OJson::object(), OJson::object(), many_calls);
  ASSERT_FALSE(rec_out.has_value());
  EXPECT_EQ(rec_out.error().code, core::Errc::kResourceExhausted);
  EXPECT_NE(rec_out.error().message.find("nested deeper than 500"), std::string::npos) << rec_out.error().message;
  // With the default limits the call depth stops it first.
  auto rec_default = rec->render(OJson::object(), OJson::object());
  ASSERT_FALSE(rec_default.has_value());
  EXPECT_NE(rec_default.error().message.find("macro calls nested deeper than 32"), std::string::npos);
  std::string nested_ifs;
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% if true %}";
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% endif %}";
  EXPECT_FALSE(Template::parse(nested_ifs).has_value());
}

// Input text keeps its provenance through concatenation, filters and macros;
// template literals and trusted variables do not count as input.
TEST(Jinja, InputMaskFollowsTheText) {
  auto t = Template::parse(
      "{% macro wrap(x) %}[{{ x }}]{% endmacro %}<s>{{ '<a>' + msg + '</a>' }}{{ wrap(msg | upper) }}{{ bos }}"
      "{{ d | tojson }}{% for k, v in d.items() %}{{ k }}{% endfor %}");
  ASSERT_TRUE(t.has_value()) << t.error().message;
  auto r = t->render(OJson{{"msg", "hi"}, {"d", {{"key", 1}}}}, OJson{{"bos", "<B>"}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->text, "<s><a>hi</a>[HI]<B>{\"key\": 1}key");
  const auto z = [](size_t n) { return std::string(n, '\0'); };
  const auto o = [](size_t n) { return std::string(n, '\1'); };
  // "<s><a>" template, "hi" input, "</a>[" template, "HI" input, "]<B>" template, the JSON and the key input.
  const std::string want_mask = z(6) + o(2) + z(5) + o(2) + z(4) + o(13);
  ASSERT_EQ(r->input_mask.size(), r->text.size());
  EXPECT_EQ(r->input_mask, want_mask);
}

// ChatTemplate::load: bos/eos given to the template, a built-in name, a clear
// error for a template the interpreter cannot parse (no silent fallback),
// and --no-jinja.
TEST(Jinja, ChatTemplateLoad) {
  ChatTemplateOptions opt;
  opt.override_template =
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ eos_token }}";
  auto t = ChatTemplate::load("ignored", opt, "<s>", "</s>");
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_TRUE(t->uses_jinja());
  std::vector<ChatMessage> msgs = {{.role = "user", .content = "<s>hi"}};
  auto r = t->render(msgs);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->text(), "<s>user:<s>hi;</s>");
  // "<s>" template, "user" input, ":" template, "<s>hi" input (its <s> is plain text), ";</s>" template.
  ASSERT_EQ(r->segments.size(), 5u);
  EXPECT_TRUE(r->segments[0].from_template);
  EXPECT_EQ(r->segments[0].text, "<s>");
  EXPECT_FALSE(r->segments[3].from_template);
  EXPECT_EQ(r->segments[3].text, "<s>hi");
  EXPECT_EQ(r->segments[4].text, ";</s>");

  opt.override_template = "{% for m in messages %}{{ m.content | wordwrap }}{% endfor %}";
  auto bad = ChatTemplate::load("", opt, "", "");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, core::Errc::kUnsupported);
  EXPECT_NE(bad.error().message.find("line 1: unsupported filter 'wordwrap'"), std::string::npos)
      << bad.error().message;
  EXPECT_NE(bad.error().message.find("--chat-template chatml"), std::string::npos);

  opt.override_template = "chatml";
  auto named = ChatTemplate::load("{{ anything }}", opt, "", "");
  ASSERT_TRUE(named.has_value());
  EXPECT_FALSE(named->uses_jinja());
  EXPECT_EQ(named->family(), ChatTemplate::Family::kChatML);
  r = named->render(msgs);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->text(), "<|im_start|>user\n<s>hi<|im_end|>\n<|im_start|>assistant\n");

  ChatTemplateOptions no_jinja{.jinja = false};
  auto native = ChatTemplate::load("{{ x | wordwrap }}", no_jinja, "", "");
  ASSERT_TRUE(native.has_value());
  EXPECT_FALSE(native->uses_jinja());

  // A runtime refusal of the template is a 400-class error with its message.
  opt.override_template = "{% if messages[0].role != 'system' %}{{ raise_exception('System first') }}{% endif %}";
  auto strict = ChatTemplate::load("", opt, "", "");
  ASSERT_TRUE(strict.has_value());
  auto refused = strict->render(msgs);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, core::Errc::kInvalidArgument);
  EXPECT_EQ(refused.error().message, "jinja: line 1: System first");
}

}  // namespace
}  // namespace bonsai::tokenizer::jinja
