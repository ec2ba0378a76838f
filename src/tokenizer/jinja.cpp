// Jinja-subset interpreter: lexer → parser (AST) → tree-walking evaluator.
// See jinja.h for the supported subset, provenance tracking and bounds.
//
// Internally a failure is thrown as `Failure` and caught at the two public
// entry points (Template::parse, Template::render), which turn it into a
// core::Error: no exception leaves this file.
#include "tokenizer/jinja.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bonsai::tokenizer::jinja {

namespace {

using OJson = nlohmann::ordered_json;

// A parse or render failure at a template line (0: no line).
struct Failure {
  core::Errc code;
  int line;
  std::string message;
};

[[noreturn]] void fail_at(int line, std::string message, core::Errc code = core::Errc::kInvalidArgument) {
  throw Failure{code, line, std::move(message)};
}

// ---------------------------------------------------------------------------
// UTF-8 and Python string helpers.

size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// The code point at byte `p` (bad sequences read as one byte, U+FFFD).
char32_t decode_at(std::string_view s, size_t p, size_t* len) {
  const auto lead = static_cast<unsigned char>(s[p]);
  size_t n = utf8_len(lead);
  if (p + n > s.size()) n = 1;
  *len = n;
  if (n == 1) return lead < 0x80 ? lead : 0xFFFD;
  char32_t c = lead & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[p + k]) & 0x3F);
  return c;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Byte offsets of each code point of `s`, plus s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> off;
  for (size_t p = 0; p < s.size();) {
    off.push_back(p);
    size_t n = 0;
    decode_at(s, p, &n);
    p += n;
  }
  off.push_back(s.size());
  return off;
}

// Python's str.isspace().
bool py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python str.strip / lstrip / rstrip: `chars` null = Unicode whitespace,
// else the set of code points in it. Returns [begin, end) byte offsets.
std::pair<size_t, size_t> py_strip_range(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string set;
  if (chars) {
    for (size_t p = 0; p < chars->size();) {
      size_t n = 0;
      set.push_back(decode_at(*chars, p, &n));
      p += n;
    }
  }
  auto strippable = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_space(c); };
  const std::vector<size_t> off = code_point_offsets(s);
  size_t b = 0, e = off.size() - 1;  // code point indices
  size_t n = 0;
  if (left)
    while (b < e && strippable(decode_at(s, off[b], &n))) ++b;
  if (right)
    while (e > b && strippable(decode_at(s, off[e - 1], &n))) --e;
  return {off[b], off[e]};
}

// Python's repr(str): single quotes unless the text has ' and no ".
std::string py_repr_string(std::string_view s) {
  const char q = (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) ? '"' : '\'';
  std::string out(1, q);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(ch);
    }
  }
  out.push_back(q);
  return out;
}

// ---------------------------------------------------------------------------
// Values.

struct Value;
struct Object;
struct Stmt;
struct Expr;
using ExprP = std::unique_ptr<Expr>;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

// A macro definition (owned by the AST).
struct MacroDef {
  std::string name;
  std::vector<std::pair<std::string, const Expr*>> params;  // name, default (null: none)
  const Body* body = nullptr;
};

enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kMacro, kBuiltin };

// A Jinja value. Arrays and objects have reference semantics (shared), as
// Python lists and dicts do: `list.append` and `ns.x = ...` mutate in place.
struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;     // kString text; kBuiltin: the global function's name
  std::string mask;  // kString: empty = all template text, else per byte 1 = input text
  std::shared_ptr<std::vector<Value>> arr;
  std::shared_ptr<Object> obj;
  const MacroDef* macro = nullptr;

  static Value none() { return Value{.kind = Kind::kNone}; }
  static Value boolean(bool v) { return Value{.kind = Kind::kBool, .b = v}; }
  static Value integer(int64_t v) { return Value{.kind = Kind::kInt, .i = v}; }
  static Value number(double v) { return Value{.kind = Kind::kFloat, .f = v}; }
  static Value str(std::string text, bool input = false) {
    Value v{.kind = Kind::kString, .s = std::move(text)};
    if (input && !v.s.empty()) v.mask.assign(v.s.size(), '\1');
    return v;
  }
  static Value array(std::vector<Value> items = {}) {
    return Value{.kind = Kind::kArray, .arr = std::make_shared<std::vector<Value>>(std::move(items))};
  }
  static Value object(bool input = false, bool is_namespace = false);

  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(kind == Kind::kBool ? b : i); }
  // True when any byte of the string is input text.
  bool has_input() const { return mask.find('\1') != std::string::npos; }
};

// A dict (insertion-ordered, string keys) or a namespace() object.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool input = false;  // from the render data: its keys are input text
  bool is_namespace = false;

  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(std::string key, Value v) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(std::move(key), std::move(v));
  }
};

Value Value::object(bool input, bool is_namespace) {
  Value v{.kind = Kind::kObject, .obj = std::make_shared<Object>()};
  v.obj->input = input;
  v.obj->is_namespace = is_namespace;
  return v;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "list";
    case Kind::kObject:
      return "dict";
    case Kind::kMacro:
      return "macro";
    case Kind::kBuiltin:
      return "function";
  }
  return "?";
}

Value from_json(const OJson& j, bool input) {
  switch (j.type()) {
    case OJson::value_t::null:
      return Value::none();
    case OJson::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case OJson::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case OJson::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Value::number(static_cast<double>(u))
                                                  : Value::integer(static_cast<int64_t>(u));
    }
    case OJson::value_t::number_float:
      return Value::number(j.get<double>());
    case OJson::value_t::string:
      return Value::str(j.get<std::string>(), input);
    case OJson::value_t::array: {
      Value v = Value::array();
      v.arr->reserve(j.size());
      for (const auto& e : j) v.arr->push_back(from_json(e, input));
      return v;
    }
    case OJson::value_t::object: {
      Value v = Value::object(input);
      for (auto it = j.begin(); it != j.end(); ++it) v.obj->items.emplace_back(it.key(), from_json(it.value(), input));
      return v;
    }
    default:
      return Value::none();
  }
}

// Whether a value holds any input text (a string with input bytes, or a
// dict from the render data).
bool contains_input(const Value& v) {
  switch (v.kind) {
    case Kind::kString:
      return v.has_input();
    case Kind::kArray:
      return std::any_of(v.arr->begin(), v.arr->end(), [](const Value& e) { return contains_input(e); });
    case Kind::kObject:
      if (v.obj->input) return true;
      return std::any_of(v.obj->items.begin(), v.obj->items.end(),
                         [](const auto& kv) { return contains_input(kv.second); });
    default:
      return false;
  }
}

// Python repr() of a value inside a list / dict.
void py_repr(const Value& v, std::string& out);

// Python str() of a value: what {{ v }} prints.
std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.i);
    case Kind::kFloat:
      return python_float_repr(v.f);
    case Kind::kString:
      return v.s;
    case Kind::kMacro:
      return "<macro " + v.macro->name + ">";
    case Kind::kBuiltin:
      return "<function " + v.s + ">";
    default: {
      std::string out;
      py_repr(v, out);
      return out;
    }
  }
}

void py_repr(const Value& v, std::string& out) {
  switch (v.kind) {
    case Kind::kString:
      out += py_repr_string(v.s);
      break;
    case Kind::kArray: {
      out.push_back('[');
      for (size_t k = 0; k < v.arr->size(); ++k) {
        if (k) out += ", ";
        py_repr((*v.arr)[k], out);
      }
      out.push_back(']');
      break;
    }
    case Kind::kObject: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.obj->items) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_string(k) + ": ";
        py_repr(e, out);
      }
      out.push_back('}');
      break;
    }
    default:
      out += py_str(v);
  }
}

// json.dumps(v, ensure_ascii=False, indent=indent, separators=(item_sep,
// key_sep), sort_keys=sort_keys).
void to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys,
             int depth, std::string& out, int line) {
  const auto newline = [&](int d) {
    out.push_back('\n');
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(d), ' ');
  };
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      out += "null";
      break;
    case Kind::kBool:
      out += v.b ? "true" : "false";
      break;
    case Kind::kInt:
      out += std::to_string(v.i);
      break;
    case Kind::kFloat:
      if (!std::isfinite(v.f)) {
        out += std::isnan(v.f) ? "NaN" : (v.f < 0 ? "-Infinity" : "Infinity");
      } else {
        out += python_float_repr(v.f);
      }
      break;
    case Kind::kString:
      append_json_string(v.s, out);
      break;
    case Kind::kArray: {
      out.push_back('[');
      for (size_t k = 0; k < v.arr->size(); ++k) {
        if (k) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        to_json((*v.arr)[k], indent, item_sep, key_sep, sort_keys, depth + 1, out, line);
      }
      if (indent >= 0 && !v.arr->empty()) newline(depth);
      out.push_back(']');
      break;
    }
    case Kind::kObject: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.obj->items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        append_json_string(items[k]->first, out);
        out += key_sep;
        to_json(items[k]->second, indent, item_sep, key_sep, sort_keys, depth + 1, out, line);
      }
      if (indent >= 0 && !items.empty()) newline(depth);
      out.push_back('}');
      break;
    }
    default:
      fail_at(line, std::string("tojson: a ") + kind_name(v.kind) + " is not JSON serializable");
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.s.empty();
    case Kind::kArray:
      return !v.arr->empty();
    case Kind::kObject:
      return !v.obj->items.empty();
    default:
      return true;
  }
}

