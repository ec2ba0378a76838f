#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>

namespace bonsai::tokenizer::unicode {

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t valid_utf8_length(std::string_view s, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[pos + i]); };
  const size_t avail = s.size() - pos;
  const uint8_t c0 = b(0);
  if (c0 < 0x80) return 1;
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;  // no overlongs
    if (c0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;  // no overlongs
    if (c0 == 0xF4) hi = 0x8F;  // ≤ U+10FFFF
  } else {
    return 0;
  }
  if (avail < len) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < len; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
  }
  return len;
}

uint32_t decode_utf8(std::string_view s, size_t pos, size_t len) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[pos + i])); };
  switch (len) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = valid_utf8_length(text, pos);
    if (len == 0) {
      append_utf8(kReplacement, out);
      pos += 1;
    } else {
      out.append(text.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

std::string nfc(std::string_view text) {
  // Fast path: every code point below U+0300 is NFC-stable (no combining
  // marks, no composition partners), so such text is already NFC. In UTF-8
  // those are the bytes < 0xCC as lead bytes (U+0300 = CC 80).
  // Continuation bytes are < 0xC0, so any byte >= 0xCC is a lead byte of a
  // code point >= U+0300.
  bool needs = false;
  for (char ch : text) {
    if (static_cast<uint8_t>(ch) >= 0xCC) {
      needs = true;
      break;
    }
  }
  if (!needs) return std::string(text);
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0 || dst == nullptr) {
    std::free(dst);
    return std::string(text);  // invalid input: leave unnormalized (callers sanitize first)
  }
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int, 0x200> to_byte{};  // all mapped code points are < U+0144
  ByteTables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_unicode[b] = printable ? b : next++;
      to_byte[to_unicode[b]] = static_cast<int>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_unicode() { return byte_tables().to_unicode; }

int unicode_to_byte(uint32_t cp) { return cp < byte_tables().to_byte.size() ? byte_tables().to_byte[cp] : -1; }

}  // namespace bonsai::tokenizer::unicode

namespace bonsai::tokenizer::unicode {

size_t valid_utf8_prefix(std::string_view s, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[pos + i]); };
  const uint8_t c0 = b(0);
  if (c0 < 0x80) return 1;
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;
    if (c0 == 0xED) hi = 0x9F;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;
    if (c0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  size_t k = 1;
  while (k < len && pos + k < s.size()) {
    const uint8_t c = b(k);
    const bool ok = (k == 1) ? (c >= lo && c <= hi) : ((c & 0xC0) == 0x80);
    if (!ok) break;
    ++k;
  }
  return k;
}

}  // namespace bonsai::tokenizer::unicode
