// JSON Schema → GBNF: each supported keyword accepts a valid instance byte by
// byte and rejects an invalid one; unsupported keywords are errors naming them.
#include "structured/json_schema.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "structured/grammar.h"
#include "structured/token_mask.h"

namespace bonsai::structured {
namespace {

struct Case {
  const char* schema;
  std::vector<const char*> valid;
  std::vector<const char*> invalid;
};

// Feeds `text` one byte at a time (every byte boundary is a chunk boundary).
bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  auto st = GrammarState::create(g);
  if (!st) return false;
  for (char c : text) {
    if (!st->accept_bytes(std::string_view(&c, 1))) return false;
  }
  return st->can_end();
}

void run_cases(const std::vector<Case>& cases) {
  for (const auto& c : cases) {
    auto gbnf = json_schema_to_gbnf(c.schema);
    ASSERT_TRUE(gbnf) << c.schema << ": " << gbnf.error().message;
    auto g = Grammar::parse(*gbnf);
    ASSERT_TRUE(g) << c.schema << "\n" << *gbnf << "\n" << g.error().message;
    for (const char* v : c.valid) EXPECT_TRUE(accepts(*g, v)) << c.schema << " should accept " << v << "\n" << *gbnf;
    for (const char* v : c.invalid) EXPECT_FALSE(accepts(*g, v)) << c.schema << " should reject " << v << "\n" << *gbnf;
  }
}

TEST(JsonSchema, Primitives) {
  run_cases({
      {R"({"type":"string"})", {R"("")", R"("a\"b\\c\u00e9")", "\"\xE4\xBD\xA0\""}, {R"(a)", R"("a)", "\"\x01\""}},
      {R"({"type":"boolean"})", {"true", "false"}, {"True", "1"}},
      {R"({"type":"null"})", {"null"}, {"nul", "\"null\""}},
      {R"({"type":"number"})", {"0", "-1.5", "3e10", "12.25E-3", "1e99"}, {"01", "1.", ".5", "+1", "1e", "1e100"}},
      {R"({"type":"integer"})", {"0", "-42", "9999999999999999"}, {"1.0", "99999999999999999", "-"}},
      {R"({"type":["string","null"]})", {"null", R"("x")"}, {"1"}},
      // Type-specific keywords bind to their own branch of a type array.
      {R"({"type":["string","null"],"maxLength":2})", {"null", R"("xy")"}, {R"("xyz")", "1"}},
      {R"({"type":["integer","array"],"maximum":5,"maxItems":1})", {"5", "[]", "[true]"}, {"6", "[1,2]"}},
      {R"({})", {R"({"a":[1,{"b":null}]})", "3", R"("s")"}, {"{", "nope"}},
      {R"(true)", {"[]"}, {"]"}},
  });
}

TEST(JsonSchema, EnumConst) {
  run_cases({
      {R"({"enum":["red","green",3,null,{"a":1}]})",
       {R"("red")", R"("green")", "3", "null", R"({"a":1})"},
       {R"("blue")", "4", R"({"a": 1})"}},
      {R"({"const":"fixed"})", {R"("fixed")"}, {R"("fixe")", R"("fixedd")"}},
      {R"({"type":"string","enum":["a"]})", {R"("a")"}, {R"("b")"}},
      // Values that are prefixes of others, and multi-byte characters (the
      // prefix tree never splits one).
      {R"({"enum":[1,12,123,"ab","a","\u00e9","\u00e9a","\u65e5\u672c"]})",
       {"1", "12", "123", R"("a")", R"("ab")", "\"\xC3\xA9\"",
        "\"\xC3\xA9"
        "a\"",
        "\"\xE6\x97\xA5\xE6\x9C\xAC\""},
       {"1234", "13", R"("abc")", R"("")",
        "\"\xC3\xA9"
        "b\"",
        "\"\xE6\x97\xA5\""}},
      {R"({"anyOf":[{"const":"x","title":"X"},{"enum":["y",null]}]})", {R"("x")", R"("y")", "null"}, {R"("z")"}},
      // A branch that is not a literal keeps the general anyOf.
      {R"({"anyOf":[{"const":"x"},{"type":"integer"}]})", {R"("x")", "7"}, {R"("y")"}},
  });
}

