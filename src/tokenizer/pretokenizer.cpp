#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace bonsai::tokenizer {

namespace {

// Unicode White_Space (PropList.txt): what llama.cpp's unicode tables and
// Hugging Face treat as \s. Written as class contents, to be put inside [...].
constexpr std::string_view kWs =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Replaces the tokens "\s" / "\S" / "WS" (inside a class) in a template pattern.
std::string expand(std::string_view tmpl) {
  std::string out;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl.compare(i, 4, "{WS}") == 0) {  // inside a character class
      out.append(kWs);
      i += 3;
    } else if (tmpl.compare(i, 2, "\\s") == 0) {
      out.append("[").append(kWs).append("]");
      i += 1;
    } else if (tmpl.compare(i, 2, "\\S") == 0) {
      out.append("[^").append(kWs).append("]");
      i += 1;
    } else {
      out.push_back(tmpl[i]);
    }
  }
  return out;
}

}  // namespace

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

core::Expected<RegexSplitter> RegexSplitter::compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return core::fail(
        core::Errc::kInvalidArgument,
        "pre-tokenizer regex: " + std::string(reinterpret_cast<char*>(msg)) + " at offset " + std::to_string(err_off));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; interpreter if unavailable
  RegexSplitter s;
  auto c = std::make_shared<Code>();
  c->code = code;
  s.code_ = std::move(c);
  return s;
}

core::Expected<RegexSplitter> RegexSplitter::qwen2() {
  return compile(
      expand("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
             "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
             "|\\p{N}"
             "| ?[^{WS}\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+"
             "|\\s+(?!\\S)"
             "|\\s+"));
}

core::Expected<RegexSplitter> RegexSplitter::qwen35() {
  return compile(
      expand("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
             "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+"
             "|\\p{N}"
             "| ?[^{WS}\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+"
             "|\\s+(?!\\S)"
             "|\\s+"));
}

core::Expected<RegexSplitter> RegexSplitter::gpt2() {
  return compile(expand("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^{WS}\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"));
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t last_end = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // JIT stack exhausted or similar: retry with the interpreter (heap-based).
      rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc < 0) break;  // no further match (or a persistent error): rest is one piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0];
    size_t end = ov[1];
    if (start > last_end) pieces.push_back(text.substr(last_end, start - last_end));
    if (end == start) {
      // Empty match (not produced by our patterns): step one code point.
      end = start + 1;
      while (end < text.size() && (static_cast<uint8_t>(text[end]) & 0xC0) == 0x80) ++end;
    }
    pieces.push_back(text.substr(start, end - start));
    last_end = end;
    pos = end;
  }
  if (last_end < text.size()) pieces.push_back(text.substr(last_end));
  pcre2_match_data_free(md);
  return pieces;
}

}  // namespace bonsai::tokenizer
