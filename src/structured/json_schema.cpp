// JSON Schema → GBNF. See json_schema.h. Written from the JSON Schema 2020-12
// specification; the whitespace / number bounds follow llama.cpp's choices.
#include "structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "structured/regular.h"  // Dfa: pattern / format / length / number automata

namespace bonsai::structured {

namespace {

using Json = nlohmann::ordered_json;

struct SchemaError {
  std::string message;
};

[[noreturn]] void fail(const std::string& msg) { throw SchemaError{"json_schema: " + msg}; }

std::string at_path(const std::string& path) { return path.empty() ? "/" : path; }

const std::set<std::string> kKeywords = {"type",
                                         "properties",
                                         "required",
                                         "additionalProperties",
                                         "items",
                                         "minItems",
                                         "maxItems",
                                         "enum",
                                         "const",
                                         "anyOf",
                                         "oneOf",
                                         "allOf",
                                         "$ref",
                                         "$defs",
                                         "definitions",
                                         "minimum",
                                         "maximum",
                                         "exclusiveMinimum",
                                         "exclusiveMaximum",
                                         "minLength",
                                         "maxLength",
                                         "format",
                                         "pattern",
                                         "multipleOf"};
const std::set<std::string> kAnnotations = {"title", "description", "examples",   "default",  "$schema",
                                            "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};

// The shared primitive rules (emitted only when used).
const std::map<std::string, std::string> kPrimitives = {
    {"ws", "( \" \" | \"\\n\" [ \\t]{0,20} )?"},
    {"value", "object | array | string | number | boolean | null"},
    {"object", "\"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\""},
    {"array", "\"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\""},
    {"string", "\"\\\"\" char* \"\\\"\""},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )"},
    {"strchar", "[^\"\\\\\\x7F\\x00-\\x1F]"},
    {"integral", "\"0\" | [1-9] [0-9]{0,15}"},
    {"number",
     "\"-\"? integral ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?"},  // exponent <= 99: finite as a double
    {"integer", "\"-\"? integral"},
    {"boolean", "\"true\" | \"false\""},
    {"null", "\"null\""},
};
// Which primitives each primitive uses.
const std::map<std::string, std::vector<std::string>> kPrimitiveDeps = {
    {"value", {"object", "array", "string", "number", "boolean", "null"}},
    {"object", {"ws", "string", "value"}},
    {"array", {"ws", "value"}},
    {"string", {"char"}},
    {"number", {"integral"}},
    {"integer", {"integral"}},
};

// A GBNF string literal for raw UTF-8 `s`.
std::string lit(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7F) {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string cp_escape(uint32_t cp) {
  char buf[16];
  if (cp < 0x10000) {
    std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  } else {
    std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  }
  return buf;
}

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}
Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}
// Characters a pattern/format string may contain unescaped in JSON.
Ranges intersect_strchar(const Ranges& r) {
  const Ranges allowed = complement({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}});
  Ranges out;
  for (auto a : normalize(r)) {
    for (auto b : allowed) {
      uint32_t lo = std::max(a.first, b.first), hi = std::min(a.second, b.second);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  }
  return normalize(out);
}
std::string class_text(const Ranges& r) {
  std::string out = "[";
  for (auto [lo, hi] : r) {
    out += cp_escape(lo);
    if (hi != lo) {
      out += '-';
      out += cp_escape(hi);
    }
  }
  out += ']';
  return out;
}

// ---- integer ranges ----------------------------------------------------------

std::string digit_class(int lo, int hi) {
  if (lo == hi) return "\"" + std::to_string(lo) + "\"";
  return "[" + std::to_string(lo) + "-" + std::to_string(hi) + "]";
}

// Equal-length digit strings lo <= hi (leading zeros allowed inside).
std::string same_len(const std::string& lo, const std::string& hi) {
  const size_t n = lo.size();
  if (n == 1) return digit_class(lo[0] - '0', hi[0] - '0');
  if (lo[0] == hi[0]) return "\"" + std::string(1, lo[0]) + "\" " + same_len(lo.substr(1), hi.substr(1));
  const std::string rl = lo.substr(1), rh = hi.substr(1);
  const bool lo_zero = rl.find_first_not_of('0') == std::string::npos;
  const bool hi_nine = rh.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> alts;
  if (!lo_zero) alts.push_back("\"" + std::string(1, lo[0]) + "\" " + same_len(rl, std::string(n - 1, '9')));
  int s = lo[0] - '0' + (lo_zero ? 0 : 1), e = hi[0] - '0' - (hi_nine ? 0 : 1);
  if (s <= e) alts.push_back(digit_class(s, e) + " [0-9]{" + std::to_string(n - 1) + "}");
  if (!hi_nine) alts.push_back("\"" + std::string(1, hi[0]) + "\" " + same_len(std::string(n - 1, '0'), rh));
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
  return out + " )";
}

constexpr int kMaxDigits = 16;
uint64_t pow10(int n) {
  uint64_t v = 1;
  while (n-- > 0) v *= 10;
  return v;
}
int ndigits(uint64_t v) { return v < 10 ? 1 : 1 + ndigits(v / 10); }

// Non-negative integers in [a, b] without leading zeros; b empty = unbounded
// (up to 16 digits).
std::string uint_range(uint64_t a, std::optional<uint64_t> b) {
  std::vector<std::string> alts;
  const int la = ndigits(a);
  const int lb = b ? ndigits(*b) : kMaxDigits;
  for (int len = la; len <= lb; ++len) {
    uint64_t lo = std::max<uint64_t>(a, len == 1 ? 0 : pow10(len - 1));
    uint64_t hi = (b && len == lb) ? *b : pow10(len) - 1;
    if (!b && len > la) {
      // Every number of length la+1 .. 16: one alternative.
      alts.push_back("[1-9] [0-9]{" + std::to_string(len - 1) + "," + std::to_string(kMaxDigits - 1) + "}");
      break;
    }
    if (lo > hi) continue;
    alts.push_back(same_len(std::to_string(lo), std::to_string(hi)));
  }
  if (alts.empty()) fail("empty integer range");
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
  return out + " )";
}

constexpr int64_t kMaxMagnitude = 9999999999999999;  // 16 digits

// Integers in [lo, hi] (either side optional).
std::string int_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) fail("integer range is empty (minimum > maximum)");
  std::vector<std::string> alts;
  if (!hi || *hi >= 0) {
    uint64_t a = lo ? static_cast<uint64_t>(std::max<int64_t>(*lo, 0)) : 0;
    alts.push_back(uint_range(a, hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt));
  }
  if (!lo || *lo < 0) {
    uint64_t a = (hi && *hi < 0) ? static_cast<uint64_t>(-*hi) : 1;
    std::optional<uint64_t> b;
    if (lo) b = static_cast<uint64_t>(-*lo);
    alts.push_back("\"-\" " + uint_range(a, b));
  }
  return alts.size() == 1 ? alts[0] : "( " + alts[0] + " | " + alts[1] + " )";
}

