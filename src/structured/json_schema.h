// Constrained decoding, part 2: JSON Schema (2020-12 subset) → GBNF text for
// structured::Grammar::parse.
//
// Supported: type (string or array of types), properties / required /
// additionalProperties (false, true or a schema; ABSENT = false, as
// llama.cpp's converter, which keeps grammars small), items / minItems /
// maxItems, enum, const, anyOf / oneOf (oneOf's exclusivity is not enforced),
// allOf of object schemas (properties merged, required unioned), $ref into
// the same document ("#", "#/$defs/x", "#/definitions/x", any JSON pointer;
// recursion allowed), integer / number minimum / maximum / exclusiveMinimum /
// exclusiveMaximum (any decimal value, exact: digit-by-digit comparison
// automata; bounded numbers have no exponent and at most 15 digits, so a
// double holds them for validators that compare doubles) and multipleOf (exact:
// remainder automata; digits of multipleOf x (fraction digits + 1) at most
// 10000, else an error naming the limit), string minLength / maxLength,
// format (date, time, date-time, uuid, email, uri, ipv4, ipv6, hostname; see
// format_dfa in json_schema.cpp for which are exact and which are bounded
// subsets every validator accepts) and pattern (ECMAScript regex, see
// regular.h: a missing ^ or $ means any
// characters may come before / after). Annotations (title, description, examples, default, $schema, $id, $comment,
// deprecated, readOnly, writeOnly) are ignored. Anything else is an error naming the keyword and the JSON pointer of
// the schema
// ("json_schema: unsupported keyword 'patternProperties' at /properties/x").
// pattern, format and length bounds given together are intersected (product
// automaton, at most 20000 states, else an error naming the limit); nothing
// is dropped: an empty intersection is an error too.
//
// Output shape: properties appear in the order listed in `properties`, each
// optional one may be left out; extra properties (when allowed) come after
// them, with names of unescaped characters that differ from every declared
// name. Whitespace between tokens: nothing, one
// space, or a newline followed by up to 20 spaces/tabs (llama.cpp's bound).
// Numbers: at most 16 integral digits, 16 fraction digits and a 2-digit
// exponent (so every number is a finite double); free strings
// use any JSON string character including escapes; pattern/format strings
// escape only what JSON requires (" \\ and control characters).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"  // core::Expected

namespace bonsai::structured {

// Converts a schema given as JSON text. kInvalidArgument on bad JSON, an
// unsatisfiable or malformed schema, or an unsupported keyword / construct.
core::Expected<std::string> json_schema_to_gbnf(std::string_view schema_json);
// Same, from a parsed document (ordered_json keeps the property order).
core::Expected<std::string> json_schema_doc_to_gbnf(const nlohmann::ordered_json& schema);

// Grammar for OpenAI's response_format {type: "json_object"}: any JSON object.
std::string json_object_gbnf();

}  // namespace bonsai::structured
