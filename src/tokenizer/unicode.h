// UTF-8 and Unicode helpers for the tokenizers (internal to src/tokenizer).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace bonsai::tokenizer::unicode {

inline constexpr uint32_t kReplacement = 0xFFFD;

// Appends the UTF-8 encoding of code point `cp` (≤ 0x10FFFF) to `out`.
void append_utf8(uint32_t cp, std::string& out);

// Length in bytes of the strictly valid UTF-8 sequence starting at
// `s[pos]` (1..4), or 0 when the bytes there are not a complete valid
// sequence (bad lead byte, bad/missing continuation, overlong, surrogate,
// beyond U+10FFFF). Rules: Unicode 15, Table 3-7 "Well-Formed UTF-8".
size_t valid_utf8_length(std::string_view s, size_t pos);

// Decodes the valid sequence of length `len` (from valid_utf8_length) at `pos`.
uint32_t decode_utf8(std::string_view s, size_t pos, size_t len);

// `text` with every byte that does not start a valid UTF-8 sequence replaced
// by U+FFFD (one per byte, as llama.cpp's unicode_cpts_from_utf8 does).
// Returns `text` unchanged (no copy needed by callers checking equality) when
// it is valid.
std::string sanitize_utf8(std::string_view text);

// Unicode NFC of valid UTF-8 `text` via utf8proc (utf8proc_map with
// UTF8PROC_STABLE | UTF8PROC_COMPOSE). Text whose code points are all below
// U+0300 is already NFC and returned as is without calling utf8proc.
std::string nfc(std::string_view text);

// GPT-2's bytes_to_unicode table (openai/gpt-2 encoder.py): bytes 0x21..0x7E,
// 0xA1..0xAC and 0xAE..0xFF map to themselves; the other 68 bytes map, in
// increasing order, to U+0100, U+0101, ...
const std::array<uint32_t, 256>& byte_to_unicode();

// Inverse of byte_to_unicode: the byte for code point `cp`, or -1.
int unicode_to_byte(uint32_t cp);

}  // namespace bonsai::tokenizer::unicode

namespace bonsai::tokenizer::unicode {

// Number of bytes from `pos` that form a prefix of some valid UTF-8 sequence:
// 0 when s[pos] cannot start one, the full length when the sequence is
// complete and valid, and 1..len-1 when it is valid so far but cut off (by
// the end of `s` or by an invalid byte). Unicode "maximal subpart" rule.
size_t valid_utf8_prefix(std::string_view s, size_t pos);

}  // namespace bonsai::tokenizer::unicode