bool equal(const Value& a, const Value& b) {
  const bool an = a.is_number() || a.kind == Kind::kBool, bn = b.is_number() || b.kind == Kind::kBool;
  if (an && bn) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat)
      return (a.kind == Kind::kBool ? a.b : a.i) == (b.kind == Kind::kBool ? b.b : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.s == b.s;
    case Kind::kArray:
      if (a.arr->size() != b.arr->size()) return false;
      for (size_t k = 0; k < a.arr->size(); ++k)
        if (!equal((*a.arr)[k], (*b.arr)[k])) return false;
      return true;
    case Kind::kObject:
      if (a.obj->items.size() != b.obj->items.size()) return false;
      for (const auto& [k, v] : a.obj->items) {
        const Value* o = b.obj->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    case Kind::kMacro:
      return a.macro == b.macro;
    case Kind::kBuiltin:
      return a.s == b.s;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------
// Lexer.

enum class Tok : uint8_t {
  kText,
  kExprOpen,
  kExprClose,
  kStmtOpen,
  kStmtClose,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEnd
};

struct Token {
  Tok kind;
  std::string text;  // text / name / string value / operator
  int line = 1;
  int64_t i = 0;
  double f = 0;
};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    // Jinja2's keep_trailing_newline=False (and @huggingface/jinja): one
    // trailing newline of the template is dropped.
    if (src_.ends_with('\n')) src_.remove_suffix(1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with '-'
    while (pos <= src_.size()) {
      const size_t open = find_open(pos);
      size_t text_end = open == std::string_view::npos ? src_.size() : open;
      bool is_block = false, minus = false;
      if (open != std::string_view::npos) {
        is_block = src_[open + 1] == '%' || src_[open + 1] == '#';
        minus = open + 2 < src_.size() && src_[open + 2] == '-';
        const bool plus = plus_at(open + 2);
        // lstrip_blocks: spaces/tabs from the line start to a block tag.
        if (is_block && !plus && !minus) {
          size_t j = open;
          while (j > pos && (src_[j - 1] == ' ' || src_[j - 1] == '\t')) --j;
          if (j == 0 || src_[j - 1] == '\n') text_end = j;
        }
      }
      std::string_view text = src_.substr(pos, text_end - pos);
      const int text_line = line_at(pos);
      if (strip_next)
        while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
      if (minus)
        while (!text.empty() && is_ws(text.back())) text.remove_suffix(1);
      if (!text.empty()) push(Tok::kText, std::string(text), text_line);
      if (open == std::string_view::npos) break;
      strip_next = false;
      const char kind = src_[open + 1];
      size_t p = open + 2 + ((minus || plus_at(open + 2)) ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string_view::npos) fail_at(line_at(open), "unclosed comment '{#'", core::Errc::kUnsupported);
        strip_next = close > p && src_[close - 1] == '-';
        pos = trim_block_newline(close + 2);
        continue;
      }
      if (kind == '%' && is_raw(p)) {
        pos = lex_raw(open, p, &strip_next);
        continue;
      }
      push(kind == '{' ? Tok::kExprOpen : Tok::kStmtOpen, "", line_at(open));
      pos = lex_tag(p, kind == '{' ? '}' : '%', &strip_next);
      if (kind == '%') pos = trim_block_newline(pos);
    }
    push(Tok::kEnd, "", line_at(src_.size()));
    return std::move(toks_);
  }

 private:
  bool plus_at(size_t p) const { return p < src_.size() && src_[p] == '+'; }
  size_t find_open(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string_view::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string_view::npos;
  }
  // trim_blocks: the first newline after a block tag is dropped.
  size_t trim_block_newline(size_t p) const { return (p < src_.size() && src_[p] == '\n') ? p + 1 : p; }

  int line_at(size_t p) {
    // Lines are counted incrementally (positions only grow).
    while (line_pos_ < p && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  void push(Tok k, std::string text, int line) { toks_.push_back(Token{k, std::move(text), line}); }

  bool is_raw(size_t p) const {
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.substr(p, 3) != "raw") return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    return src_.substr(p, 2) == "%}" || src_.substr(p, 3) == "-%}";
  }

  // {% raw %}TEXT{% endraw %}: TEXT verbatim.
  size_t lex_raw(size_t open, size_t p, bool* strip_next) {
    const size_t close = src_.find("%}", p);
    const bool strip_after_open = src_[close - 1] == '-';
    size_t body = trim_block_newline(close + 2);
    for (size_t q = src_.find("{%", body); q != std::string_view::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      const bool minus = r < src_.size() && src_[r] == '-';
      if (minus) ++r;
      while (r < src_.size() && is_ws(src_[r])) ++r;
      if (src_.substr(r, 6) != "endraw") continue;
      r += 6;
      while (r < src_.size() && is_ws(src_[r])) ++r;
      const bool minus_close = src_.substr(r, 3) == "-%}";
      if (!minus_close && src_.substr(r, 2) != "%}") continue;
      std::string_view text = src_.substr(body, q - body);
      if (strip_after_open)
        while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
      if (minus)
        while (!text.empty() && is_ws(text.back())) text.remove_suffix(1);
      if (!text.empty()) push(Tok::kText, std::string(text), line_at(body));
      *strip_next = minus_close;
      return trim_block_newline(r + (minus_close ? 3 : 2));
    }
    fail_at(line_at(open), "'{% raw %}' without '{% endraw %}'", core::Errc::kUnsupported);
  }

  // The tokens of a tag's inside up to its close ("}}" or "%}", optionally
  // "-"-prefixed) at bracket depth 0. Returns the position after the close.
  size_t lex_tag(size_t p, char close_char, bool* strip_next) {
    int depth = 0;
    const Tok close_kind = close_char == '}' ? Tok::kExprClose : Tok::kStmtClose;
    while (true) {
      while (p < src_.size() && is_ws(src_[p])) ++p;
      if (p >= src_.size())
        fail_at(line_at(p), "unclosed tag (missing '" + std::string(1, close_char) + "}')", core::Errc::kUnsupported);
      const int line = line_at(p);
      if (depth == 0) {
        if (src_[p] == '-' && src_.substr(p + 1, 2) == std::string{close_char, '}'}) {
          *strip_next = true;
          push(close_kind, "", line);
          return p + 3;
        }
        if (src_.substr(p, 2) == std::string{close_char, '}'}) {
          push(close_kind, "", line);
          return p + 2;
        }
      }
      const char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        push(Tok::kName, std::string(src_.substr(p, q - p)), line);
        p = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        p = lex_number(p, line);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, line);
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (std::string_view two : kTwo)
          if (src_.substr(p, 2) == two) op = std::string(two);
        if (op.size() == 1 && std::string_view("+-*/%<>=()[]{}.,:|~!").find(c) == std::string_view::npos)
          fail_at(line, std::string("unexpected character '") + c + "' in a tag", core::Errc::kUnsupported);
        if (op == "!") fail_at(line, "unexpected character '!' in a tag", core::Errc::kUnsupported);
        if (c == '(' || c == '[' || c == '{') ++depth;
        if (c == ')' || c == ']' || c == '}') --depth;
        push(Tok::kOp, op, line);
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p, int line) {
    size_t q = p;
    bool is_float = false;
    while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
    if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      is_float = true;
      ++q;
      while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        is_float = true;
        q = r;
        while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
      }
    }
    std::string digits;
    for (char ch : src_.substr(p, q - p))
      if (ch != '_') digits.push_back(ch);
    Token t{is_float ? Tok::kFloat : Tok::kInt, digits, line};
    if (is_float) {
      t.f = std::strtod(digits.c_str(), nullptr);
    } else if (std::from_chars(digits.data(), digits.data() + digits.size(), t.i).ec != std::errc()) {
      fail_at(line, "integer literal " + digits + " is out of range", core::Errc::kUnsupported);
    }
    toks_.push_back(std::move(t));
    return q;
  }

  // A Python string literal with \n \t \r \\ \' \" \b \f \v \0 \xNN \uNNNN
  // \UNNNNNNNN escapes (others kept verbatim, as Python does).
  size_t lex_string(size_t p, int line) {
    const char q = src_[p++];
    std::string out;
    while (true) {
      if (p >= src_.size()) fail_at(line, "unterminated string literal", core::Errc::kUnsupported);
      const char c = src_[p];
      if (c == q) break;
      if (c != '\\' || p + 1 >= src_.size()) {
        out.push_back(c);
        ++p;
        continue;
      }
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case '0':
          out.push_back('\0');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          if (p + n > src_.size() ||
              std::from_chars(src_.data() + p, src_.data() + p + n, cp, 16).ptr != src_.data() + p + n)
            fail_at(line, std::string("bad \\") + e + " escape in a string literal", core::Errc::kUnsupported);
          append_utf8(cp, out);
          p += n;
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
      }
    }
    push(Tok::kString, std::move(out), line);
    return p + 1;
  }

  std::string_view src_;
  std::vector<Token> toks_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// ---------------------------------------------------------------------------
// AST.

enum class EK : uint8_t {
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,
  kAttr,
  kIndex,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNeg,
  kPos,
  kNot,
  kBinary,
  kAnd,
  kOr,
  kTernary,
};

struct Expr {
  EK kind;
  int line = 0;
  Value literal;            // kLiteral
  std::string name;         // kName, kAttr, kFilter, kTest; kBinary: the operator
  ExprP a, b, c;            // operands / subject (a); kSlice: b, c = start, stop; kTernary: a if b else c
  ExprP step;               // kSlice
  std::vector<ExprP> args;  // call / filter / test arguments, list / tuple items, dict keys and values
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negate = false;  // kTest: `is not`
  int depth = 1;        // height of this subtree (bounded by Parser::finish)
};

enum class SK : uint8_t { kText, kOutput, kIf, kFor, kSet, kSetAttr, kSetBlock, kMacro, kBreak, kContinue };

struct Stmt {
  SK kind;
  int line = 0;
  std::string text;                              // kText; kSetAttr: the attribute; kSetBlock: the variable
  ExprP expr;                                    // kOutput, kSet, kSetAttr value; kFor iterable
  std::vector<std::string> targets;              // kSet / kFor variables; kSetAttr: the namespace variable
  std::vector<std::pair<ExprP, Body>> branches;  // kIf: (condition, body); null condition = else
  ExprP filter;                                  // kFor: `if` filter
  Body body, else_body;                          // kFor, kSetBlock, kMacro
  MacroDef macro;                                // kMacro
  std::vector<ExprP> defaults;                   // kMacro default values (owned)
};

// ---------------------------------------------------------------------------
// The supported names (checked at parse time).

const std::set<std::string, std::less<>>& filter_names() {
  static const std::set<std::string, std::less<>> k = {
      "abs",     "capitalize", "count",  "d",      "default",    "dictsort", "e",          "escape",
      "first",   "float",      "indent", "int",    "items",      "join",     "last",       "length",
      "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr", "replace",
      "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",     "sum",
      "title",   "tojson",     "trim",   "unique", "upper",      "wordcount"};
  return k;
}

const std::set<std::string, std::less<>>& test_names() {
  static const std::set<std::string, std::less<>> k = {
      "boolean",   "callable", "defined", "divisibleby", "eq",      "equalto",  "escaped",  "even",   "false",
      "float",     "ge",       "gt",      "in",          "integer", "iterable", "le",       "lower",  "lt",
      "mapping",   "ne",       "none",    "number",      "odd",     "sameas",   "sequence", "string", "true",
      "undefined", "upper",    "==",      "!=",          "<",       "<=",       ">",        ">="};
  return k;
}

const std::set<std::string, std::less<>>& method_names() {
  static const std::set<std::string, std::less<>> k = {
      // str
      "capitalize", "count", "endswith", "find", "isalnum", "isalpha", "isdigit", "islower", "isspace", "isupper",
      "join", "lower", "lstrip", "replace", "rfind", "rsplit", "rstrip", "split", "startswith", "strip", "title",
      "upper",
      // dict
      "get", "items", "keys", "values",
      // list
      "append", "extend", "index", "insert", "pop"};
  return k;
}

const std::set<std::string, std::less<>>& global_functions() {
  static const std::set<std::string, std::less<>> k = {"dict", "namespace", "raise_exception", "range", "strftime_now"};
  return k;
}