TEST(JsonSchema, Objects) {
  run_cases({
      {R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]})",
       {R"({"name":"Al","age":3})", "{\n  \"name\": \"Al\",\n  \"age\": 3\n}", R"({ "name" : "x" , "age" : -1 })"},
       {R"({"name":"Al"})", R"({"age":3,"name":"Al"})", R"({"name":"Al","age":3,"x":1})",
        R"({"name":"Al","age":"3"})"}},
      // Optional properties in listed order, each may be omitted.
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["b"]})",
       {R"({"b":1})", R"({"a":1,"b":2})", R"({"b":2,"c":3})", R"({"a":1,"b":2,"c":3})"},
       {R"({})", R"({"a":1})", R"({"a":1,"c":3})", R"({"b":1,})", R"({,"b":1})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"}}})", {"{}", R"({"a":1})"}, {R"({"b":1})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})", {"{}", R"({"x":1,"y":2})"}, {R"({"x":"1"})"}},
      {R"({"type":"object","properties":{"a":{"type":"boolean"}},"additionalProperties":true})",
       {R"({"a":true,"zz":[1]})", R"({"q":null})", "{}", R"({"aa":1})", R"({"":1})", R"({"b":1})"},
       {R"({"a":true,})", R"({"a":true "b":1})", R"({"a":1})", R"({"a":true,"a":false})", R"({"\u0061":1})"}},
      {R"({"type":"object","properties":{"ab":{"type":"null"},"ac":{"type":"null"}},"additionalProperties":{"type":"integer"}})",
       {R"({"a":1})", R"({"abc":2})", R"({"ab":null,"ad":3})", R"({"b":4})"},
       {R"({"ab":1})", R"({"ac":5})", R"({"x":null})"}},
      {R"({"type":"object","properties":{"a":{"type":"boolean"}},"additionalProperties":false})",
       {R"({"a":true})"},
       {R"({"a":true,"b":1})"}},
      {R"({"type":"object","properties":{"k\"ey":{"type":"null"}},"required":["k\"ey"]})",
       {R"({"k\"ey":null})"},
       {R"({"key":null})"}},
  });
}

TEST(JsonSchema, Arrays) {
  run_cases({
      {R"({"type":"array","items":{"type":"integer"}})", {"[]", "[1]", "[1, 2 ,3]"}, {"[1,]", "[\"a\"]", "["}},
      {R"({"type":"array","items":{"type":"boolean"},"minItems":2,"maxItems":3})",
       {"[true,false]", "[true,true,true]"},
       {"[]", "[true]", "[true,true,true,true]"}},
      {R"({"type":"array","maxItems":0})", {"[]"}, {"[1]"}},
      {R"({"type":"array","minItems":1})", {"[\"x\", 2]"}, {"[]"}},
  });
}

