// TextEmitter: UTF-8 assembly (tokenizer::append_valid_utf8: RFC 3629, one
// U+FFFD per maximal invalid subpart) and stop-string hold-back.
#include "engine/text_emitter.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"  // append_valid_utf8

namespace bonsai::engine {

TextEmitter::TextEmitter(std::vector<std::string> stop) {
  for (auto& s : stop) {
    if (!s.empty()) stop_.push_back(std::move(s));
  }
}

void TextEmitter::decode_utf8(bool final) {
  const size_t keep = tokenizer::append_valid_utf8(raw_, text_);
  raw_.erase(0, raw_.size() - keep);
  // At the end, an unfinished character (a valid prefix, 1-3 bytes) is one
  // maximal subpart: one U+FFFD.
  if (final && !raw_.empty()) {
    text_.append("\xEF\xBF\xBD");
    raw_.clear();
  }
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
