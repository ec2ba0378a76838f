// TextEmitter: UTF-8 assembly (RFC 3629, Unicode "maximal subpart" rule for
// U+FFFD substitution) and stop-string hold-back.
#include "engine/text_emitter.h"

#include <algorithm>

namespace bonsai::engine {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the sequence a lead byte starts (0: not a valid lead byte), and
// the allowed range of the second byte (RFC 3629 table, excluding overlongs
// and surrogates).
struct Lead {
  int len;
  unsigned char lo, hi;
};
Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

TextEmitter::TextEmitter(std::vector<std::string> stop) {
  for (auto& s : stop) {
    if (!s.empty()) stop_.push_back(std::move(s));
  }
}

void TextEmitter::decode_utf8(bool final) {
  size_t i = 0;
  const size_t n = raw_.size();
  while (i < n) {
    const auto b = static_cast<unsigned char>(raw_[i]);
    const Lead lead = lead_of(b);
    if (lead.len == 1) {
      text_.push_back(raw_[i++]);
      continue;
    }
    if (lead.len == 0) {  // stray continuation byte or invalid lead
      text_.append(kReplacement);
      ++i;
      continue;
    }
    // Count how many bytes of a valid sequence are present.
    int have = 1;
    bool broken = false;
    while (have < lead.len && i + have < n) {
      const auto c = static_cast<unsigned char>(raw_[i + have]);
      const bool ok = have == 1 ? (c >= lead.lo && c <= lead.hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) {
        broken = true;
        break;
      }
      ++have;
    }
    if (have == lead.len) {
      text_.append(raw_, i, static_cast<size_t>(have));
      i += static_cast<size_t>(have);
    } else if (broken || final) {
      // The maximal subpart [i, i + have) becomes one U+FFFD.
      text_.append(kReplacement);
      i += static_cast<size_t>(have);
    } else {
      break;  // incomplete but valid so far: wait for more bytes
    }
  }
  raw_.erase(0, i);
}

std::string TextEmitter::release(bool final) {
  // Earliest stop-string occurrence (ties: the first listed).
  size_t best = std::string::npos;
  int which = -1;
  for (size_t k = 0; k < stop_.size(); ++k) {
    const size_t pos = text_.find(stop_[k]);
    if (pos < best) {
      best = pos;
      which = static_cast<int>(k);
    }
  }
  std::string out;
  if (which >= 0) {
    out = text_.substr(0, best);
    stopped_ = true;
    matched_stop_ = which;
    text_.clear();
    raw_.clear();
  } else if (final) {
    out.swap(text_);
  } else {
    // Hold the longest suffix of text_ that is a proper prefix of a stop string.
    size_t hold = 0;
    for (const auto& s : stop_) {
      const size_t max_len = std::min(s.size() - 1, text_.size());
      for (size_t len = max_len; len > hold; --len) {
        if (text_.compare(text_.size() - len, len, s, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
    out = text_.substr(0, text_.size() - hold);
    text_.erase(0, text_.size() - hold);
  }
  released_ += out;
  return out;
}

std::string TextEmitter::push(std::string_view bytes) {
  if (stopped_) return {};
  raw_.append(bytes);
  decode_utf8(false);
  return release(false);
}

std::string TextEmitter::finish() {
  if (stopped_) return {};
  decode_utf8(true);
  return release(true);
}

}  // namespace bonsai::engine
