#include "core/error.h"

namespace bonsai::core {

const char* errc_name(Errc code) {
  switch (code) {
    case Errc::kInvalidArgument:
      return "invalid_argument";
    case Errc::kNotFound:
      return "not_found";
    case Errc::kIo:
      return "io";
    case Errc::kFormat:
      return "format";
    case Errc::kUnsupported:
      return "unsupported";
    case Errc::kOutOfRange:
      return "out_of_range";
    case Errc::kResourceExhausted:
      return "resource_exhausted";
    case Errc::kCancelled:
      return "cancelled";
    case Errc::kTimeout:
      return "timeout";
    case Errc::kInternal:
      return "internal";
  }
  return "unknown";
}

}  // namespace bonsai::core