// ---- literal alternations (enum, const branches) ---------------------------------

// One node of a trie over UTF-8 characters (a character is never split).
struct LitNode {
  bool end = false;                     // a literal ends here
  std::map<std::string, LitNode> kids;  // next character -> subtree
};

// The alternatives below `n`: each child's run of single-child characters
// as one literal, then its own alternatives (optional where a literal ends).
std::string trie_alternatives(const LitNode& n) {
  std::string out;
  for (const auto& [ch, child] : n.kids) {
    std::string run = ch;
    const LitNode* c = &child;
    while (!c->end && c->kids.size() == 1) {
      run += c->kids.begin()->first;
      c = &c->kids.begin()->second;
    }
    if (!out.empty()) out += " | ";
    out += lit(run);
    if (!c->kids.empty()) out += " (" + trie_alternatives(*c) + (c->end ? ")?" : ")");
  }
  return out;
}

// A GBNF expression matching exactly the given byte strings (UTF-8 JSON
// texts), written as a prefix tree: the matcher keeps one parse stack per
// distinct next character instead of one per value, so enums of thousands
// of values stay within GrammarLimits::max_stacks (a flat alternation of
// 2,049 values needed 2,049 stacks at its first byte and was refused).
std::string literal_alternation(const std::vector<std::string>& values) {
  LitNode root;
  for (const std::string& v : values) {
    LitNode* n = &root;
    for (size_t i = 0; i < v.size();) {
      const auto b = static_cast<unsigned char>(v[i]);
      size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
      len = std::min(len, v.size() - i);
      n = &n->kids[v.substr(i, len)];
      i += len;
    }
    n->end = true;
  }
  if (root.end) return root.kids.empty() ? "\"\"" : "(" + trie_alternatives(root) + ")?";
  return "(" + trie_alternatives(root) + ")";
}

// The JSON texts a schema that is only `const` or `enum` (plus `type` and
// annotations) allows; nullopt for any other schema.
std::optional<std::vector<std::string>> literal_values(const Json& s) {
  if (!s.is_object() || (s.contains("const") == s.contains("enum"))) return std::nullopt;
  for (const auto& [k, v] : s.items()) {
    if (k != "const" && k != "enum" && k != "type" && !kAnnotations.count(k)) return std::nullopt;
  }
  std::vector<std::string> out;
  if (s.contains("const")) {
    out.push_back(s["const"].dump());
  } else {
    if (!s["enum"].is_array() || s["enum"].empty()) return std::nullopt;
    for (const auto& v : s["enum"]) out.push_back(v.dump());
  }
  return out;
}

// ---- the converter -------------------------------------------------------------

class Converter {
 public:
  explicit Converter(const Json& doc) : doc_(doc) {}

