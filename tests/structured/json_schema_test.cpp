// JSON Schema → GBNF: each supported keyword accepts a valid instance byte by
// byte and rejects an invalid one; unsupported keywords are errors naming them.
#include "structured/json_schema.h"

#include <gtest/gtest.h>

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

TEST(JsonSchema, NumberBounds) {
  run_cases({
      {R"({"type":"number","minimum":0,"maximum":10})",
       {"0", "0.5", "9.99", "10", "10.000"},
       {"-0.5", "10.01", "11", "-1"}},
      {R"({"type":"number","minimum":-5,"maximum":-2})", {"-5", "-2", "-3.5", "-2.0"}, {"-5.1", "-1.9", "0", "2"}},
      {R"({"type":"number","minimum":1})", {"1", "1234.5"}, {"0.99", "-3"}},
  });
  auto e = json_schema_to_gbnf(R"({"type":"number","minimum":0.5})");
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("only integral bounds"), std::string::npos) << e.error().message;
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
  EXPECT_EQ(err(R"({"type":"number","multipleOf":2})"), "json_schema: unsupported keyword 'multipleOf' at /");
  EXPECT_EQ(err(R"({"not":{"type":"string"}})"), "json_schema: unsupported keyword 'not' at /");
  EXPECT_EQ(err(R"({"type":"string","format":"hostname"})"), "json_schema: unsupported format 'hostname' at /");
  EXPECT_EQ(err(R"({"type":"string","maxLength":3,"minimum":2})"),
            "json_schema: unsupported keyword 'minimum' for type string at /");
  EXPECT_EQ(err(R"({"$ref":"http://x/y.json"})"),
            "json_schema: $ref 'http://x/y.json' at /: only references into the same document "
            "(#...) are supported");
  EXPECT_EQ(err(R"({"$ref":"#/$defs/missing"})"), "json_schema: $ref '#/$defs/missing' at / does not resolve");
  EXPECT_EQ(err(R"({"type":"string","pattern":"^(a)\\1$"})"),
            "json_schema: unsupported pattern at /pattern: escape '\\1' (backreferences, \\b, \\p, "
            "\\u are not supported) (at offset 6)");
  EXPECT_EQ(err(R"({"type":"string","pattern":"^(?=a)b$"})"),
            "json_schema: unsupported pattern at /pattern: lookaround / group flags '(?=' (at offset 2)");
  EXPECT_EQ(err(R"({"type":"wat"})"), "json_schema: unknown type 'wat' at /");
  EXPECT_EQ(err("{"), "json_schema: not valid JSON");
  // Annotations are ignored.
  EXPECT_EQ(
      err(R"({"title":"t","description":"d","examples":[1],"default":1,"$schema":"x","$id":"y","$comment":"c","type":"integer"})"),
      "<no error>");
}

}  // namespace
}  // namespace bonsai::structured
