// bonsai::core error type. Every function that can fail on input returns
// `core::Expected<T>` (std::expected, C++23); exceptions never cross a part
// boundary. See ../shared/CONVENTIONS.md.
#pragma once

#include <expected>
#include <string>
#include <utility>

namespace bonsai::core {

// What kind of failure happened; the HTTP layer maps these to status codes.
enum class Errc {
  kInvalidArgument,    // a caller-supplied value is out of range / malformed (HTTP 400)
  kNotFound,           // a named thing (file, key, tensor, model) does not exist (404)
  kIo,                 // open/read/mmap failed (errno text in the message)
  kFormat,             // a file violates its format (GGUF rule broken)
  kUnsupported,        // well-formed but not supported (type, architecture, ISA tier)
  kOutOfRange,         // e.g. prompt + max_tokens beyond the context
  kResourceExhausted,  // memory budget, queue full
  kCancelled,          // the caller cancelled (client disconnected)
  kTimeout,            // a deadline passed
  kInternal,           // our own invariant broke; reported, never asserted on input
};

// Human-readable name of an error code ("format", "io", ...).
const char* errc_name(Errc code);

// An error: a code plus a message that names the input (file, field, offset)
// and says what was expected. Value type; cheap to move.
struct Error {
  Errc code = Errc::kInternal;
  std::string message;
};

template <class T>
using Expected = std::expected<T, Error>;

// Builds the unexpected value for `return fail(...)` in an Expected-returning function.
inline std::unexpected<Error> fail(Errc code, std::string message) {
  return std::unexpected<Error>(Error{code, std::move(message)});
}

}  // namespace bonsai::core
