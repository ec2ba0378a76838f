// Helpers shared by the server's route files. See routes_common.h.
#include "server/routes_common.h"

#include <chrono>
#include <string>

namespace bonsai::server {

using json = nlohmann::json;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_json(HttpResponse& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(HttpResponse& res, const ApiError& e) {
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  send_json(res, e.status, e.to_json());
}

ApiError from_core_error(const core::Error& e, int default_status) {
  ApiError a;
  a.message = e.message;
  switch (e.code) {
    case core::Errc::kInvalidArgument:
    case core::Errc::kOutOfRange:
      a.status = 400;
      break;
    case core::Errc::kNotFound:
      a.status = 404;
      break;
    case core::Errc::kResourceExhausted:
    case core::Errc::kTimeout:
    case core::Errc::kCancelled:
      a = overloaded(e.message, "overloaded", 1);
      break;
    default:
      a.status = default_status;
      if (default_status >= 500) a.type = "server_error";
      break;
  }
  return a;
}

}  // namespace bonsai::server