// ---------------------------------------------------------------------------
// Parser.

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_template() {
    Body body = parse_body({});
    for (const auto& [name, line] : called_names_) {
      if (!global_functions().contains(name) && !macro_names_.contains(name))
        fail_at(line, "unsupported function '" + name + "' (not a macro of the template nor a known global)",
                core::Errc::kUnsupported);
    }
    return body;
  }

 private:
  static constexpr int kMaxDepth = 100;      // nesting of blocks and parenthesised expressions
  static constexpr int kMaxExprDepth = 200;  // height of one expression's tree

  const Token& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  [[noreturn]] void syntax(const std::string& what) const { fail_at(peek().line, what, core::Errc::kUnsupported); }
  bool at_op(std::string_view op, size_t k = 0) const { return peek(k).kind == Tok::kOp && peek(k).text == op; }
  bool at_name(std::string_view n, size_t k = 0) const { return peek(k).kind == Tok::kName && peek(k).text == n; }
  void expect_op(std::string_view op) {
    if (!at_op(op)) syntax("expected '" + std::string(op) + "', found " + describe(peek()));
    ++p_;
  }
  void expect_close() {
    if (peek().kind != Tok::kStmtClose) syntax("expected '%}', found " + describe(peek()));
    ++p_;
  }
  std::string expect_name() {
    if (peek().kind != Tok::kName) syntax("expected a name, found " + describe(peek()));
    return next().text;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::kText:
        return "text";
      case Tok::kExprOpen:
        return "'{{'";
      case Tok::kExprClose:
        return "'}}'";
      case Tok::kStmtOpen:
        return "'{%'";
      case Tok::kStmtClose:
        return "'%}'";
      case Tok::kName:
        return "'" + t.text + "'";
      case Tok::kString:
        return "a string";
      case Tok::kInt:
      case Tok::kFloat:
        return "a number";
      case Tok::kOp:
        return "'" + t.text + "'";
      case Tok::kEnd:
        return "the end of the template";
    }
    return "?";
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth) p_.syntax("template nested too deeply");
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  // Statements up to a `{% NAME` whose NAME is in `ends` (not consumed: the
  // caller reads it) or the end of the template (only when `ends` is empty).
  Body parse_body(const std::vector<std::string_view>& ends) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::kEnd) {
        if (!ends.empty()) syntax("missing '{% " + std::string(ends.back()) + " %}'");
        return body;
      }
      if (t.kind == Tok::kText) {
        auto s = std::make_unique<Stmt>(Stmt{.kind = SK::kText, .line = t.line, .text = t.text});
        body.push_back(std::move(s));
        ++p_;
      } else if (t.kind == Tok::kExprOpen) {
        ++p_;
        auto s = std::make_unique<Stmt>(Stmt{.kind = SK::kOutput, .line = t.line});
        s->expr = parse_expr();
        if (peek().kind != Tok::kExprClose) syntax("expected '}}', found " + describe(peek()));
        ++p_;
        body.push_back(std::move(s));
      } else if (t.kind == Tok::kStmtOpen) {
        if (peek(1).kind != Tok::kName) {
          ++p_;
          syntax("expected a statement name after '{%'");
        }
        const std::string& kw = peek(1).text;
        if (std::find(ends.begin(), ends.end(), kw) != ends.end()) return body;
        static constexpr std::string_view kClosers[] = {"elif",     "else",   "endif", "endfor",
                                                        "endmacro", "endset", "endraw"};
        if (std::find(std::begin(kClosers), std::end(kClosers), kw) != std::end(kClosers)) {
          ++p_;
          syntax("unexpected '{% " + kw + " %}'" +
                 (ends.empty() ? std::string() : ", expected '{% " + std::string(ends.back()) + " %}'"));
        }
        ++p_;
        body.push_back(parse_statement());
      } else {
        syntax("unexpected " + describe(t));
      }
    }
  }

  StmtP parse_statement() {
    const int line = peek().line;
    const std::string kw = next().text;
    if (kw == "if") return parse_if(line);
    if (kw == "for") return parse_for(line);
    if (kw == "set") return parse_set(line);
    if (kw == "macro") return parse_macro(line);
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) fail_at(line, "'" + kw + "' outside a for loop", core::Errc::kUnsupported);
      expect_close();
      return std::make_unique<Stmt>(Stmt{.kind = kw == "break" ? SK::kBreak : SK::kContinue, .line = line});
    }
    if (kw == "generation" || kw == "endgeneration") {  // transformers' assistant-mask markers: no output
      expect_close();
      return std::make_unique<Stmt>(Stmt{.kind = SK::kText, .line = line});
    }
    fail_at(line, "unsupported statement '{% " + kw + " %}'", core::Errc::kUnsupported);
  }

  // `{% NAME %}` closing a block.
  void expect_end(std::string_view name) {
    if (peek().kind != Tok::kStmtOpen || !at_name(name, 1)) syntax("expected '{% " + std::string(name) + " %}'");
    p_ += 2;
    expect_close();
  }

  StmtP parse_if(int line) {
    auto s = std::make_unique<Stmt>(Stmt{.kind = SK::kIf, .line = line});
    ExprP cond = parse_expr();
    expect_close();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      ++p_;  // '{%'
      const std::string kw = next().text;
      if (kw == "endif") {
        expect_close();
        return s;
      }
      if (kw == "elif") {
        cond = parse_expr();
        expect_close();
        continue;
      }
      expect_close();  // else
      Body else_body = parse_body({"endif"});
      s->branches.emplace_back(nullptr, std::move(else_body));
      expect_end("endif");
      return s;
    }
  }

  StmtP parse_for(int line) {
    auto s = std::make_unique<Stmt>(Stmt{.kind = SK::kFor, .line = line});
    s->targets.push_back(expect_name());
    while (at_op(",")) {
      ++p_;
      s->targets.push_back(expect_name());
    }
    if (!at_name("in")) syntax("expected 'in' in a for statement");
    ++p_;
    s->expr = parse_ternary(/*allow_if=*/false);
    if (at_name("if")) {
      ++p_;
      s->filter = parse_ternary(false);
    }
    if (at_name("recursive")) syntax("unsupported 'recursive' for loop");
    expect_close();
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (at_name("else", 1)) {
      p_ += 2;
      expect_close();
      s->else_body = parse_body({"endfor"});
    }
    expect_end("endfor");
    return s;
  }

  StmtP parse_set(int line) {
    const std::string first = expect_name();
    if (at_op(".")) {
      ++p_;
      auto s = std::make_unique<Stmt>(Stmt{.kind = SK::kSetAttr, .line = line, .text = expect_name()});
      s->targets.push_back(first);
      expect_op("=");
      s->expr = parse_expr();
      expect_close();
      return s;
    }
    std::vector<std::string> targets{first};
    while (at_op(",")) {
      ++p_;
      targets.push_back(expect_name());
    }
    if (peek().kind == Tok::kStmtClose && targets.size() == 1) {  // block set
      ++p_;
      auto s = std::make_unique<Stmt>(Stmt{.kind = SK::kSetBlock, .line = line, .text = first});
      s->body = parse_body({"endset"});
      expect_end("endset");
      return s;
    }
    expect_op("=");
    auto s = std::make_unique<Stmt>(Stmt{.kind = SK::kSet, .line = line});
    s->targets = std::move(targets);
    s->expr = parse_expr();
    expect_close();
    return s;
  }

  StmtP parse_macro(int line) {
    auto s = std::make_unique<Stmt>(Stmt{.kind = SK::kMacro, .line = line});
    s->macro.name = expect_name();
    macro_names_.insert(s->macro.name);
    expect_op("(");
    while (!at_op(")")) {
      std::string param = expect_name();
      const Expr* def = nullptr;
      if (at_op("=")) {
        ++p_;
        s->defaults.push_back(parse_expr());
        def = s->defaults.back().get();
      }
      s->macro.params.emplace_back(std::move(param), def);
      if (!at_op(")")) expect_op(",");
    }
    ++p_;
    expect_close();
    const int saved_loop = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved_loop;
    expect_end("endmacro");
    s->macro.body = &s->body;
    return s;
  }

  // --- expressions (Jinja2's precedence, lowest first) ---

  ExprP make(EK k, int line) { return std::make_unique<Expr>(Expr{.kind = k, .line = line}); }

  // Records a composite node's height once its children are attached and
  // refuses a tree higher than kMaxExprDepth: evaluating and freeing the tree
  // recurse once per level (a chain "1+1+...+1" is parsed by a loop, so the
  // nesting guard alone would not bound it).
  ExprP finish(ExprP n) {
    int d = 0;
    for (const Expr* c : {n->a.get(), n->b.get(), n->c.get(), n->step.get()})
      if (c) d = std::max(d, c->depth);
    for (const ExprP& c : n->args) d = std::max(d, c->depth);
    for (const auto& kv : n->kwargs) d = std::max(d, kv.second->depth);
    n->depth = d + 1;
    if (n->depth > kMaxExprDepth) fail_at(n->line, "expression nested too deeply", core::Errc::kUnsupported);
    return n;
  }

  ExprP parse_expr() { return parse_ternary(true); }

  // A tuple without parentheses is only read where Jinja reads one: `set a, b = ...` is handled
  // by parse_set; elsewhere an expression is a single value.
  ExprP parse_ternary(bool allow_if) {
    DepthGuard guard(*this);
    ExprP e = parse_or();
    while (allow_if && at_name("if")) {
      const int line = peek().line;
      ++p_;
      auto t = make(EK::kTernary, line);
      t->a = std::move(e);
      t->b = parse_or();
      if (at_name("else")) {
        ++p_;
        t->c = parse_ternary(true);
      }
      e = finish(std::move(t));
    }
    return e;
  }

  ExprP parse_or() {
    ExprP e = parse_and();
    while (at_name("or")) {
      auto n = make(EK::kOr, next().line);
      n->a = std::move(e);
      n->b = parse_and();
      e = finish(std::move(n));
    }
    return e;
  }

  ExprP parse_and() {
    ExprP e = parse_not();
    while (at_name("and")) {
      auto n = make(EK::kAnd, next().line);
      n->a = std::move(e);
      n->b = parse_not();
      e = finish(std::move(n));
    }
    return e;
  }

  ExprP parse_not() {
    if (at_name("not")) {
      DepthGuard guard(*this);
      auto n = make(EK::kNot, next().line);
      n->a = parse_not();
      return finish(std::move(n));
    }
    return parse_compare();
  }

  ExprP parse_compare() {
    ExprP e = parse_math1();
    while (true) {
      std::string op;
      const int line = peek().line;
      if (peek().kind == Tok::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                      peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        ++p_;
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        p_ += 2;
        op = "not in";
      } else {
        return e;
      }
      auto n = make(EK::kBinary, line);
      n->name = op;
      n->a = std::move(e);
      n->b = parse_math1();
      e = finish(std::move(n));
    }
  }

  ExprP binary_loop(ExprP (Parser::*sub)(), std::initializer_list<std::string_view> ops) {
    ExprP e = (this->*sub)();
    while (peek().kind == Tok::kOp && std::find(ops.begin(), ops.end(), peek().text) != ops.end()) {
      auto n = make(EK::kBinary, peek().line);
      n->name = next().text;
      n->a = std::move(e);
      n->b = (this->*sub)();
      e = finish(std::move(n));
    }
    return e;
  }
  ExprP parse_math1() { return binary_loop(&Parser::parse_concat, {"+", "-"}); }
  ExprP parse_concat() { return binary_loop(&Parser::parse_math2, {"~"}); }
  ExprP parse_math2() { return binary_loop(&Parser::parse_pow, {"*", "/", "//", "%"}); }
  ExprP parse_pow() { return binary_loop(&Parser::parse_unary, {"**"}); }

  ExprP parse_unary() {
    if (at_op("-") || at_op("+")) {
      DepthGuard guard(*this);
      const EK kind = at_op("-") ? EK::kNeg : EK::kPos;
      auto n = make(kind, next().line);
      n->a = parse_unary();
      return parse_filters(finish(std::move(n)));
    }
    return parse_filters(parse_postfix(parse_primary()));
  }

  ExprP parse_primary() {
    DepthGuard guard(*this);
    const Token& t = peek();
    const int line = t.line;
    switch (t.kind) {
      case Tok::kString: {
        std::string s;
        while (peek().kind == Tok::kString) s += next().text;  // adjacent literals concatenate
        auto e = make(EK::kLiteral, line);
        e->literal = Value::str(std::move(s));
        return e;
      }
      case Tok::kInt: {
        auto e = make(EK::kLiteral, line);
        e->literal = Value::integer(next().i);
        return e;
      }
      case Tok::kFloat: {
        auto e = make(EK::kLiteral, line);
        e->literal = Value::number(next().f);
        return e;
      }
      case Tok::kName: {
        const std::string n = next().text;
        auto e = make(EK::kLiteral, line);
        if (n == "true" || n == "True") {
          e->literal = Value::boolean(true);
        } else if (n == "false" || n == "False") {
          e->literal = Value::boolean(false);
        } else if (n == "none" || n == "None") {
          e->literal = Value::none();
        } else {
          e->kind = EK::kName;
          e->name = n;
        }
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ++p_;
          if (at_op(")")) {
            ++p_;
            return make(EK::kTuple, line);
          }
          ExprP first = parse_expr();
          if (!at_op(",")) {
            expect_op(")");
            return first;
          }
          auto tup = make(EK::kTuple, line);
          tup->args.push_back(std::move(first));
          while (at_op(",")) {
            ++p_;
            if (at_op(")")) break;
            tup->args.push_back(parse_expr());
          }
          expect_op(")");
          return finish(std::move(tup));
        }
        if (t.text == "[") {
          ++p_;
          auto list = make(EK::kList, line);
          while (!at_op("]")) {
            list->args.push_back(parse_expr());
            if (!at_op("]")) expect_op(",");
          }
          ++p_;
          return finish(std::move(list));
        }
        if (t.text == "{") {
          ++p_;
          auto dict = make(EK::kDict, line);
          while (!at_op("}")) {
            dict->args.push_back(parse_expr());
            expect_op(":");
            dict->args.push_back(parse_expr());
            if (!at_op("}")) expect_op(",");
          }
          ++p_;
          return finish(std::move(dict));
        }
        break;
      default:
        break;
    }
    syntax("expected an expression, found " + describe(t));
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().kind == Tok::kName && at_op("=", 1)) {
        std::string key = next().text;
        ++p_;
        call.kwargs.emplace_back(std::move(key), parse_expr());
      } else {
        if (!call.kwargs.empty()) syntax("a positional argument after a keyword argument");
        call.args.push_back(parse_expr());
      }
      if (!at_op(")")) expect_op(",");
    }
    ++p_;
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      const int line = peek().line;
      if (at_op(".")) {
        ++p_;
        auto n = make(EK::kAttr, line);
        if (peek().kind == Tok::kInt) {  // a.0 (Jinja's item access by integer)
          n->kind = EK::kIndex;
          n->a = std::move(e);
          n->b = make(EK::kLiteral, line);
          n->b->literal = Value::integer(next().i);
          e = finish(std::move(n));
          continue;
        }
        n->name = expect_name();
        n->a = std::move(e);
        if (at_op("(") && !method_names().contains(n->name) && n->name != "cycle")
          fail_at(line, "unsupported method '" + n->name + "()'", core::Errc::kUnsupported);
        e = finish(std::move(n));
      } else if (at_op("[")) {
        ++p_;
        ExprP start, stop, step;
        bool slice = false;
        if (!at_op(":")) start = parse_expr();
        if (at_op(":")) {
          slice = true;
          ++p_;
          if (!at_op("]") && !at_op(":")) stop = parse_expr();
          if (at_op(":")) {
            ++p_;
            if (!at_op("]")) step = parse_expr();
          }
        }
        expect_op("]");
        auto n = make(slice ? EK::kSlice : EK::kIndex, line);
        n->a = std::move(e);
        n->b = std::move(start);
        n->c = std::move(stop);
        n->step = std::move(step);
        e = finish(std::move(n));
      } else if (at_op("(")) {
        if (e->kind == EK::kName) called_names_.emplace_back(e->name, line);
        auto n = make(EK::kCall, line);
        n->a = std::move(e);
        parse_call_args(*n);
        e = finish(std::move(n));
      } else {
        return e;
      }
    }
  }

  // Filters (`| name(args)`) and tests (`is [not] name [arg]`) after a unary expression.
  ExprP parse_filters(ExprP e) {
    while (true) {
      const int line = peek().line;
      if (at_op("|")) {
        ++p_;
        auto n = make(EK::kFilter, line);
        n->name = expect_name();
        if (!filter_names().contains(n->name))
          fail_at(line, "unsupported filter '" + n->name + "'", core::Errc::kUnsupported);
        n->a = std::move(e);
        if (at_op("(")) parse_call_args(*n);
        e = parse_postfix(finish(std::move(n)));
      } else if (at_name("is")) {
        ++p_;
        auto n = make(EK::kTest, line);
        if (at_name("not")) {
          ++p_;
          n->negate = true;
        }
        if (peek().kind == Tok::kName) {
          n->name = next().text;
        } else if (peek().kind == Tok::kOp) {
          n->name = next().text;
        } else {
          syntax("expected a test name after 'is'");
        }
        if (!test_names().contains(n->name))
          fail_at(line, "unsupported test '" + n->name + "'", core::Errc::kUnsupported);
        n->a = std::move(e);
        if (at_op("(")) {
          parse_call_args(*n);
        } else if (peek().kind == Tok::kString || peek().kind == Tok::kInt || peek().kind == Tok::kFloat ||
                   (peek().kind == Tok::kName && !at_name("and") && !at_name("or") && !at_name("else") &&
                    !at_name("if") && !at_name("not") && !at_name("in") && !at_name("is"))) {
          n->args.push_back(parse_postfix(parse_primary()));  // `is divisibleby 3`, `is sameas false`
        }
        e = finish(std::move(n));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::set<std::string, std::less<>> macro_names_;
  std::vector<std::pair<std::string, int>> called_names_;
};

}  // namespace

// The parsed template (shared, immutable).
struct Program {
  Body body;
};

namespace {

// ---------------------------------------------------------------------------
// Evaluator.

// A masked string being written (the template's output, or a macro's / block
// set's captured output).
struct Buffer {
  std::string text;
  std::string mask;  // same length as text once any input byte is added (masked); else empty
  bool masked = false;
};

class Renderer {
 public:
  Renderer(const Limits& limits) : limits_(limits) {}

  Output run(const Program& program, const OJson& data, const OJson& trusted) {
    Frame globals;
    if (data.is_object())
      for (auto it = data.begin(); it != data.end(); ++it) globals[it.key()] = from_json(it.value(), true);
    if (trusted.is_object())
      for (auto it = trusted.begin(); it != trusted.end(); ++it) globals[it.key()] = from_json(it.value(), false);
    for (const auto& name : global_functions()) {
      Value f{.kind = Kind::kBuiltin, .s = name};
      globals.emplace(name, std::move(f));
    }
    frames_.push_back(std::move(globals));
    buffers_.emplace_back();
    exec_body(program.body);
    Buffer& out = buffers_.back();
    if (!out.masked) out.mask.assign(out.text.size(), '\0');
    return Output{std::move(out.text), std::move(out.mask)};
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };

  [[noreturn]] void error(const std::string& message) const { fail_at(line_, message); }

  void step() {
    if (++steps_ > limits_.max_steps)
      fail_at(line_, "template exceeded " + std::to_string(limits_.max_steps) + " evaluation steps",
              core::Errc::kResourceExhausted);
  }
  void check_size(size_t bytes) const {
    if (bytes > limits_.max_output_bytes)
      fail_at(line_, "template output or value exceeded " + std::to_string(limits_.max_output_bytes) + " bytes",
              core::Errc::kResourceExhausted);
  }

  void write(const Value& v) {
    Buffer& b = buffers_.back();
    if (v.kind == Kind::kString) {
      append(b, v.s, v.mask);
    } else {
      append(b, py_str(v), contains_input(v) ? "\1" : "");
    }
  }
  // Appends `text` with `mask` (empty: template text; "\1": all input; else per byte).
  void append(Buffer& b, std::string_view text, std::string_view mask) {
    check_size(b.text.size() + text.size());
    const bool input = !mask.empty() && mask.find('\1') != std::string_view::npos;
    if (input && !b.masked) {
      b.mask.assign(b.text.size(), '\0');
      b.masked = true;
    }
    b.text.append(text);
    if (b.masked) {
      if (mask.size() == text.size()) {
        b.mask.append(mask);
      } else {
        b.mask.append(text.size(), input ? '\1' : '\0');
      }
    }
  }

  // --- variables ---

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
      if (it->contains("\x01macro_boundary")) {  // a macro sees its own frame and the globals only
        auto g = frames_.front().find(name);
        return g == frames_.front().end() ? Value{} : g->second;
      }
    }
    return Value{};
  }
  void assign(const std::string& name, Value v) { frames_.back()[name] = std::move(v); }

  // --- statements ---

  Flow exec_body(const Body& body) {
    for (const StmtP& s : body) {
      const Flow f = exec(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s) {
    const Nesting nesting(*this);
    line_ = s.line;
    step();
    switch (s.kind) {
      case SK::kText:
        append(buffers_.back(), s.text, "");
        return Flow::kNormal;
      case SK::kOutput:
        write(eval(*s.expr));
        return Flow::kNormal;
      case SK::kIf:
        for (const auto& [cond, body] : s.branches)
          if (!cond || truthy(eval(*cond))) return exec_body(body);
        return Flow::kNormal;
      case SK::kFor:
        return exec_for(s);
      case SK::kSet: {
        Value v = eval(*s.expr);
        if (s.targets.size() == 1) {
          assign(s.targets[0], std::move(v));
        } else {
          unpack(s.targets, v, [&](const std::string& n, Value e) { assign(n, std::move(e)); });
        }
        return Flow::kNormal;
      }
      case SK::kSetAttr: {
        Value ns = lookup(s.targets[0]);
        if (ns.kind != Kind::kObject || !ns.obj->is_namespace)
          error("cannot assign attribute '" + s.text + "' of '" + s.targets[0] + "': not a namespace()");
        ns.obj->set(s.text, eval(*s.expr));
        return Flow::kNormal;
      }
      case SK::kSetBlock: {
        buffers_.emplace_back();
        exec_body(s.body);
        Buffer b = std::move(buffers_.back());
        buffers_.pop_back();
        assign(s.text, Value{.kind = Kind::kString, .s = std::move(b.text), .mask = std::move(b.mask)});
        return Flow::kNormal;
      }
      case SK::kMacro:
        assign(s.macro.name, Value{.kind = Kind::kMacro, .macro = &s.macro});
        return Flow::kNormal;
      case SK::kBreak:
        return Flow::kBreak;
      case SK::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  template <class F>
  void unpack(const std::vector<std::string>& names, const Value& v, F&& bind) {
    if (v.kind != Kind::kArray || v.arr->size() != names.size())
      error("cannot unpack a " + std::string(kind_name(v.kind)) + " into " + std::to_string(names.size()) +
            " variables");
    for (size_t k = 0; k < names.size(); ++k) bind(names[k], (*v.arr)[k]);
  }

  // The items a for loop / filter iterates: a list's items, a dict's keys,
  // a string's characters.
  std::vector<Value> iterate(const Value& v) {
    switch (v.kind) {
      case Kind::kArray:
        return *v.arr;
      case Kind::kObject: {
        std::vector<Value> keys;
        for (const auto& kv : v.obj->items) keys.push_back(Value::str(kv.first, v.obj->input));
        return keys;
      }
      case Kind::kString: {
        std::vector<Value> chars;
        const auto off = code_point_offsets(v.s);
        for (size_t k = 0; k + 1 < off.size(); ++k) chars.push_back(substr(v, off[k], off[k + 1]));
        return chars;
      }
      case Kind::kUndefined:
        return {};
      default:
        error(std::string("cannot iterate over a ") + kind_name(v.kind));
    }
  }

  Flow exec_for(const Stmt& s) {
    std::vector<Value> items = iterate(eval(*s.expr));
    if (s.filter) {  // `for x in xs if cond`: cond sees the loop variables
      std::vector<Value> kept;
      for (Value& item : items) {
        step();
        frames_.emplace_back();
        bind_targets(s, item);
        const bool keep = truthy(eval(*s.filter));
        frames_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {  // `{% else %}` of a for: runs when nothing was iterated
      exec_body(s.else_body);
      return Flow::kNormal;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      step();
      frames_.emplace_back();
      Value loop = Value::object();
      auto& L = loop.obj->items;
      L.emplace_back("index0", Value::integer(k));
      L.emplace_back("index", Value::integer(k + 1));
      L.emplace_back("revindex0", Value::integer(n - k - 1));
      L.emplace_back("revindex", Value::integer(n - k));
      L.emplace_back("first", Value::boolean(k == 0));
      L.emplace_back("last", Value::boolean(k == n - 1));
      L.emplace_back("length", Value::integer(n));
      L.emplace_back("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value{});
      L.emplace_back("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value{});
      assign("loop", std::move(loop));
      bind_targets(s, items[static_cast<size_t>(k)]);
      const Flow f = exec_body(s.body);
      frames_.pop_back();
      line_ = s.line;
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void bind_targets(const Stmt& s, const Value& item) {
    if (s.targets.size() == 1) {
      assign(s.targets[0], item);
    } else {
      unpack(s.targets, item, [&](const std::string& n, Value e) { assign(n, std::move(e)); });
    }
  }

  // --- expressions ---

  Value substr(const Value& v, size_t b, size_t e) const {
    Value r = Value::str(v.s.substr(b, e - b));
    if (!v.mask.empty()) r.mask = v.mask.substr(b, e - b);
    return r;
  }

  // A new string computed from `inputs`: input text if any input has some.
  static Value derived(std::string text, std::initializer_list<const Value*> inputs) {
    bool input = false;
    for (const Value* v : inputs) input = input || contains_input(*v);
    return Value::str(std::move(text), input);
  }

  Value concat(const Value& a, const Value& b) {
    check_size(a.s.size() + b.s.size());
    Value r = Value::str(a.s + b.s);
    if (!a.mask.empty() || !b.mask.empty()) {
      r.mask = a.mask.empty() ? std::string(a.s.size(), '\0') : a.mask;
      r.mask += b.mask.empty() ? std::string(b.s.size(), '\0') : b.mask;
    }
    return r;
  }

  Value as_string(const Value& v) {
    if (v.kind == Kind::kString) return v;
    return derived(py_str(v), {&v});
  }

  // Counts nested exec / eval calls (the C++ stack they use) against
  // kMaxNesting, whatever mix of blocks, expressions and macro calls makes it.
  struct Nesting {
    explicit Nesting(Renderer& r) : r_(r) {
      if (++r_.nesting_ > kMaxNesting)
        fail_at(r_.line_, "template evaluation nested deeper than " + std::to_string(kMaxNesting),
                core::Errc::kResourceExhausted);
    }
    ~Nesting() { --r_.nesting_; }
    Renderer& r_;
  };
  // 500: a real template nests a few tens deep; an ASan build's frames are
  // several KiB, and 2000 overflowed its 8 MiB stack.
  static constexpr int kMaxNesting = 500;

  Value eval(const Expr& e) {
    const Nesting nesting(*this);
    line_ = e.line;
    switch (e.kind) {
      case EK::kLiteral:
        return e.literal;
      case EK::kName:
        return lookup(e.name);
      case EK::kList:
      case EK::kTuple: {
        Value v = Value::array();
        for (const ExprP& x : e.args) v.arr->push_back(eval(*x));
        return v;
      }
      case EK::kDict: {
        Value v = Value::object();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (!key.is_string()) error("dict keys must be strings");
          v.obj->set(key.s, eval(*e.args[k + 1]));
        }
        return v;
      }
      case EK::kAttr:
        return get_attr(eval(*e.a), e.name);
      case EK::kIndex: {
        Value obj = eval(*e.a);
        return get_item(obj, eval(*e.b));
      }
      case EK::kSlice:
        return eval_slice(e);
      case EK::kCall:
        return eval_call(e);
      case EK::kFilter:
        return eval_filter(e);
      case EK::kTest: {
        const bool r = eval_test(e.name, eval(*e.a), e.args, e.kwargs);
        return Value::boolean(e.negate ? !r : r);
      }
      case EK::kNeg:
      case EK::kPos: {
        Value v = eval(*e.a);
        if (v.kind == Kind::kInt) return Value::integer(e.kind == EK::kNeg ? -v.i : v.i);
        if (v.kind == Kind::kFloat) return Value::number(e.kind == EK::kNeg ? -v.f : v.f);
        error(std::string("bad operand type for unary minus: ") + kind_name(v.kind));
      }
      case EK::kNot:
        return Value::boolean(!truthy(eval(*e.a)));
      case EK::kAnd: {
        Value a = eval(*e.a);
        return truthy(a) ? eval(*e.b) : a;
      }
      case EK::kOr: {
        Value a = eval(*e.a);
        return truthy(a) ? a : eval(*e.b);
      }
      case EK::kTernary:
        if (truthy(eval(*e.b))) return eval(*e.a);
        return e.c ? eval(*e.c) : Value{};
      case EK::kBinary:
        return eval_binary(e);
    }
    return Value{};
  }

  Value get_attr(const Value& obj, const std::string& name) {
    if (obj.kind == Kind::kObject) {
      const Value* v = obj.obj->find(name);
      return v ? *v : Value{};
    }
    if (obj.kind == Kind::kUndefined) error("'" + name + "' of an undefined value");
    return Value{};
  }

  static int64_t norm_index(int64_t k, size_t n) { return k < 0 ? k + static_cast<int64_t>(n) : k; }

  Value get_item(const Value& obj, const Value& key) {
    switch (obj.kind) {
      case Kind::kObject:
        if (!key.is_string()) return Value{};
        return get_attr(obj, key.s);
      case Kind::kArray: {
        if (key.kind != Kind::kInt) error("list indices must be integers, not " + std::string(kind_name(key.kind)));
        const int64_t k = norm_index(key.i, obj.arr->size());
        if (k < 0 || k >= static_cast<int64_t>(obj.arr->size())) return Value{};
        return (*obj.arr)[static_cast<size_t>(k)];
      }
      case Kind::kString: {
        if (key.kind != Kind::kInt) error("string indices must be integers");
        const auto off = code_point_offsets(obj.s);
        const int64_t k = norm_index(key.i, off.size() - 1);
        if (k < 0 || k >= static_cast<int64_t>(off.size() - 1)) return Value{};
        return substr(obj, off[static_cast<size_t>(k)], off[static_cast<size_t>(k) + 1]);
      }
      case Kind::kUndefined:
        error("subscript of an undefined value");
      default:
        return Value{};
    }
  }

  // Python slice semantics over a list or a string's code points.
  Value eval_slice(const Expr& e) {
    Value obj = eval(*e.a);
    auto opt = [&](const ExprP& x) -> std::optional<int64_t> {
      if (!x) return std::nullopt;
      Value v = eval(*x);
      if (v.kind == Kind::kNone) return std::nullopt;
      if (v.kind != Kind::kInt) error("slice indices must be integers");
      return v.i;
    };
    const auto start = opt(e.b), stop = opt(e.c), stepv = opt(e.step);
    const int64_t st = stepv.value_or(1);
    if (st == 0) error("slice step cannot be zero");
    std::vector<size_t> off;
    int64_t n = 0;
    if (obj.kind == Kind::kArray) {
      n = static_cast<int64_t>(obj.arr->size());
    } else if (obj.kind == Kind::kString) {
      off = code_point_offsets(obj.s);
      n = static_cast<int64_t>(off.size()) - 1;
    } else {
      error(std::string("cannot slice a ") + kind_name(obj.kind));
    }
    auto clamp = [&](std::optional<int64_t> v, int64_t def) {
      if (!v) return def;
      int64_t k = *v < 0 ? *v + n : *v;
      if (st > 0) return std::clamp<int64_t>(k, 0, n);
      return std::clamp<int64_t>(k, -1, n - 1);
    };
    const int64_t b = clamp(start, st > 0 ? 0 : n - 1), en = clamp(stop, st > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t k = b; st > 0 ? k < en : k > en; k += st) idx.push_back(k);
    if (obj.kind == Kind::kArray) {
      Value r = Value::array();
      for (int64_t k : idx) r.arr->push_back((*obj.arr)[static_cast<size_t>(k)]);
      return r;
    }
    Value r = Value::str("");
    for (int64_t k : idx) r = concat(r, substr(obj, off[static_cast<size_t>(k)], off[static_cast<size_t>(k) + 1]));
    return r;
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    Value a = eval(*e.a);
    Value b = eval(*e.b);
    line_ = e.line;
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in") {
      const bool r = contains(b, a);
      return Value::boolean(op == "in" ? r : !r);
    }
    if (op == "~") {
      Value sa = as_string(a), sb = as_string(b);
      return concat(sa, sb);
    }
    const bool nums = (a.is_number() || a.kind == Kind::kBool) && (b.is_number() || b.kind == Kind::kBool);
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (nums) {
        const double x = a.as_double(), y = b.as_double();
        c = x < y ? -1 : x > y ? 1 : 0;
      } else if (a.is_string() && b.is_string()) {
        c = a.s.compare(b.s);
      } else {
        error("'" + op + "' not supported between " + kind_name(a.kind) + " and " + kind_name(b.kind));
      }
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return concat(a, b);
      if (a.kind == Kind::kArray && b.kind == Kind::kArray) {
        check_size(a.arr->size() + b.arr->size());
        Value r = Value::array(*a.arr);
        r.arr->insert(r.arr->end(), b.arr->begin(), b.arr->end());
        return r;
      }
    }
    if (op == "*" && (a.is_string() || a.kind == Kind::kArray) && b.kind == Kind::kInt) {
      const int64_t times = std::max<int64_t>(b.i, 0);
      const size_t unit = a.is_string() ? a.s.size() : a.arr->size();
      if (unit && static_cast<uint64_t>(times) > limits_.max_output_bytes / unit)
        check_size(limits_.max_output_bytes + 1);
      if (a.is_string()) {
        Value r = Value::str("");
        for (int64_t k = 0; k < times; ++k) r = concat(r, a);
        return r;
      }
      Value r = Value::array();
      for (int64_t k = 0; k < times; ++k) r.arr->insert(r.arr->end(), a.arr->begin(), a.arr->end());
      return r;
    }
    if (!nums) error("unsupported operand types for " + op + ": " + kind_name(a.kind) + " and " + kind_name(b.kind));
    const bool ints = a.kind != Kind::kFloat && b.kind != Kind::kFloat;
    const int64_t x = a.kind == Kind::kBool ? a.b : a.i, y = b.kind == Kind::kBool ? b.b : b.i;
    const double fx = a.as_double(), fy = b.as_double();
    if (op == "+") return ints ? Value::integer(x + y) : Value::number(fx + fy);
    if (op == "-") return ints ? Value::integer(x - y) : Value::number(fx - fy);
    if (op == "*") return ints ? Value::integer(x * y) : Value::number(fx * fy);
    if (op == "/") {
      if (fy == 0) error("division by zero");
      return Value::number(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fy == 0) error("integer division or modulo by zero");
      if (ints) {
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::integer(op == "//" ? q : r);
      }
      const double q = std::floor(fx / fy);
      return Value::number(op == "//" ? q : fx - q * fy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < std::min<int64_t>(y, 64); ++k) r *= x;
        return Value::integer(r);
      }
      return Value::number(std::pow(fx, fy));
    }
    error("unsupported operator " + op);
  }

  bool contains(const Value& container, const Value& item) {
    switch (container.kind) {
      case Kind::kString:
        if (!item.is_string()) error("'in <string>' requires a string as left operand");
        return container.s.find(item.s) != std::string::npos;
      case Kind::kArray:
        return std::any_of(container.arr->begin(), container.arr->end(),
                           [&](const Value& v) { return equal(v, item); });
      case Kind::kObject:
        return item.is_string() && container.obj->find(item.s) != nullptr;
      case Kind::kUndefined:
        return false;
      default:
        error(std::string("argument of type ") + kind_name(container.kind) + " is not iterable");
    }
  }

  // --- calls ---

  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    // Positional `k`, else keyword `name`, else `def`.
    const Value* get(size_t k, std::string_view name) const {
      if (k < pos.size()) return &pos[k];
      for (const auto& [n, v] : kw)
        if (n == name) return &v;
      return nullptr;
    }
  };

  Args eval_args(const std::vector<ExprP>& pos, const std::vector<std::pair<std::string, ExprP>>& kw) {
    Args a;
    for (const ExprP& x : pos) a.pos.push_back(eval(*x));
    for (const auto& [n, x] : kw) a.kw.emplace_back(n, eval(*x));
    return a;
  }

  Value eval_call(const Expr& e) {
    if (e.a->kind == EK::kAttr) {  // a method call: obj.name(args)
      Value obj = eval(*e.a->a);
      Args args = eval_args(e.args, e.kwargs);
      line_ = e.line;
      return call_method(obj, e.a->name, args);
    }
    Value fn = eval(*e.a);
    Args args = eval_args(e.args, e.kwargs);
    line_ = e.line;
    if (fn.kind == Kind::kMacro) return call_macro(*fn.macro, args);
    if (fn.kind == Kind::kBuiltin) return call_global(fn.s, args);
    error(std::string("a ") + kind_name(fn.kind) + " is not callable");
  }

  Value call_macro(const MacroDef& m, const Args& args) {
    if (++call_depth_ > limits_.max_call_depth)
      fail_at(line_, "macro calls nested deeper than " + std::to_string(limits_.max_call_depth),
              core::Errc::kResourceExhausted);
    if (args.pos.size() > m.params.size())
      error("macro '" + m.name + "' takes " + std::to_string(m.params.size()) + " arguments");
    Frame frame;
    frame["\x01macro_boundary"] = Value{};
    for (size_t k = 0; k < m.params.size(); ++k) {
      const auto& [name, def] = m.params[k];
      const Value* given = args.get(k, name);
      frame[name] = given ? *given : def ? eval(*def) : Value{};
    }
    for (const auto& [n, v] : args.kw) {
      if (std::none_of(m.params.begin(), m.params.end(), [&](const auto& p) { return p.first == n; }))
        error("macro '" + m.name + "' has no argument '" + n + "'");
    }
    const int saved_line = line_;
    frames_.push_back(std::move(frame));
    buffers_.emplace_back();
    exec_body(*m.body);
    Buffer b = std::move(buffers_.back());
    buffers_.pop_back();
    frames_.pop_back();
    --call_depth_;
    line_ = saved_line;
    return Value{.kind = Kind::kString, .s = std::move(b.text), .mask = std::move(b.mask)};
  }

  Value call_global(const std::string& name, const Args& args) {
    if (name == "raise_exception") {
      const Value* msg = args.get(0, "message");
      fail_at(line_, msg ? py_str(*msg) : "raise_exception() called");
    }
    if (name == "namespace" || name == "dict") {
      Value ns = Value::object(false, name == "namespace");
      for (const Value& p : args.pos) {  // namespace(dict) / dict(dict)
        if (p.kind != Kind::kObject) error(name + "() takes keyword arguments or a dict");
        for (const auto& kv : p.obj->items) ns.obj->set(kv.first, kv.second);
      }
      for (const auto& [n, v] : args.kw) ns.obj->set(n, v);
      return ns;
    }
    if (name == "range") {
      std::vector<int64_t> a;
      for (const Value& p : args.pos) {
        if (p.kind != Kind::kInt) error("range() takes integers");
        a.push_back(p.i);
      }
      if (a.empty() || a.size() > 3) error("range() takes 1 to 3 arguments");
      const int64_t start = a.size() == 1 ? 0 : a[0], stop = a.size() == 1 ? a[0] : a[1], st = a.size() == 3 ? a[2] : 1;
      if (st == 0) error("range() step must not be zero");
      Value r = Value::array();
      for (int64_t k = start; st > 0 ? k < stop : k > stop; k += st) {
        step();
        r.arr->push_back(Value::integer(k));
      }
      return r;
    }
    if (name == "strftime_now") {
      const Value* fmt = args.get(0, "format");
      if (!fmt || !fmt->is_string()) error("strftime_now() takes a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, fmt->s.c_str(), &tm);
      return Value::str(std::string(buf, n));
    }
    error("unknown function '" + name + "'");
  }

  // Python str.split(sep=None, maxsplit=-1) (rsplit when `from_right`).
  Value split(const Value& s, const Value* sep, int64_t maxsplit, bool from_right) {
    Value r = Value::array();
    if (sep && sep->kind != Kind::kNone) {
      if (!sep->is_string() || sep->s.empty()) error("split() separator must be a non-empty string");
      std::vector<std::pair<size_t, size_t>> parts;
      if (!from_right) {
        size_t b = 0;
        for (size_t p = s.s.find(sep->s);
             p != std::string::npos && (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit);
             p = s.s.find(sep->s, b)) {
          parts.emplace_back(b, p);
          b = p + sep->s.size();
        }
        parts.emplace_back(b, s.s.size());
      } else {
        size_t e = s.s.size();
        std::vector<std::pair<size_t, size_t>> rev;
        while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
          if (e < sep->s.size()) break;
          const size_t p = s.s.rfind(sep->s, e - sep->s.size());
          if (p == std::string::npos) break;
          rev.emplace_back(p + sep->s.size(), e);
          e = p;
        }
        parts.emplace_back(0, e);
        parts.insert(parts.end(), rev.rbegin(), rev.rend());
      }
      for (const auto& [b, e] : parts) {
        step();
        r.arr->push_back(substr(s, b, e));
      }
      return r;
    }
    // Whitespace split: runs of Unicode whitespace, no empty parts.
    const auto off = code_point_offsets(s.s);
    size_t n = 0;
    std::vector<std::pair<size_t, size_t>> parts;
    size_t k = 0;
    const size_t cps = off.size() - 1;
    while (k < cps) {
      while (k < cps && py_space(decode_at(s.s, off[k], &n))) ++k;
      if (k == cps) break;
      size_t j = k;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps;
        while (e > k && py_space(decode_at(s.s, off[e - 1], &n))) --e;
        parts.emplace_back(off[k], off[e]);
        break;
      }
      while (j < cps && !py_space(decode_at(s.s, off[j], &n))) ++j;
      parts.emplace_back(off[k], off[j]);
      k = j;
    }
    for (const auto& [b, e] : parts) r.arr->push_back(substr(s, b, e));
    return r;
  }

  Value strip(const Value& s, const Value* chars, bool left, bool right) {
    std::string set;
    const bool have = chars && chars->kind != Kind::kNone;
    if (have) {
      if (!chars->is_string()) error("strip arg must be a string or None");
      set = chars->s;
    }
    const auto [b, e] = py_strip_range(s.s, have ? &set : nullptr, left, right);
    return substr(s, b, e);
  }

  Value case_map(const Value& s, int mode) {  // 0 lower, 1 upper, 2 capitalize, 3 title
    std::string out;
    bool word_start = true;
    size_t n = 0;
    bool first = true;
    for (size_t p = 0; p < s.s.size(); p += n) {
      const char32_t c = decode_at(s.s, p, &n);
      char32_t m = c;
      const auto ci = static_cast<utf8proc_int32_t>(c);
      switch (mode) {
        case 0:
          m = static_cast<char32_t>(utf8proc_tolower(ci));
          break;
        case 1:
          m = static_cast<char32_t>(utf8proc_toupper(ci));
          break;
        case 2:
          m = static_cast<char32_t>(first ? utf8proc_toupper(ci) : utf8proc_tolower(ci));
          break;
        default: {
          m = static_cast<char32_t>(word_start ? utf8proc_toupper(ci) : utf8proc_tolower(ci));
          const auto cat = utf8proc_category(ci);
          word_start = !(cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) &&
                       !(cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
        }
      }
      first = false;
      append_utf8(m, out);
    }
    return derived(std::move(out), {&s});
  }

  Value replace(const Value& s, const Value& from, const Value& to, int64_t count) {
    if (!from.is_string() || !to.is_string()) error("replace() arguments must be strings");
    Value r = Value::str("");
    size_t b = 0;
    int64_t done = 0;
    if (from.s.empty()) {  // Python inserts `to` around every character
      const auto off = code_point_offsets(s.s);
      for (size_t k = 0; k + 1 < off.size(); ++k) {
        if (count >= 0 && done >= count) break;
        r = concat(r, to);
        r = concat(r, substr(s, off[k], off[k + 1]));
        b = off[k + 1];
        ++done;
      }
      if (count < 0 || done < count) return concat(concat(r, to), substr(s, b, s.s.size()));
      return concat(r, substr(s, b, s.s.size()));
    }
    for (size_t p = s.s.find(from.s); p != std::string::npos && (count < 0 || done < count); p = s.s.find(from.s, b)) {
      step();
      r = concat(r, substr(s, b, p));
      r = concat(r, to);
      b = p + from.s.size();
      ++done;
    }
    return concat(r, substr(s, b, s.s.size()));
  }

  Value join(const Value& seq, const Value& sep) {
    Value r = Value::str("");
    bool first = true;
    for (const Value& item : iterate(seq)) {
      step();
      if (!first) r = concat(r, sep);
      first = false;
      r = concat(r, as_string(item));
    }
    return r;
  }

  static std::string need_string(const Value* v) { return v && v->is_string() ? v->s : std::string(); }

  Value call_method(const Value& obj, const std::string& name, const Args& a) {
    auto arg_int = [&](size_t k, std::string_view n, int64_t def) {
      const Value* v = a.get(k, n);
      if (!v || v->kind == Kind::kNone) return def;
      if (v->kind != Kind::kInt) error(name + "(): '" + std::string(n) + "' must be an integer");
      return v->i;
    };
    if (obj.kind == Kind::kString) {
      const Value& s = obj;
      if (name == "startswith" || name == "endswith") {
        const Value* p = a.get(0, "prefix");
        if (!p) error(name + "() takes one argument");
        std::vector<Value> options = p->kind == Kind::kArray ? *p->arr : std::vector<Value>{*p};
        for (const Value& o : options) {
          if (!o.is_string()) error(name + "() argument must be a string or a tuple of strings");
          if (name == "startswith" ? s.s.starts_with(o.s) : s.s.ends_with(o.s)) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "split" || name == "rsplit")
        return split(s, a.get(0, "sep"), arg_int(1, "maxsplit", -1), name == "rsplit");
      if (name == "strip") return strip(s, a.get(0, "chars"), true, true);
      if (name == "lstrip") return strip(s, a.get(0, "chars"), true, false);
      if (name == "rstrip") return strip(s, a.get(0, "chars"), false, true);
      if (name == "lower") return case_map(s, 0);
      if (name == "upper") return case_map(s, 1);
      if (name == "capitalize") return case_map(s, 2);
      if (name == "title") return case_map(s, 3);
      if (name == "replace") {
        const Value *f = a.get(0, "old"), *t = a.get(1, "new");
        if (!f || !t) error("replace() takes two arguments");
        return replace(s, *f, *t, arg_int(2, "count", -1));
      }
      if (name == "find" || name == "rfind" || name == "count") {
        const Value* sub = a.get(0, "sub");
        if (!sub || !sub->is_string()) error(name + "() takes a string");
        if (name == "count") {
          if (sub->s.empty()) return Value::integer(static_cast<int64_t>(code_point_offsets(s.s).size()));
          int64_t c = 0;
          for (size_t p = s.s.find(sub->s); p != std::string::npos; p = s.s.find(sub->s, p + sub->s.size())) ++c;
          return Value::integer(c);
        }
        const size_t p = name == "find" ? s.s.find(sub->s) : s.s.rfind(sub->s);
        if (p == std::string::npos) return Value::integer(-1);
        return Value::integer(static_cast<int64_t>(code_point_offsets(s.s.substr(0, p)).size()) - 1);
      }
      if (name == "join") {
        const Value* seq = a.get(0, "iterable");
        if (!seq) error("join() takes one argument");
        return join(*seq, s);
      }
      if (name.starts_with("is")) {
        if (s.s.empty()) return Value::boolean(false);
        size_t n = 0;
        bool all = true, cased = false;
        for (size_t p = 0; p < s.s.size(); p += n) {
          const char32_t c = decode_at(s.s, p, &n);
          const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
          const bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
          const bool digit = cat == UTF8PROC_CATEGORY_ND;
          if (name == "isalpha") all = all && alpha;
          if (name == "isdigit") all = all && digit;
          if (name == "isalnum") all = all && (alpha || digit);
          if (name == "isspace") all = all && py_space(c);
          if (name == "islower") all = all && cat != UTF8PROC_CATEGORY_LU, cased = cased || cat == UTF8PROC_CATEGORY_LL;
          if (name == "isupper") all = all && cat != UTF8PROC_CATEGORY_LL, cased = cased || cat == UTF8PROC_CATEGORY_LU;
        }
        if (name == "islower" || name == "isupper") all = all && cased;
        return Value::boolean(all);
      }
    } else if (obj.kind == Kind::kObject) {
      if (name == "get") {
        const Value* k = a.get(0, "key");
        if (!k) error("get() takes a key");
        const Value* v = k->is_string() ? obj.obj->find(k->s) : nullptr;
        if (v) return *v;
        const Value* def = a.get(1, "default");
        return def ? *def : Value::none();
      }
      if (name == "items" || name == "keys" || name == "values") {
        Value r = Value::array();
        for (const auto& [k, v] : obj.obj->items) {
          step();
          Value key = Value::str(k, obj.obj->input);
          if (name == "items") {
            r.arr->push_back(Value::array({std::move(key), v}));
          } else {
            r.arr->push_back(name == "keys" ? std::move(key) : v);
          }
        }
        return r;
      }
    } else if (obj.kind == Kind::kArray) {
      auto& vec = *obj.arr;
      if (name == "append") {
        const Value* v = a.get(0, "object");
        if (!v) error("append() takes one argument");
        step();
        check_size(vec.size() + 1);
        vec.push_back(*v);
        return Value::none();
      }
      if (name == "extend") {
        const Value* v = a.get(0, "iterable");
        if (!v) error("extend() takes one argument");
        std::vector<Value> items = iterate(*v);
        check_size(vec.size() + items.size());
        vec.insert(vec.end(), items.begin(), items.end());
        return Value::none();
      }
      if (name == "insert") {
        const Value* v = a.get(1, "object");
        if (!v) error("insert() takes two arguments");
        check_size(vec.size() + 1);
        const int64_t k =
            std::clamp<int64_t>(norm_index(arg_int(0, "index", 0), vec.size()), 0, static_cast<int64_t>(vec.size()));
        vec.insert(vec.begin() + k, *v);
        return Value::none();
      }
      if (name == "pop") {
        if (vec.empty()) error("pop from empty list");
        const int64_t k = norm_index(arg_int(0, "index", -1), vec.size());
        if (k < 0 || k >= static_cast<int64_t>(vec.size())) error("pop index out of range");
        Value v = vec[static_cast<size_t>(k)];
        vec.erase(vec.begin() + k);
        return v;
      }
      if (name == "index") {
        const Value* v = a.get(0, "value");
        if (!v) error("index() takes one argument");
        for (size_t k = 0; k < vec.size(); ++k)
          if (equal(vec[k], *v)) return Value::integer(static_cast<int64_t>(k));
        error("index(): value is not in list");
      }
    }
    error("'" + std::string(kind_name(obj.kind)) + "' has no method '" + name + "'");
  }

  // --- tests ---

  bool eval_test(const std::string& name, const Value& v, const std::vector<ExprP>& arg_exprs,
                 const std::vector<std::pair<std::string, ExprP>>& kw) {
    Args a = eval_args(arg_exprs, kw);
    auto arg = [&]() -> const Value& {
      if (a.pos.empty()) error("test '" + name + "' takes an argument");
      return a.pos[0];
    };
    if (name == "defined") return v.kind != Kind::kUndefined;
    if (name == "undefined") return v.kind == Kind::kUndefined;
    if (name == "none") return v.kind == Kind::kNone;
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.kind == Kind::kObject;
    if (name == "iterable") return v.is_string() || v.kind == Kind::kArray || v.kind == Kind::kObject;
    if (name == "sequence") return v.is_string() || v.kind == Kind::kArray || v.kind == Kind::kObject;
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == Kind::kInt;
    if (name == "float") return v.kind == Kind::kFloat;
    if (name == "boolean") return v.kind == Kind::kBool;
    if (name == "true") return v.kind == Kind::kBool && v.b;
    if (name == "false") return v.kind == Kind::kBool && !v.b;
    if (name == "callable") return v.kind == Kind::kMacro || v.kind == Kind::kBuiltin;
    if (name == "escaped") return false;
    if (name == "lower" || name == "upper") {
      if (!v.is_string()) return false;
      return case_map(v, name == "lower" ? 0 : 1).s == v.s;
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.kind != Kind::kInt) error("test '" + name + "' needs an integer");
      if (name == "divisibleby") {
        const Value& d = arg();
        if (d.kind != Kind::kInt || d.i == 0) error("divisibleby needs a non-zero integer");
        return v.i % d.i == 0;
      }
      return (v.i % 2 != 0) == (name == "odd");
    }
    if (name == "in") return contains(arg(), v);
    if (name == "sameas") {
      const Value& o = arg();
      if (v.kind != o.kind) return false;
      if (v.kind == Kind::kArray) return v.arr == o.arr;
      if (v.kind == Kind::kObject) return v.obj == o.obj;
      return equal(v, o);
    }
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg());
    if (name == "ne" || name == "!=") return !equal(v, arg());
    // gt / lt / ge / le and their operator spellings.
    static const std::unordered_map<std::string, std::string> kOps = {
        {"gt", ">"}, {"lt", "<"}, {"ge", ">="}, {"le", "<="}, {">", ">"}, {"<", "<"}, {">=", ">="}, {"<=", "<="}};
    const auto it = kOps.find(name);
    if (it != kOps.end()) {
      Expr e{.kind = EK::kBinary, .line = line_, .name = it->second};
      e.a = std::make_unique<Expr>(Expr{.kind = EK::kLiteral, .line = line_, .literal = v});
      e.b = std::make_unique<Expr>(Expr{.kind = EK::kLiteral, .line = line_, .literal = arg()});
      return truthy(eval_binary(e));
    }
    error("unknown test '" + name + "'");
  }

  // --- filters ---

  Value eval_filter(const Expr& e) {
    Value v = eval(*e.a);
    Args a = eval_args(e.args, e.kwargs);
    line_ = e.line;
    return apply_filter(e.name, v, a);
  }

  // Selects items of `seq` by a test on the item or its attribute (select,
  // reject, selectattr, rejectattr).
  Value select(const Value& seq, const Args& a, bool by_attr, bool keep_if) {
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (a.pos.empty() || !a.pos[0].is_string()) error("selectattr/rejectattr need an attribute name");
      attr = a.pos[0].s;
      k = 1;
    }
    std::string test = k < a.pos.size() ? need_string(&a.pos[k]) : std::string();
    if (k < a.pos.size() && !a.pos[k].is_string()) error("the test name must be a string");
    if (!test.empty() && !test_names().contains(test)) error("unsupported test '" + test + "'");
    std::vector<ExprP> targs;
    for (size_t j = k + 1; j < a.pos.size(); ++j)
      targs.push_back(std::make_unique<Expr>(Expr{.kind = EK::kLiteral, .line = line_, .literal = a.pos[j]}));
    Value r = Value::array();
    for (const Value& item : iterate(seq)) {
      step();
      const Value subject = by_attr ? attr_path(item, attr) : item;
      const bool pass = test.empty() ? truthy(subject) : eval_test(test, subject, targs, {});
      if (pass == keep_if) r.arr->push_back(item);
    }
    return r;
  }

  // `attribute` of the map / sort / join filters: a dotted path ("a.b").
  Value attr_path(const Value& item, const std::string& path) {
    Value cur = item;
    size_t b = 0;
    while (true) {
      const size_t dot = path.find('.', b);
      const std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
      if (cur.kind == Kind::kArray && !part.empty() && std::isdigit(static_cast<unsigned char>(part[0]))) {
        cur = get_item(cur, Value::integer(std::stoll(part)));
      } else {
        cur = cur.kind == Kind::kObject ? get_attr(cur, part) : Value{};
      }
      if (dot == std::string::npos) return cur;
      b = dot + 1;
    }
  }

  // Sort order for sort / dictsort / min / max / unique (numbers, then
  // strings; case-insensitive unless case_sensitive).
  bool less(const Value& x, const Value& y, bool case_sensitive) {
    if ((x.is_number() || x.kind == Kind::kBool) && (y.is_number() || y.kind == Kind::kBool))
      return x.as_double() < y.as_double();
    if (x.is_string() && y.is_string()) {
      if (case_sensitive) return x.s < y.s;
      return case_map(x, 0).s < case_map(y, 0).s;
    }
    error(std::string("cannot compare ") + kind_name(x.kind) + " and " + kind_name(y.kind));
  }

  Value apply_filter(const std::string& name, const Value& v, const Args& a) {
    auto arg_bool = [&](size_t k, std::string_view n, bool def) {
      const Value* x = a.get(k, n);
      return x ? truthy(*x) : def;
    };
    auto need_str = [&]() {
      if (!v.is_string()) error("filter '" + name + "' needs a string, got " + kind_name(v.kind));
    };
    if (name == "safe" || name == "e" || name == "escape") return v;  // no autoescape in chat templates
    if (name == "tojson") {
      const Value* ind = a.get(0, "indent");
      int indent = -1;
      if (ind && ind->kind != Kind::kNone) {
        if (ind->kind != Kind::kInt || ind->i < 0 || ind->i > 64) error("tojson: indent must be an integer 0..64");
        indent = static_cast<int>(ind->i);
      }
      std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
      if (const Value* sep = a.get(99, "separators"); sep && sep->kind != Kind::kNone) {
        if (sep->kind != Kind::kArray || sep->arr->size() != 2 || !(*sep->arr)[0].is_string() ||
            !(*sep->arr)[1].is_string())
          error("tojson: separators must be a pair of strings");
        item_sep = (*sep->arr)[0].s;
        key_sep = (*sep->arr)[1].s;
      }
      for (const auto& [n, x] : a.kw)
        if (n != "indent" && n != "separators" && n != "sort_keys" && n != "ensure_ascii")
          error("tojson: unsupported argument '" + n + "'");
      if (const Value* ea = a.get(99, "ensure_ascii"); ea && truthy(*ea))
        error("tojson: ensure_ascii=True is not supported");
      std::string out;
      to_json(v, indent, item_sep, key_sep, arg_bool(99, "sort_keys", false), 0, out, line_);
      check_size(out.size());
      return derived(std::move(out), {&v});
    }
    if (name == "string") return as_string(v);
    if (name == "trim") {
      need_str();
      return strip(v, a.get(0, "chars"), true, true);
    }
    if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
      need_str();
      return case_map(v, name == "lower" ? 0 : name == "upper" ? 1 : name == "capitalize" ? 2 : 3);
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case Kind::kString:
          return Value::integer(static_cast<int64_t>(code_point_offsets(v.s).size()) - 1);
        case Kind::kArray:
          return Value::integer(static_cast<int64_t>(v.arr->size()));
        case Kind::kObject:
          return Value::integer(static_cast<int64_t>(v.obj->items.size()));
        case Kind::kUndefined:
          return Value::integer(0);
        default:
          error(std::string("object of type ") + kind_name(v.kind) + " has no length");
      }
    }
    if (name == "replace") {
      need_str();
      const Value *f = a.get(0, "old"), *t = a.get(1, "new");
      if (!f || !t) error("replace takes two arguments");
      const Value* c = a.get(2, "count");
      return replace(v, *f, *t, c && c->kind == Kind::kInt ? c->i : -1);
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      Value seq = v;
      if (attr) seq = apply_filter("map", v, Args{.kw = {{"attribute", *attr}}});
      return join(seq, sep ? as_string(*sep) : Value::str(""));
    }
    if (name == "default" || name == "d") {
      const Value* def = a.get(0, "default_value");
      const bool boolean = arg_bool(1, "boolean", false);
      if (v.kind == Kind::kUndefined || (boolean && !truthy(v))) return def ? *def : Value::str("");
      return v;
    }
    if (name == "first" || name == "last") {
      std::vector<Value> items = iterate(v);
      if (items.empty()) return Value{};
      return name == "first" ? items.front() : items.back();
    }
    if (name == "int" || name == "float") {
      const bool to_int = name == "int";
      const Value* def = a.get(0, "default");
      const Value fallback = def ? *def : to_int ? Value::integer(0) : Value::number(0);
      switch (v.kind) {
        case Kind::kInt:
          return to_int ? v : Value::number(static_cast<double>(v.i));
        case Kind::kFloat:
          return to_int ? Value::integer(static_cast<int64_t>(v.f)) : v;
        case Kind::kBool:
          return to_int ? Value::integer(v.b) : Value::number(v.b);
        case Kind::kString: {
          const auto [b, e] = py_strip_range(v.s, nullptr, true, true);
          const std::string t = v.s.substr(b, e - b);
          if (to_int) {
            int64_t x = 0;
            const auto r = std::from_chars(t.data() + (t.starts_with('+') ? 1 : 0), t.data() + t.size(), x);
            if (r.ec == std::errc() && r.ptr == t.data() + t.size() && !t.empty()) return Value::integer(x);
          }
          char* end = nullptr;
          const double d = std::strtod(t.c_str(), &end);
          if (!t.empty() && end == t.c_str() + t.size())
            return to_int ? Value::integer(static_cast<int64_t>(d)) : Value::number(d);
          return fallback;
        }
        default:
          return fallback;
      }
    }
    if (name == "abs") {
      if (v.kind == Kind::kInt) return Value::integer(v.i < 0 ? -v.i : v.i);
      if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
      error("abs needs a number");
    }
    if (name == "round") {
      if (!v.is_number()) error("round needs a number");
      const Value* p = a.get(0, "precision");
      const int64_t prec = p && p->kind == Kind::kInt ? p->i : 0;
      const Value* m = a.get(1, "method");
      const std::string method = m && m->is_string() ? m->s : "common";
      const double scale = std::pow(10.0, static_cast<double>(prec)), x = v.as_double() * scale;
      const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
      return Value::number(r / scale);
    }
    if (name == "items" || name == "dictsort") {
      if (v.kind == Kind::kUndefined) return Value::array();
      if (v.kind != Kind::kObject) error("filter '" + name + "' needs a dict, got " + kind_name(v.kind));
      Value r = call_method(v, "items", Args{});
      if (name == "dictsort") {
        const bool cs = arg_bool(0, "case_sensitive", false);
        const Value* by = a.get(1, "by");
        const size_t key = by && by->is_string() && by->s == "value" ? 1 : 0;
        std::stable_sort(r.arr->begin(), r.arr->end(),
                         [&](const Value& x, const Value& y) { return less((*x.arr)[key], (*y.arr)[key], cs); });
        if (arg_bool(2, "reverse", false)) std::reverse(r.arr->begin(), r.arr->end());
      }
      return r;
    }
    if (name == "list") return Value::array(iterate(v));
    if (name == "reverse") {
      if (v.is_string()) {
        Value r = Value::str("");
        const auto off = code_point_offsets(v.s);
        for (size_t k = off.size() - 1; k > 0; --k) r = concat(r, substr(v, off[k - 1], off[k]));
        return r;
      }
      std::vector<Value> items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::array(std::move(items));
    }
    if (name == "sort" || name == "unique" || name == "min" || name == "max") {
      const bool cs = arg_bool(name == "sort" ? 1 : 0, "case_sensitive", false);
      const Value* attr = a.get(name == "sort" ? 2 : 1, "attribute");
      std::vector<Value> items = iterate(v);
      auto key = [&](const Value& x) { return attr && attr->is_string() ? attr_path(x, attr->s) : x; };
      if (name == "unique") {
        std::vector<Value> out;
        for (const Value& x : items) {
          step();
          const Value kx = key(x);
          const bool seen = std::any_of(out.begin(), out.end(), [&](const Value& y) {
            const Value ky = key(y);
            if (!cs && kx.is_string() && ky.is_string()) return case_map(kx, 0).s == case_map(ky, 0).s;
            return equal(kx, ky);
          });
          if (!seen) out.push_back(x);
        }
        return Value::array(std::move(out));
      }
      steps_ += items.size();
      step();
      std::stable_sort(items.begin(), items.end(),
                       [&](const Value& x, const Value& y) { return less(key(x), key(y), cs); });
      if (name == "min") return items.empty() ? Value{} : items.front();
      if (name == "max") return items.empty() ? Value{} : items.back();
      if (arg_bool(0, "reverse", false)) std::reverse(items.begin(), items.end());
      return Value::array(std::move(items));
    }
    if (name == "sum") {
      const Value* attr = a.get(0, "attribute");
      const Value* start = a.get(1, "start");
      Value total = start ? *start : Value::integer(0);
      for (const Value& x : iterate(v)) {
        step();
        const Value item = attr && attr->is_string() ? attr_path(x, attr->s) : x;
        Expr e{.kind = EK::kBinary, .line = line_, .name = "+"};
        e.a = std::make_unique<Expr>(Expr{.kind = EK::kLiteral, .line = line_, .literal = total});
        e.b = std::make_unique<Expr>(Expr{.kind = EK::kLiteral, .line = line_, .literal = item});
        total = eval_binary(e);
      }
      return total;
    }
    if (name == "select" || name == "reject") return select(v, a, false, name == "select");
    if (name == "selectattr" || name == "rejectattr") return select(v, a, true, name == "selectattr");
    if (name == "map") {
      Value r = Value::array();
      for (const auto& [n, x] : a.kw) {
        if (n == "attribute") {
          if (!x.is_string()) error("map: attribute must be a string");
          const Value* def = a.get(99, "default");
          for (const Value& item : iterate(v)) {
            step();
            Value got = attr_path(item, x.s);
            r.arr->push_back(got.kind == Kind::kUndefined && def ? *def : got);
          }
          return r;
        }
      }
      if (a.pos.empty() || !a.pos[0].is_string()) error("map needs a filter name or attribute=");
      const std::string filter = a.pos[0].s;
      if (!filter_names().contains(filter)) error("unsupported filter '" + filter + "'");
      Args rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      for (const Value& item : iterate(v)) {
        step();
        r.arr->push_back(apply_filter(filter, item, rest));
      }
      return r;
    }
    if (name == "indent") {
      need_str();
      const Value* w = a.get(0, "width");
      Value pad =
          w && w->is_string()
              ? *w
              : Value::str(std::string(
                    w && w->kind == Kind::kInt ? static_cast<size_t>(std::clamp<int64_t>(w->i, 0, 256)) : 4, ' '));
      const bool first = arg_bool(1, "first", false), blank = arg_bool(2, "blank", false);
      Value r = Value::str("");
      size_t b = 0;
      bool is_first = true;
      while (b <= v.s.size()) {
        const size_t nl = v.s.find('\n', b);
        const size_t e = nl == std::string::npos ? v.s.size() : nl + 1;
        const Value line = substr(v, b, e);
        const bool empty = line.s == "\n" || line.s.empty();
        if ((is_first ? first : true) && (blank || !empty)) r = concat(r, pad);
        r = concat(r, line);
        is_first = false;
        if (nl == std::string::npos) break;
        b = e;
      }
      return r;
    }
    if (name == "wordcount") {
      need_str();
      return Value::integer(static_cast<int64_t>(split(v, nullptr, -1, false).arr->size()));
    }
    error("unknown filter '" + name + "'");
  }

  const Limits& limits_;
  std::vector<Frame> frames_;
  std::vector<Buffer> buffers_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int nesting_ = 0;
  int line_ = 0;
};

std::string located(const Failure& f) {
  return f.line > 0 ? "jinja: line " + std::to_string(f.line) + ": " + f.message : "jinja: " + f.message;
}

}  // namespace

core::Expected<Template> Template::parse(std::string_view source) {
  try {
    auto program = std::make_shared<Program>();
    program->body = Parser(Lexer(source).run()).parse_template();
    Template t;
    t.program_ = std::move(program);
    return t;
  } catch (const Failure& f) {
    return core::fail(f.code, located(f));
  }
}

core::Expected<Output> Template::render(const nlohmann::ordered_json& data, const nlohmann::ordered_json& trusted,
                                        const Limits& limits) const {
  if (!program_) return core::fail(core::Errc::kInvalidArgument, "jinja: render of an empty Template");
  try {
    return Renderer(limits).run(*program_, data, trusted);
  } catch (const Failure& f) {
    return core::fail(f.code, located(f));
  } catch (const std::bad_alloc&) {
    return core::fail(core::Errc::kResourceExhausted, "jinja: out of memory while rendering the template");
  }
}

void append_json_string(std::string_view s, std::string& out) {
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (sci.starts_with('-')) {
    out = "-";
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits.push_back(c);
  int exp = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp);
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

}  // namespace bonsai::tokenizer::jinja