TEST(JsonSchema, Combinators) {
  run_cases({
      {R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", {"1", R"("ab")"}, {R"("abc")", "true"}},
      {R"({"oneOf":[{"const":1},{"const":2}]})", {"1", "2"}, {"3"}},
      {R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                    {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
       {R"({"a":1,"b":"x"})"},
       {R"({"a":1})", R"({"b":"x"})"}},
  });
}

TEST(JsonSchema, RefsAndRecursion) {
  run_cases({
      {R"({"$defs":{"pos":{"type":"integer","minimum":1}},"type":"object","properties":{"n":{"$ref":"#/$defs/pos"}},"required":["n"]})",
       {R"({"n":5})"},
       {R"({"n":0})"}},
      {R"({"definitions":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/definitions/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/definitions/node"})",
       {R"({"v":1,"next":{"v":2,"next":null}})", R"({"v":1,"next":null})"},
       {R"({"v":1,"next":{"v":2}})"}},
      {R"({"type":"object","properties":{"child":{"$ref":"#"}}})", {R"({"child":{"child":{}}})"}, {R"({"child":1})"}},
  });
}

TEST(JsonSchema, IntegerRangesAreExact) {
  auto check_range = [](const char* schema, int64_t lo, int64_t hi, int64_t from, int64_t to) {
    auto gbnf = json_schema_to_gbnf(schema);
    ASSERT_TRUE(gbnf) << gbnf.error().message;
    auto g = Grammar::parse(*gbnf);
    ASSERT_TRUE(g) << g.error().message;
    for (int64_t v = from; v <= to; ++v) {
      EXPECT_EQ(accepts(*g, std::to_string(v)), v >= lo && v <= hi) << schema << " " << v;
    }
  };
  check_range(R"({"type":"integer","minimum":-37,"maximum":215})", -37, 215, -1200, 1200);
  check_range(R"({"type":"integer","exclusiveMinimum":9,"exclusiveMaximum":100})", 10, 99, -50, 1100);
  check_range(R"({"type":"integer","minimum":105})", 105, INT64_MAX, -20, 3000);
  check_range(R"({"type":"integer","maximum":-3})", INT64_MIN, -3, -3000, 50);
  check_range(R"({"type":"integer","minimum":0,"maximum":0})", 0, 0, -20, 20);
  check_range(R"({"type":"integer","minimum":1.5,"maximum":7.9})", 2, 7, -10, 20);
}

// Number texts from -13 to 13 in many spellings (0-3 fraction digits,
// trailing zeros) with their value x 1000.
std::vector<std::pair<std::string, int64_t>> number_texts() {
  std::vector<std::pair<std::string, int64_t>> out;
  for (int64_t i = 0; i <= 13; ++i) {
    for (const char* f : {"", "0", "5", "25", "250", "05", "001", "999", "75", "125", "1", "00"}) {
      std::string frac = f;
      int64_t milli = 0;
      for (size_t k = 0; k < 3; ++k) milli = milli * 10 + (k < frac.size() ? frac[k] - '0' : 0);
      std::string text = std::to_string(i) + (frac.empty() ? "" : "." + frac);
      out.emplace_back(text, i * 1000 + milli);
      out.emplace_back("-" + text, -(i * 1000 + milli));
    }
  }
  return out;
}

TEST(JsonSchema, NumberBoundsAreExact) {
  // Schemas zod 4 / Pydantic emit: positive(), negative(), min(0.5), lt(2.5),
  // ge=-1.25 + le=10, gt=0 + lt=1; each text accepted iff its value fits.
  struct Bounds {
    const char* schema;
    std::function<bool(int64_t)> fits;  // value x 1000
  };
  const std::vector<Bounds> cases = {
      {R"({"type":"number","exclusiveMinimum":0})", [](int64_t v) { return v > 0; }},
      {R"({"type":"number","exclusiveMaximum":0})", [](int64_t v) { return v < 0; }},
      {R"({"type":"number","minimum":0.5})", [](int64_t v) { return v >= 500; }},
      {R"({"type":"number","exclusiveMaximum":2.5})", [](int64_t v) { return v < 2500; }},
      {R"({"type":"number","minimum":-1.25,"maximum":10})", [](int64_t v) { return v >= -1250 && v <= 10000; }},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", [](int64_t v) { return v > 0 && v < 1000; }},
      {R"({"type":"number","minimum":-5,"maximum":-2})", [](int64_t v) { return v >= -5000 && v <= -2000; }},
      {R"({"type":"number","minimum":0,"exclusiveMinimum":0.999,"maximum":12.125})",
       [](int64_t v) { return v > 999 && v <= 12125; }},
      {R"({"type":"number","maximum":0})", [](int64_t v) { return v <= 0; }},
      {R"({"type":"number","multipleOf":5})", [](int64_t v) { return v % 5000 == 0; }},
      {R"({"type":"number","multipleOf":0.25,"minimum":-3})", [](int64_t v) { return v % 250 == 0 && v >= -3000; }},
      {R"({"type":"number","multipleOf":2.5,"exclusiveMaximum":7.5})",
       [](int64_t v) { return v % 2500 == 0 && v < 7500; }},
      {R"({"type":"integer","exclusiveMinimum":0.5,"maximum":9.75})",
       [](int64_t v) { return v % 1000 == 0 && v > 500 && v <= 9750; }},
  };
  const auto texts = number_texts();
  for (const auto& c : cases) {
    auto gbnf = json_schema_to_gbnf(c.schema);
    ASSERT_TRUE(gbnf) << c.schema << ": " << gbnf.error().message;
    auto g = Grammar::parse(*gbnf);
    ASSERT_TRUE(g) << g.error().message;
    for (const auto& [text, milli] : texts) {
      // Integers are written without a fraction.
      const bool integer_text = text.find('.') == std::string::npos;
      const bool want = c.fits(milli) && (std::string(c.schema).find("integer") == std::string::npos || integer_text);
      EXPECT_EQ(accepts(*g, text), want) << c.schema << " " << text;
    }
    // At most 15 digits: a double holds the value exactly enough that a
    // JavaScript / Python validator agrees (2.4999999999999999 would read as 2.5).
    EXPECT_FALSE(accepts(*g, "2.4999999999999999")) << c.schema;
    EXPECT_FALSE(accepts(*g, "1234567890123456")) << c.schema;
    // No exponent, no leading zeros, no bare '-' / '.'.
    for (const char* bad : {"1e2", "01", "-", "1.", ".5", "+1"}) EXPECT_FALSE(accepts(*g, bad)) << c.schema << bad;
  }
}

TEST(JsonSchema, IntegerMultipleOf) {
  for (int k : {1, 3, 5, 7, 12, 1000}) {
    const std::string schema =
        R"({"type":"integer","minimum":-250,"maximum":2500,"multipleOf":)" + std::to_string(k) + "}";
    auto gbnf = json_schema_to_gbnf(schema);
    ASSERT_TRUE(gbnf) << gbnf.error().message;
    auto g = Grammar::parse(*gbnf);
    ASSERT_TRUE(g) << g.error().message;
    for (int v = -400; v <= 2600; ++v) {
      EXPECT_EQ(accepts(*g, std::to_string(v)), v % k == 0 && v >= -250 && v <= 2500) << schema << " " << v;
    }
    EXPECT_FALSE(accepts(*g, "10.0")) << schema;
  }
  // zod 4's z.int().multipleOf(5): the safe-integer bounds too.
  auto gbnf = json_schema_to_gbnf(
      R"({"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991,"multipleOf":5})");
  ASSERT_TRUE(gbnf) << gbnf.error().message;
  auto g = Grammar::parse(*gbnf);
  ASSERT_TRUE(g);
  // At most 15 digits (exact as a double, what zod's check computes with).
  EXPECT_TRUE(accepts(*g, "900719925474095"));
  EXPECT_FALSE(accepts(*g, "900719925474096"));
  EXPECT_FALSE(accepts(*g, "9007199254740990"));
  EXPECT_TRUE(accepts(*g, "-15"));
  EXPECT_FALSE(accepts(*g, "16"));
}

