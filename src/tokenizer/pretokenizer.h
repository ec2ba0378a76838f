// Regex pre-tokenizer for byte-level BPE (internal to src/tokenizer): splits
// text into the "words" that BPE merges never cross.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace bonsai::tokenizer {

// A compiled split regex (PCRE2, UTF + UCP, JIT when available). Immutable
// and thread-safe after construction (match data is per call).
class RegexSplitter {
 public:
  // The pattern llama.cpp uses for `tokenizer.ggml.pre` = "qwen2"
  // (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2):
  //   (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
  //   |[^\r\n\p{L}\p{N}]?\p{L}+ |\p{N} | ?[^\s\p{L}\p{N}]+[\r\n]*
  //   |\s*[\r\n]+ |\s+(?!\S) |\s+
  // with \s spelled out as the Unicode White_Space set (what llama.cpp's
  // category tables and Hugging Face's regex treat as whitespace, U+0085
  // included; PCRE2's own \s would miss U+0085).
  static core::Expected<RegexSplitter> qwen2();
  // GPT-2's original pattern (llama.cpp's default for unknown `pre`):
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  static core::Expected<RegexSplitter> gpt2();
  // Any PCRE2 pattern (compiled with UTF | UCP). Errors: kInvalidArgument
  // with PCRE2's message and offset.
  static core::Expected<RegexSplitter> compile(const std::string& pattern);

  // Splits valid UTF-8 `text` into consecutive pieces covering all of it:
  // each regex match is a piece, and any text between matches (which these
  // patterns never leave) is a piece too. Views into `text`.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

}  // namespace bonsai::tokenizer