  std::string run() {
    std::string root = gen(doc_, "");
    std::string out = "root ::= " + root + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    std::set<std::string> emitted;
    std::vector<std::string> todo(used_.begin(), used_.end());
    while (!todo.empty()) {
      std::string p = todo.back();
      todo.pop_back();
      if (!emitted.insert(p).second) continue;
      out += p + " ::= " + kPrimitives.at(p) + "\n";
      if (auto it = kPrimitiveDeps.find(p); it != kPrimitiveDeps.end()) {
        todo.insert(todo.end(), it->second.begin(), it->second.end());
      }
    }
    return out;
  }

 private:
  std::string use(const std::string& prim) {
    used_.insert(prim);
    return prim;
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    std::string name = new_name(hint);
    rules_.emplace_back(name, body);
    return name;
  }
  std::string new_name(const std::string& hint) {
    std::string clean;
    for (char c : hint) clean += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
    if (clean.empty()) clean = "s";
    if (clean.size() > 40) clean.resize(40);
    return "s" + std::to_string(counter_++) + "-" + clean;
  }

  const Json& resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') {
      fail("$ref '" + ref + "' at " + at_path(path) + ": only references into the same document (#...) are supported");
    }
    try {
      if (ref == "#") return doc_;
      return doc_.at(Json::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      fail("$ref '" + ref + "' at " + at_path(path) + " does not resolve");
    }
  }

  static std::optional<double> num(const Json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number())
      fail(std::string("'") + key + "' at " + at_path(path) +
           " must be a number (draft-4 boolean form is unsupported)");
    return s[key].get<double>();
  }
  static std::optional<uint32_t> count(const Json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number_unsigned() && !(s[key].is_number_integer() && s[key].get<int64_t>() >= 0)) {
      fail(std::string("'") + key + "' at " + at_path(path) + " must be a non-negative integer");
    }
    uint64_t v = s[key].get<uint64_t>();
    if (v > 10000) fail(std::string("'") + key + "' at " + at_path(path) + " above 10000 is unsupported");
    return static_cast<uint32_t>(v);
  }

  std::string gen(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return use("value");
      fail("schema 'false' at " + at_path(path) + " can never match");
    }
    if (!s.is_object()) fail("schema at " + at_path(path) + " must be an object or boolean");
    for (const auto& [k, v] : s.items()) {
      if (!kKeywords.count(k) && !kAnnotations.count(k)) {
        fail("unsupported keyword '" + k + "' at " + at_path(path));
      }
    }
    auto only = [&](std::initializer_list<const char*> allowed, const char* what) {
      for (const auto& [k, v] : s.items()) {
        if (kAnnotations.count(k) || k == "$defs" || k == "definitions") continue;
        if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) == allowed.end()) {
          fail("unsupported keyword '" + k + "' next to '" + what + "' at " + at_path(path));
        }
      }
    };
    if (s.contains("$ref")) {
      only({"$ref"}, "$ref");
      const std::string ref = s["$ref"].get<std::string>();
      if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
      std::string name = new_name("ref-" + ref.substr(ref.rfind('/') == std::string::npos ? 0 : ref.rfind('/') + 1));
      refs_[ref] = name;
      size_t slot = rules_.size();
      rules_.emplace_back(name, "");
      std::string body = gen(resolve(ref, path), ref.substr(1));
      rules_[slot].second = body;
      return name;
    }
    if (s.contains("const")) {
      only({"const", "type"}, "const");
      return lit(s["const"].dump());
    }
    if (s.contains("enum")) {
      only({"enum", "type"}, "enum");
      if (!s["enum"].is_array() || s["enum"].empty()) fail("'enum' at " + at_path(path) + " must be a non-empty array");
      std::vector<std::string> values;
      for (const auto& v : s["enum"]) values.push_back(v.dump());
      return literal_alternation(values);
    }
    for (const char* comb : {"anyOf", "oneOf"}) {
      if (!s.contains(comb)) continue;
      only({comb}, comb);
      const auto& arr = s[comb];
      if (!arr.is_array() || arr.empty())
        fail(std::string("'") + comb + "' at " + at_path(path) + " must be a non-empty array");
      // Branches that are all `const` / `enum` (a common way to write an
      // enum with titles): one prefix tree, as for `enum`.
      std::vector<std::string> values;
      bool literal = true;
      for (const auto& b : arr) {
        auto v = literal_values(b);
        if (!v) {
          literal = false;
          break;
        }
        values.insert(values.end(), v->begin(), v->end());
      }
      if (literal) return literal_alternation(values);
      std::string out = "(";
      for (size_t i = 0; i < arr.size(); ++i) {
        out += (i ? " | " : " ") + gen(arr[i], path + "/" + comb + "/" + std::to_string(i));
      }
      return out + " )";
    }
    if (s.contains("allOf")) return gen(merge_all_of(s, path), path);

    if (s.contains("type") && s["type"].is_array()) {
      if (s["type"].empty()) fail("'type' at " + at_path(path) + " is an empty array");
      std::string out = "(";
      // Type-specific keywords apply to instances of their type only (JSON
      // Schema's rule), so {"type": ["string", "null"], "maxLength": 8} is a
      // short string or null: each branch keeps its own type's keywords.
      static const std::map<std::string, std::vector<std::string>> kTypeKeywords = {
          {"string", {"minLength", "maxLength", "pattern", "format"}},
          {"integer", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
          {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
          {"array", {"items", "minItems", "maxItems"}},
          {"object", {"properties", "required", "additionalProperties"}},
      };
      for (size_t i = 0; i < s["type"].size(); ++i) {
        Json sub = s;
        sub["type"] = s["type"][i];
        const std::string t = s["type"][i].is_string() ? s["type"][i].get<std::string>() : std::string();
        const auto mine = kTypeKeywords.find(t);
        for (const auto& entry : kTypeKeywords) {
          for (const auto& k : entry.second) {
            const bool kept = mine != kTypeKeywords.end() &&
                              std::find(mine->second.begin(), mine->second.end(), k) != mine->second.end();
            if (!kept) sub.erase(k);
          }
        }
        out += (i ? " | " : " ") + gen(sub, path);
      }
      return out + " )";
    }
    std::string type;
    if (s.contains("type")) {
      if (!s["type"].is_string()) fail("'type' at " + at_path(path) + " must be a string or array");
      type = s["type"].get<std::string>();
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      type = "object";
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      type = "array";
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || s.contains("format")) {
      type = "string";
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum") || s.contains("multipleOf")) {
      type = "number";
    } else {
      return use("value");
    }
    if (type == "object") return gen_object(s, path);
    if (type == "array") return gen_array(s, path);
    if (type == "string") return gen_string(s, path);
    if (type == "integer") return gen_integer(s, path);
    if (type == "number") return gen_number(s, path);
    if (type == "boolean") {
      only({"type"}, "boolean");
      return use("boolean");
    }
    if (type == "null") {
      only({"type"}, "null");
      return use("null");
    }
    fail("unknown type '" + type + "' at " + at_path(path));
  }

  Json merge_all_of(const Json& s, const std::string& path) {
    Json merged = Json::object();
    merged["type"] = "object";
    Json props = Json::object();
    std::vector<std::string> required;
    std::optional<Json> additional;
    std::vector<std::pair<Json, std::string>> parts;
    Json self = s;
    self.erase("allOf");
    parts.emplace_back(self, path);
    const auto& arr = s["allOf"];
    if (!arr.is_array() || arr.empty()) fail("'allOf' at " + at_path(path) + " must be a non-empty array");
    for (size_t i = 0; i < arr.size(); ++i) parts.emplace_back(arr[i], path + "/allOf/" + std::to_string(i));
    for (size_t i = 0; i < parts.size(); ++i) {
      Json part = parts[i].first;
      std::string ppath = parts[i].second;
      while (part.is_object() && part.contains("$ref")) {
        std::string ref = part["$ref"].get<std::string>();
        part = resolve(ref, ppath);
        ppath = ref.substr(1);
      }
      if (!part.is_object()) fail("allOf member at " + at_path(ppath) + " must be an object schema");
      if (part.contains("allOf") && i > 0) {
        for (size_t j = 0; j < part["allOf"].size(); ++j)
          parts.emplace_back(part["allOf"][j], ppath + "/allOf/" + std::to_string(j));
        part.erase("allOf");
      }
      for (const auto& [k, v] : part.items()) {
        if (kAnnotations.count(k) || k == "$defs" || k == "definitions") continue;
        if (k == "type") {
          if (v != "object")
            fail("allOf at " + at_path(path) + " merges only object schemas (member at " + at_path(ppath) +
                 " has type " + v.dump() + ")");
        } else if (k == "properties") {
          for (const auto& [pk, pv] : v.items()) {
            if (props.contains(pk))
              fail("allOf at " + at_path(path) + ": property '" + pk + "' defined twice (intersection unsupported)");
            props[pk] = pv;
          }
        } else if (k == "required") {
          for (const auto& r : v) required.push_back(r.get<std::string>());
        } else if (k == "additionalProperties") {
          additional = v;
        } else {
          fail("unsupported keyword '" + k + "' in allOf member at " + at_path(ppath) +
               " (only object schemas are merged)");
        }
      }
    }
    merged["properties"] = props;
    merged["required"] = required;
    if (additional) merged["additionalProperties"] = *additional;
    return merged;
  }

  std::string gen_object(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k) || k == "$defs" || k == "definitions") continue;
      if (k != "type" && k != "properties" && k != "required" && k != "additionalProperties") {
        fail("unsupported keyword '" + k + "' for type object at " + at_path(path));
      }
    }
    std::vector<std::pair<std::string, std::string>> props;  // key, value expr
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail("'required' at " + at_path(path) + " must be an array");
      for (const auto& r : s["required"]) required.insert(r.get<std::string>());
    }
    std::vector<bool> is_req;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) fail("'properties' at " + at_path(path) + " must be an object");
      for (const auto& [k, v] : s["properties"].items()) {
        props.emplace_back(k, gen(v, path + "/properties/" + k));
        is_req.push_back(required.count(k) > 0);
      }
    }
    for (const auto& r : required) {
      if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; })) {
        props.emplace_back(r, use("value"));
        is_req.push_back(true);
      }
    }
    std::string extra;  // key-value rule for additional properties, if allowed
    if (s.contains("additionalProperties")) {
      const auto& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) {
        std::string val = gen(ap, path + "/additionalProperties");
        std::vector<std::string> names;
        for (const auto& pr : props) names.push_back(pr.first);
        extra = add_rule("extra-kv", extra_key(names) + " ws \":\" ws " + val);
      }
    }
    use("ws");
    std::vector<std::string> kv;
    for (const auto& [k, v] : props) kv.push_back(lit(Json(k).dump()) + " ws \":\" ws " + v + " ws");
    const size_t n = props.size();
    // after[k]: something already emitted; first[k]: nothing emitted yet.
    std::vector<std::string> after(n + 1), first(n + 1);
    after[n] = extra.empty() ? "" : "( \",\" ws " + extra + " ws )*";
    first[n] = extra.empty() ? "" : "( " + extra + " ws ( \",\" ws " + extra + " ws )* )?";
    for (size_t k = n; k-- > 0;) {
      std::string a =
          is_req[k] ? "\",\" ws " + kv[k] + " " + after[k + 1] : "( \",\" ws " + kv[k] + " )? " + after[k + 1];
      after[k] = add_rule("after", a.empty() ? "\"\"" : a);
      std::string f =
          is_req[k] ? kv[k] + " " + after[k + 1]
                    : "( " + kv[k] + " " + after[k + 1] + " )" + (first[k + 1].empty() ? "?" : " | " + first[k + 1]);
      first[k] = add_rule("first", f);
    }
    return add_rule("obj" + path, "\"{\" ws " + (first[0].empty() ? std::string() : first[0] + " ") + "\"}\"");
  }

  // An additional property name: a JSON string of unescaped characters that
  // differs from every declared name (a trie over the names' code points:
  // leave it at any node by a character no name continues with, or end at a
  // node that is not a whole name). Names needing escapes can never be
  // produced unescaped, so they need no exclusion.
  std::string extra_key(const std::vector<std::string>& names) {
    use("strchar");
    struct Node {
      std::map<uint32_t, size_t> kids;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    const Ranges plain = intersect_strchar({{0, 0x10FFFF}});
    auto in_plain = [&](uint32_t c) {
      for (auto [lo, hi] : plain)
        if (c >= lo && c <= hi) return true;
      return false;
    };
    for (const auto& name : names) {
      std::vector<uint32_t> cps;
      bool ok = true;
      for (size_t i = 0; i < name.size() && ok;) {
        auto b = static_cast<unsigned char>(name[i]);
        int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + static_cast<size_t>(len) > name.size()) {
          ok = false;
          break;
        }
        uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
        for (int k = 1; k < len; ++k)
          cp = (cp << 6) | (static_cast<unsigned char>(name[i + static_cast<size_t>(k)]) & 0x3F);
        i += static_cast<size_t>(len);
        ok = in_plain(cp);
        cps.push_back(cp);
      }
      if (!ok) continue;
      size_t at = 0;
      for (uint32_t cp : cps) {
        auto it = trie[at].kids.find(cp);
        if (it == trie[at].kids.end()) {
          trie.push_back({});
          it = trie[at].kids.emplace(cp, trie.size() - 1).first;
        }
        at = it->second;
      }
      trie[at].terminal = true;
    }
    if (trie.size() == 1 && !trie[0].terminal) return "\"\\\"\" strchar* \"\\\"\"";
    std::function<std::string(size_t)> rule = [&](size_t n) -> std::string {
      std::vector<std::string> alts;
      if (!trie[n].terminal) alts.push_back("\"\\\"\"");
      Ranges taken;
      for (const auto& [cp, child] : trie[n].kids) {
        taken.emplace_back(cp, cp);
        alts.push_back(class_text({{cp, cp}}) + " " + rule(child));
      }
      Ranges other = intersect_strchar(complement(taken));
      if (!other.empty()) alts.push_back(class_text(other) + " strchar* \"\\\"\"");
      std::string body;
      for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
      return add_rule("key", body);
    };
    return "\"\\\"\" " + rule(0);
  }

  std::string gen_array(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k) || k == "$defs" || k == "definitions") continue;
      if (k != "type" && k != "items" && k != "minItems" && k != "maxItems") {
        fail("unsupported keyword '" + k + "' for type array at " + at_path(path));
      }
    }
    std::string item = s.contains("items") ? gen(s["items"], path + "/items") : use("value");
    uint32_t min = count(s, "minItems", path).value_or(0);
    std::optional<uint32_t> max = count(s, "maxItems", path);
    if (max && *max < min) fail("maxItems < minItems at " + at_path(path));
    use("ws");
    std::string body;
    if (max && *max == 0) {
      body = "\"[\" ws \"]\"";
    } else {
      std::string rest = "( \",\" ws " + item + " ws ){" + std::to_string(min == 0 ? 0 : min - 1) + "," +
                         (max ? std::to_string(*max - 1) : std::string()) + "}";
      std::string list = item + " ws " + rest;
      body = "\"[\" ws " + (min == 0 ? "( " + list + " )?" : list) + " \"]\"";
    }
    return add_rule("arr" + path, body);
  }

  std::string gen_string(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k) || k == "$defs" || k == "definitions") continue;
      if (k != "type" && k != "minLength" && k != "maxLength" && k != "format" && k != "pattern") {
        fail("unsupported keyword '" + k + "' for type string at " + at_path(path));
      }
    }
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    uint32_t min = count(s, "minLength", path).value_or(0);
    std::optional<uint32_t> max = count(s, "maxLength", path);
    if (max && *max < min) fail("maxLength < minLength at " + at_path(path));
    if (!s.contains("pattern") && !s.contains("format")) {
      if (!has_len) return use("string");
      use("char");
      return add_rule("str",
                      "\"\\\"\" char{" + std::to_string(min) + "," + (max ? std::to_string(*max) : "") + "} \"\\\"\"");
    }
    // pattern ∩ format ∩ length: each a DFA over code points, intersected.
    std::optional<Dfa> lang;
    std::string what;
    auto meet = [&](Dfa d, const std::string& name) {
      if (lang) {
        auto both = dfa_intersect(*lang, d);
        if (!both) fail(what + " and " + name + " at " + at_path(path) + ": " + both.error().message);
        lang = std::move(*both);
        what += " and " + name;
      } else {
        lang = std::move(d);
        what = name;
      }
    };
    if (s.contains("format")) {
      if (!s["format"].is_string()) fail("'format' at " + at_path(path) + " must be a string");
      const std::string f = s["format"].get<std::string>();
      meet(format_dfa(f, path), "format '" + f + "'");
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail("'pattern' at " + at_path(path) + " must be a string");
      auto d = regex_to_dfa(s["pattern"].get<std::string>(), lang ? &*lang : nullptr);
      if (!d) fail("unsupported pattern at " + at_path(path + "/pattern") + ": " + d.error().message);
      meet(std::move(*d), "pattern");
    }
    if (has_len) meet(length_dfa(min, max), "minLength/maxLength");
    if (dfa_empty(*lang)) fail(what + " at " + at_path(path) + " admit no string");
    const std::string start = dfa_to_gbnf(*lang, new_name("str"), DfaText::kJsonString, rules_);
    return add_rule("str", "\"\\\"\" " + start + " \"\\\"\"");
  }

  // The language of a `format` (JSON Schema 2020-12 §7.3), as an ECMAScript
  // regex: exactly the strings the format's RFC allows where that is
  // regular and small (date: RFC 3339 full-date with the real calendar, leap
  // years included; time: RFC 3339 full-time with an offset, at most 6
  // fraction digits; ipv4: dotted quad 0-255; ipv6: RFC 4291 §2.2 forms 1
  // and 2, without an embedded IPv4), otherwise a bounded subset every
  // validator accepts (email: dot-atoms of [A-Za-z0-9_+-], at most 3 atoms of
  // 16 characters, @, 1-3 labels of at most 16 characters, a letters-only TLD
  // of 2-12 — also inside zod's email regex; uuid: RFC 9562 versions 1-8 and
  // variant 10x, which zod's uuid() checks; uri: scheme://host[:port][/path]
  // [?query][#fragment] of unreserved characters, a TLD starting with a
  // letter (WHATWG's URL parser reads an all-digit last label as IPv4);
  // hostname: 1-4 labels of at most 22 characters (RFC 1123)).
  Dfa format_dfa(const std::string& f, const std::string& path) {
    static const std::string date =
        "(?:\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)"
        "|02-(?:0[1-9]|1\\d|2[0-8]))|(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
        "-02-29)";
    static const std::string time =
        "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
    static const std::string octet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    static const std::string h = "[0-9a-fA-F]{1,4}";
    static const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,20}[A-Za-z0-9])?";
    static const std::map<std::string, std::string> kFormats = {
        {"date", date},
        {"time", time},
        {"date-time", date + "T" + time},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}"},
        {"email",
         "[A-Za-z0-9_+-]{1,16}(?:\\.[A-Za-z0-9_+-]{1,16}){0,2}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,14}[A-Za-z0-9])?\\.)"
         "{1,3}[A-Za-z]{2,12}"},
        {"uri",
         "[a-z][a-z0-9+.-]{0,9}://(?:[a-z0-9]{1,16}\\.){0,3}[a-z][a-z0-9]{0,9}(?::[1-9]\\d{0,3})?"
         "(?:/[A-Za-z0-9._~-]{0,16}){0,4}(?:\\?[A-Za-z0-9._~=&-]{0,24})?(?:#[A-Za-z0-9._~-]{0,16})?"},
        {"ipv4", "(?:" + octet + "\\.){3}" + octet},
        {"ipv6", "(?:" + h + ":){7}" + h + "|(?:" + h + ":){1,7}:|(?:" + h + ":){1,6}:" + h + "|(?:" + h +
                     ":){1,5}(?::" + h + "){1,2}|(?:" + h + ":){1,4}(?::" + h + "){1,3}|(?:" + h + ":){1,3}(?::" + h +
                     "){1,4}|(?:" + h + ":){1,2}(?::" + h + "){1,5}|" + h + ":(?::" + h + "){1,6}|:(?:(?::" + h +
                     "){1,7}|:)"},
        {"hostname", label + "(?:\\." + label + "){0,3}"},
    };
    auto it = kFormats.find(f);
    if (it == kFormats.end()) {
      std::string known;
      for (const auto& [k, v] : kFormats) known += (known.empty() ? "" : ", ") + k;
      fail("unsupported format '" + f + "' at " + at_path(path) + " (supported: " + known + ")");
    }
    static std::map<std::string, Dfa> cache;  // built once per format (read-only afterwards)
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    auto c = cache.find(f);
    if (c == cache.end()) {
      auto d = regex_to_dfa("^(?:" + it->second + ")$");
      if (!d) fail("format '" + f + "': " + d.error().message);  // a bug in the table above
      c = cache.emplace(f, std::move(*d)).first;
    }
    return c->second;
  }

  // A bound keyword as (negative, magnitude); nullopt when absent.
  static std::optional<std::pair<bool, Decimal>> decimal(const Json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number())
      fail(std::string("'") + key + "' at " + at_path(path) +
           " must be a number (draft-4 boolean form is unsupported)");
    auto d = parse_decimal(s[key].dump());
    if (!d) fail(std::string("'") + key + "' at " + at_path(path) + " is out of range");
    return d;
  }

  // Numbers (integers when `integer`) meeting every bound and multipleOf, as
  // one DFA over the number's text (no exponent; at most 15 digits in all,
  // DBL_DIG: a validator that reads the value as an IEEE double — JavaScript,
  // Python — then compares and divides exactly as the decimal text does, so
  // 2.4999999999999999 never rounds onto an exclusive bound 2.5):
  // non-negative texts and '-' texts are built apart, each the intersection
  // of digit-by-digit comparisons with the bounds.
  std::string bounded_number(const Json& s, const std::string& path, bool integer) {
    const uint32_t frac = integer ? 0 : kMaxDigits;
    const Decimal zero;
    constexpr uint32_t kSignificant = 15;
    std::optional<Dfa> pos = magnitude_dfa(Cmp::kAny, zero, kMaxDigits, frac, kSignificant);
    std::optional<Dfa> neg = pos;
    auto meet = [&](std::optional<Dfa>& side, Cmp op, const Decimal& m) {
      if (!side) return;
      auto d = dfa_intersect(*side, magnitude_dfa(op, m, kMaxDigits, frac, kSignificant));
      if (!d) fail("bounds at " + at_path(path) + ": " + d.error().message);
      side = std::move(*d);
    };
    // value >= v (or >): non-negative texts need magnitude >= v when v >= 0;
    // '-' texts need magnitude <= -v, impossible when v > 0.
    for (const auto& [key, exclusive, lower] :
         {std::tuple{"minimum", false, true}, std::tuple{"exclusiveMinimum", true, true},
          std::tuple{"maximum", false, false}, std::tuple{"exclusiveMaximum", true, false}}) {
      auto b = decimal(s, key, path);
      if (!b) continue;
      const bool below_zero = b->first && !b->second.is_zero();
      const bool above_zero = !b->first && !b->second.is_zero();
      if (lower) {
        if (!below_zero) meet(pos, exclusive ? Cmp::kGt : Cmp::kGe, b->second);
        if (above_zero)
          neg.reset();
        else
          meet(neg, exclusive ? Cmp::kLt : Cmp::kLe, b->second);
      } else {
        if (!above_zero) meet(neg, exclusive ? Cmp::kGt : Cmp::kGe, b->second);
        if (below_zero)
          pos.reset();
        else
          meet(pos, exclusive ? Cmp::kLt : Cmp::kLe, b->second);
      }
    }
    if (auto m = decimal(s, "multipleOf", path)) {
      if (m->first || m->second.is_zero()) fail("'multipleOf' at " + at_path(path) + " must be greater than 0");
      std::string digits = m->second.int_digits + m->second.frac_digits;
      digits.erase(0, digits.find_first_not_of('0'));
      const auto d = static_cast<uint32_t>(m->second.frac_digits.size());
      const uint64_t p = digits.size() > 6 ? UINT64_MAX : std::stoull(digits);
      if (p == UINT64_MAX || p * (d + 1) > kMaxMultipleStates) {
        fail("'multipleOf' " + s["multipleOf"].dump() + " at " + at_path(path) +
             " is unsupported: its remainder automaton needs more than " + std::to_string(kMaxMultipleStates) +
             " states (digits of multipleOf x (fraction digits + 1) must be at most that)");
      }
      const Dfa mult = multiple_of_dfa(static_cast<uint32_t>(p), d);
      for (auto* side : {&pos, &neg}) {
        if (!*side) continue;
        auto r = dfa_intersect(**side, mult);
        if (!r) fail("multipleOf at " + at_path(path) + ": " + r.error().message);
        *side = std::move(*r);
      }
    }
    if (pos && dfa_empty(*pos)) pos.reset();
    if (neg && dfa_empty(*neg)) neg.reset();
    if (!pos && !neg) fail("the bounds at " + at_path(path) + " admit no " + (integer ? "integer" : "number"));
    Dfa all = pos ? *pos : dfa_prefixed("-", *neg);
    if (pos && neg) {
      auto u = dfa_union(*pos, dfa_prefixed("-", *neg));
      if (!u) fail("bounds at " + at_path(path) + ": " + u.error().message);
      all = std::move(*u);
    }
    return dfa_to_gbnf(all, new_name(integer ? "int" : "num"), DfaText::kRaw, rules_);
  }

  std::optional<int64_t> int_bound(const Json& s, const std::string& path, bool lower) {
    std::optional<double> inc = num(s, lower ? "minimum" : "maximum", path);
    std::optional<double> exc = num(s, lower ? "exclusiveMinimum" : "exclusiveMaximum", path);
    std::optional<int64_t> b;
    auto clamp = [](double v) {
      return static_cast<int64_t>(std::clamp(v, -double(kMaxMagnitude), double(kMaxMagnitude)));
    };
    if (inc) b = clamp(lower ? std::ceil(*inc) : std::floor(*inc));
    if (exc) {
      int64_t e = clamp(lower ? std::floor(*exc) + 1 : std::ceil(*exc) - 1);
      b = b ? (lower ? std::max(*b, e) : std::min(*b, e)) : e;
    }
    return b;
  }

  std::string gen_integer(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k) || k == "$defs" || k == "definitions") continue;
      if (k != "type" && k != "minimum" && k != "maximum" && k != "exclusiveMinimum" && k != "exclusiveMaximum" &&
          k != "multipleOf") {
        fail("unsupported keyword '" + k + "' for type integer at " + at_path(path));
      }
    }
    if (s.contains("multipleOf")) return bounded_number(s, path, true);
    auto lo = int_bound(s, path, true), hi = int_bound(s, path, false);
    if (!lo && !hi) return use("integer");
    return add_rule("int", int_range(lo, hi));
  }

  std::string gen_number(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k) || k == "$defs" || k == "definitions") continue;
      if (k != "type" && k != "minimum" && k != "maximum" && k != "exclusiveMinimum" && k != "exclusiveMaximum" &&
          k != "multipleOf") {
        fail("unsupported keyword '" + k + "' for type number at " + at_path(path));
      }
    }
    if (!s.contains("minimum") && !s.contains("maximum") && !s.contains("exclusiveMinimum") &&
        !s.contains("exclusiveMaximum") && !s.contains("multipleOf")) {
      return use("number");
    }
    return bounded_number(s, path, false);
  }

  const Json& doc_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, std::string> refs_;
  std::set<std::string> used_;
  int counter_ = 0;
};

}  // namespace

core::Expected<std::string> json_schema_doc_to_gbnf(const nlohmann::ordered_json& schema) {
  try {
    return Converter(schema).run();
  } catch (const SchemaError& e) {
    return core::fail(core::Errc::kInvalidArgument, e.message);
  } catch (const std::exception& e) {
    return core::fail(core::Errc::kInvalidArgument, std::string("json_schema: malformed schema: ") + e.what());
  }
}

core::Expected<std::string> json_schema_to_gbnf(std::string_view schema_json) {
  Json doc = Json::parse(schema_json, nullptr, false);
  if (doc.is_discarded()) return core::fail(core::Errc::kInvalidArgument, "json_schema: not valid JSON");
  return json_schema_doc_to_gbnf(doc);
}

std::string json_object_gbnf() {
  std::string out = "root ::= object\n";
  for (const char* p : {"ws", "value", "object", "array", "string", "char", "integral", "number", "boolean", "null"}) {
    out += std::string(p) + " ::= " + kPrimitives.at(p) + "\n";
  }
  return out;
}

}  // namespace bonsai::structured