TEST(JsonSchema, StringLengthFormatPattern) {
  run_cases({
      {R"({"type":"string","minLength":2,"maxLength":3})",
       {R"("ab")", R"("abc")", "\"\xC3\xA9\xC3\xA9\"", R"("\n\t")"},
       {R"("a")", R"("abcd")"}},
      {R"({"type":"string","format":"date"})",
       {R"("2024-02-29")", R"("2000-02-29")", R"("2023-04-30")", R"("2023-12-31")", R"("1999-02-28")"},
       {R"("2024-13-01")", R"("24-01-01")", R"("2023-02-29")", R"("1900-02-29")", R"("2023-02-30")", R"("2023-04-31")",
        R"("2023-00-10")", R"("2023-01-00")"}},
      {R"({"type":"string","format":"time"})",
       {R"("23:59:59Z")", R"("08:00:00.123+02:00")"},
       {R"("24:00:00Z")", R"("08:00:00")"}},
      {R"({"type":"string","format":"date-time"})", {R"("2024-01-31T12:00:00Z")"}, {R"("2024-01-31 12:00:00Z")"}},
      {R"({"type":"string","format":"uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")"}},
      {R"({"type":"string","format":"email"})",
       {R"("a.b+c@example.co.uk")", R"("x@a-b.io")"},
       {R"("no-at-sign")", R"("a@b")", R"(".a@b.io")", R"("a..b@c.io")", R"("a.@c.io")", R"("a@-b.io")",
        R"("a@b-.io")"}},
      {R"({"type":"string","pattern":"^[A-Z]{3}-\\d{2,4}$"})",
       {R"("ABC-12")", R"("XYZ-1234")"},
       {R"("AB-12")", R"("ABC-1")", R"("abc-12")"}},
      {R"({"type":"string","pattern":"^(cat|dog)s?(?:!)*$"})", {R"("cat")", R"("dogs!!")"}, {R"("cow")", R"("cats?")"}},
      {R"({"type":"string","pattern":"^a.c$"})",
       {R"("abc")",
        "\"a\xE4\xBD\xA0"
        "c\""},
       {R"("ac")"}},
      {R"({"type":"string","pattern":"[0-9]+"})", {R"("x12y")", R"("7")"}, {R"("xy")"}},
      {R"({"type":"string","pattern":"^[^a-c]\\.\\\\$"})", {R"("z.\\")"}, {R"("a.\\")", R"("zx\\")"}},
  });
}

