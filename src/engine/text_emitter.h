// TextEmitter: turns the byte pieces of generated tokens into text that is
// safe to show, doing both hold-backs of a streaming answer in one place:
//   - UTF-8: bytes of an incomplete character are held until it completes,
//     so no released piece ends inside a character;
//   - stop strings: text that could still be the start of a stop string is
//     held until it is known not to be one; when a stop string appears, the
//     text before it is released, the stop string and everything after it
//     are dropped, and the emitter is stopped.
// The concatenation of everything released equals the non-streamed answer.
// Used by InferenceEngine, one instance per generation (so per choice of a
// scheduler job); the server streams what it releases (JobEvent::text).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace bonsai::engine {

class TextEmitter {
 public:
  // `stop`: stop strings (UTF-8). Empty strings are ignored.
  explicit TextEmitter(std::vector<std::string> stop = {});

  // Appends `bytes` (one token's raw piece; may end or start mid-character)
  // and returns the text that is now safe to release (possibly empty).
  // After a stop string was found, returns "" and ignores input.
  std::string push(std::string_view bytes);

  // End of generation: releases everything still held. An incomplete UTF-8
  // sequence at the end, and any invalid byte anywhere, comes out as U+FFFD
  // (as a WHATWG-style decoder would). Idempotent; returns "" once stopped.
  std::string finish();

  // True once a stop string was found.
  bool stopped() const { return stopped_; }
  // Index in stop() of the stop string that matched (-1 if none).
  int matched_stop() const { return matched_stop_; }
  const std::vector<std::string>& stop() const { return stop_; }
  // Everything released so far (pushes plus finish), concatenated.
  const std::string& released() const { return released_; }

 private:
  // Moves complete, valid characters from raw_ to text_ (invalid bytes
  // become U+FFFD); leaves an incomplete trailing sequence in raw_ unless
  // `final` (then it becomes one U+FFFD).
  void decode_utf8(bool final);
  // Releases the part of text_ that cannot be (the start of) a stop string.
  std::string release(bool final);

  std::vector<std::string> stop_;
  std::string raw_;       // bytes not yet decoded (an incomplete character)
  std::string text_;      // decoded text not yet released (stop-string hold-back)
  std::string released_;  // everything released
  bool stopped_ = false;
  int matched_stop_ = -1;
};

}  // namespace bonsai::engine