// A random sentence of `g` (ASCII bytes only): at each step a random byte the
// grammar allows; stops at a complete sentence with probability 1/8 (or when
// nothing else is allowed).
std::string sample(const std::shared_ptr<const Grammar>& g, std::mt19937& rng) {
  Matcher m(g);
  auto st = m.initial();
  EXPECT_TRUE(st);
  MatchState cur = *st;
  std::string out;
  for (int steps = 0; steps < 2000; ++steps) {
    std::vector<std::pair<uint8_t, MatchState>> next;
    for (int b = 1; b < 0x80; ++b) {
      MatchState o;
      if (m.step(cur, static_cast<uint8_t>(b), o) == StepResult::kOk) next.emplace_back(static_cast<uint8_t>(b), o);
    }
    if (Matcher::can_end(cur) && (next.empty() || rng() % 8 == 0)) return out;
    if (next.empty()) {
      ADD_FAILURE() << "grammar stuck after " << out;
      return out;
    }
    auto& pick = next[rng() % next.size()];
    out += static_cast<char>(pick.first);
    cur = pick.second;
  }
  ADD_FAILURE() << "no end after 2000 bytes: " << out;
  return out;
}

// zod 4's JSON Schemas (format + pattern, as z.toJSONSchema writes them) and
// Pydantic-style pattern + length bounds: every sampled string is a JSON
// string whose value matches the pattern (std::regex, ECMAScript), the
// length bounds and the format's own check.
TEST(JsonSchema, FormatPatternLengthIntersect) {
  struct Case {
    std::string schema;
    std::vector<std::string> regexes;  // the value must match each (ECMAScript)
    size_t min_len = 0, max_len = SIZE_MAX;
  };
  const std::string zod_email =
      R"(^(?:[A-Za-z0-9_'+\-]+\.)*[A-Za-z0-9_'+\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\-]*\.)+[A-Za-z]{2,}$)";
  const std::string zod_uuid =
      "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-"
      "0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$";
  const std::string zod_date_body =
      R"((?:(?:\d\d[2468][048]|\d\d[13579][26]|\d\d0[48]|[02468][048]00|[13579][26]00)-02-29|\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|(?:02)-(?:0[1-9]|1\d|2[0-8]))))";
  const std::string zod_datetime = "^" + zod_date_body + R"(T(?:(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z))$)";
  const std::string zod_ipv4 =
      R"(^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])$)";
  const std::string zod_hostname =
      R"(^(?=.{1,253}\.?$)[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[-0-9a-zA-Z]{0,61}[0-9a-zA-Z])?)*\.?$)";
  const std::string zod_ipv6 =
      R"(^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:((:[0-9a-fA-F]{1,4}){1,6})|:((:[0-9a-fA-F]{1,4}){1,7}|:))$)";
  auto schema = [](const std::string& format, const std::string& pattern, const std::string& extra = "") {
    nlohmann::json j = {{"type", "string"}};
    if (!format.empty()) j["format"] = format;
    if (!pattern.empty()) j["pattern"] = pattern;
    if (!extra.empty()) j.update(nlohmann::json::parse(extra));
    return j.dump();
  };
  // Checks of the formats themselves (as validators do).
  const std::string uri_check = R"(^[a-z][a-z0-9+.-]*://[A-Za-z0-9.-]+(:\d+)?(/[A-Za-z0-9._~-]*)*(\?[^#\s]*)?(#\S*)?$)";
  const std::string time_check = R"(^\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$)";
  const std::vector<Case> cases = {
      {schema("email", zod_email), {zod_email}},
      {schema("email", zod_email, R"({"maxLength":40})"), {zod_email}, 0, 40},
      {schema("uuid", zod_uuid), {zod_uuid}},
      {schema("date", "^" + zod_date_body + "$"), {"^" + zod_date_body + "$"}},
      {schema("date-time", zod_datetime), {zod_datetime}},
      {schema("ipv4", zod_ipv4), {zod_ipv4}},
      {schema("ipv6", zod_ipv6), {zod_ipv6}},
      {schema("hostname", zod_hostname), {zod_hostname}},
      {schema("uri", ""), {uri_check}},
      {schema("time", ""), {time_check}},
      {schema("", "^[a-z]+$", R"({"minLength":3,"maxLength":10})"), {"^[a-z]+$"}, 3, 10},
      {schema("", "^[cC][0-9a-z]{6,}$", R"({"maxLength":12})"), {"^[cC][0-9a-z]{6,}$"}, 0, 12},
      {schema("", "^(?!\\.)(?!.*\\.\\.)[a-z.]{1,12}$"), {"^(?!\\.)(?!.*\\.\\.)[a-z.]{1,12}$"}},
      {schema("", "ab+c", R"({"minLength":5,"maxLength":8})"), {"ab+c"}, 5, 8},
      {schema("", R"(^\d{3}-\d{4}$)", R"({"minLength":8})"), {R"(^\d{3}-\d{4}$)"}, 8, 8},
  };
  std::mt19937 rng(1234);
  for (const auto& c : cases) {
    auto gbnf = json_schema_to_gbnf(c.schema);
    ASSERT_TRUE(gbnf) << c.schema << ": " << gbnf.error().message;
    auto g = Grammar::parse(*gbnf);
    ASSERT_TRUE(g) << g.error().message;
    std::vector<std::regex> res;
    for (const auto& r : c.regexes) res.emplace_back(r, std::regex::ECMAScript);
    for (int i = 0; i < 150; ++i) {
      const std::string text = sample(*g, rng);
      auto value = nlohmann::json::parse(text, nullptr, false);
      ASSERT_TRUE(value.is_string()) << c.schema << ": " << text;
      const std::string v = value.get<std::string>();
      for (size_t k = 0; k < res.size(); ++k) EXPECT_TRUE(std::regex_search(v, res[k])) << c.regexes[k] << " " << v;
      EXPECT_GE(v.size(), c.min_len) << c.schema << " " << v;
      EXPECT_LE(v.size(), c.max_len) << c.schema << " " << v;
    }
  }
}

// Large counters stay cheap (Hopcroft minimisation) and exact; a pattern
// past the automaton limit is refused naming it.
TEST(JsonSchema, LargeLengthBoundsAndTheStateLimit) {
  auto gbnf = json_schema_to_gbnf(R"({"type":"string","pattern":"^[a-z]+$","maxLength":3000})");
  ASSERT_TRUE(gbnf) << gbnf.error().message;
  auto g = Grammar::parse(*gbnf);
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_TRUE(accepts(*g, "\"" + std::string(3000, 'q') + "\""));
  EXPECT_FALSE(accepts(*g, "\"" + std::string(3001, 'q') + "\""));
  EXPECT_FALSE(accepts(*g, "\"\""));
  const std::string deep =
      R"({"type":"string","pattern":")" + std::string(150, '(') + "a" + std::string(150, ')') + "\"}";
  auto d = json_schema_to_gbnf(deep);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().message,
            "json_schema: unsupported pattern at /pattern: groups nested deeper than 100 (at offset 100)");
  auto e = json_schema_to_gbnf(R"({"type":"string","pattern":"^.{0,3000}x.{0,3000}$"})");
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().message,
            "json_schema: unsupported pattern at /pattern: pattern needs more than 20000 automaton states");
}

// The date format is the real calendar: every date of four years (two leap
// years, 1900 and 2023 not) and out-of-range months / days.
TEST(JsonSchema, DateFormatIsTheCalendar) {
  auto gbnf = json_schema_to_gbnf(R"({"type":"string","format":"date"})");
  ASSERT_TRUE(gbnf);
  auto g = Grammar::parse(*gbnf);
  ASSERT_TRUE(g);
  for (int y : {1900, 2000, 2023, 2024}) {
    const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    for (int m = 0; m <= 13; ++m) {
      const int days = m == 2 ? (leap ? 29 : 28) : (m == 4 || m == 6 || m == 9 || m == 11) ? 30 : 31;
      for (int d = 0; d <= 32; ++d) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "\"%04d-%02d-%02d\"", y, m, d);
        EXPECT_EQ(accepts(*g, buf), m >= 1 && m <= 12 && d >= 1 && d <= days) << buf;
      }
    }
  }
}

TEST(JsonSchema, JsonObjectMode) {
  auto g = Grammar::parse(json_object_gbnf());
  ASSERT_TRUE(g);
  EXPECT_TRUE(accepts(*g, R"({"a": {"b": [1, "x", null]}})"));
  EXPECT_FALSE(accepts(*g, "[1]"));
  EXPECT_FALSE(accepts(*g, "\"x\""));
}

TEST(JsonSchema, UnsupportedKeywordsAreErrorsNamingThem) {
  auto err = [](const char* schema) {
    auto r = json_schema_to_gbnf(schema);
    return r ? std::string("<no error>") : r.error().message;
  };
  EXPECT_EQ(err(R"({"type":"object","properties":{"x":{"type":"object","patternProperties":{"a":{}}}}})"),
            "json_schema: unsupported keyword 'patternProperties' at /properties/x");
  EXPECT_EQ(err(R"({"type":"array","uniqueItems":true})"), "json_schema: unsupported keyword 'uniqueItems' at /");
  EXPECT_EQ(err(R"({"type":"array","prefixItems":[{}]})"), "json_schema: unsupported keyword 'prefixItems' at /");
  EXPECT_EQ(err(R"({"type":"object","minProperties":1})"), "json_schema: unsupported keyword 'minProperties' at /");
  EXPECT_EQ(err(R"({"type":"number","multipleOf":123457})"),
            "json_schema: 'multipleOf' 123457 at / is unsupported: its remainder automaton needs more than 10000 "
            "states (digits of multipleOf x (fraction digits + 1) must be at most that)");
  EXPECT_EQ(err(R"({"type":"number","multipleOf":0})"), "json_schema: 'multipleOf' at / must be greater than 0");
  EXPECT_EQ(err(R"({"type":"number","minimum":2.5,"exclusiveMaximum":2.5})"),
            "json_schema: the bounds at / admit no number");
  EXPECT_EQ(err(R"({"not":{"type":"string"}})"), "json_schema: unsupported keyword 'not' at /");
  EXPECT_EQ(err(R"({"type":"string","format":"cuid"})"),
            "json_schema: unsupported format 'cuid' at / (supported: date, date-time, email, hostname, ipv4, ipv6, "
            "time, uri, uuid)");
  EXPECT_EQ(err(R"({"type":"string","format":"date","pattern":"^x"})"),
            "json_schema: format 'date' and pattern at / admit no string");
  EXPECT_EQ(err(R"({"type":"string","pattern":"^a{3}$","maxLength":2})"),
            "json_schema: pattern and minLength/maxLength at / admit no string");
  EXPECT_EQ(err(R"({"type":"string","maxLength":3,"minimum":2})"),
            "json_schema: unsupported keyword 'minimum' for type string at /");
  EXPECT_EQ(err(R"({"$ref":"http://x/y.json"})"),
            "json_schema: $ref 'http://x/y.json' at /: only references into the same document "
            "(#...) are supported");
  EXPECT_EQ(err(R"({"$ref":"#/$defs/missing"})"), "json_schema: $ref '#/$defs/missing' at / does not resolve");
  EXPECT_EQ(err(R"({"type":"string","pattern":"^(a)\\1$"})"),
            "json_schema: unsupported pattern at /pattern: escape '\\1' (backreferences, \\b, \\B, \\p, "
            "\\k, \\c are not supported) (at offset 4)");
  EXPECT_EQ(err(R"({"type":"string","pattern":"^a(?=b)$"})"),
            "json_schema: unsupported pattern at /pattern: lookaround / group flags '(?=' (lookaheads are supported "
            "only right after a leading '^') (at offset 2)");
  EXPECT_EQ(err(R"({"type":"string","pattern":"^(?<=a)b$"})"),
            "json_schema: unsupported pattern at /pattern: lookaround / group flags '(?<' (lookaheads are supported "
            "only right after a leading '^') (at offset 1)");
  EXPECT_EQ(err(R"({"type":"string","pattern":"a\\bc"})"),
            "json_schema: unsupported pattern at /pattern: word boundary '\\b' (at offset 1)");
  EXPECT_EQ(err(R"({"type":"wat"})"), "json_schema: unknown type 'wat' at /");
  EXPECT_EQ(err("{"), "json_schema: not valid JSON");
  // Annotations are ignored.
  EXPECT_EQ(
      err(R"({"title":"t","description":"d","examples":[1],"default":1,"$schema":"x","$id":"y","$comment":"c","type":"integer"})"),
      "<no error>");
}

}  // namespace
}  // namespace bonsai::structured
