// Helpers shared by the server's route files. See routes_common.h.
#include "server/routes_common.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/inference_engine.h"  // kDefaultMaxSeqLen
#include "gguf/gguf.h"                // File (context_length of a model not loaded)

namespace bonsai::server {

using json = nlohmann::json;

namespace {

// `<arch>.context_length` of the GGUF at `path` (0: unreadable or absent),
// cached per (path, size, mtime) so listing models does not parse headers again.
int64_t gguf_context_length(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return 0;
  const auto mtime = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  if (ec) return 0;
  struct Entry {
    uint64_t size;
    int64_t mtime;
    int64_t n_ctx;
  };
  static std::mutex mu;  // guards cache
  static std::map<std::string, Entry> cache;
  {
    std::lock_guard lock(mu);
    if (auto it = cache.find(path); it != cache.end() && it->second.size == size && it->second.mtime == mtime)
      return it->second.n_ctx;
  }
  int64_t n_ctx = 0;
  if (auto f = gguf::File::open(path)) {
    if (auto arch = (*f)->get<std::string>("general.architecture"))
      if (auto n = (*f)->get<int64_t>(*arch + ".context_length"); n && *n > 0) n_ctx = *n;
  }
  std::lock_guard lock(mu);
  cache[path] = Entry{size, static_cast<int64_t>(mtime), n_ctx};
  return n_ctx;
}

}  // namespace

int64_t served_context_length(const engine::ModelPool& pool, const std::string& id) {
  if (auto m = pool.peek(id); m && m->n_ctx > 0) return m->n_ctx;
  const auto reg = pool.registration(id);
  if (!reg) return 0;
  if (reg->ctx_size > 0) return reg->ctx_size;
  const int64_t trained = gguf_context_length(reg->path);
  return std::min(trained > 0 ? trained : engine::kDefaultMaxSeqLen, engine::kDefaultMaxSeqLen);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
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

std::vector<std::string> served_model_ids(const engine::ModelPool& pool) {
  std::set<std::string> ids;
  for (const auto& id : pool.registered_ids()) ids.insert(id);
  for (const auto& m : pool.list())
    if (m.state != engine::ModelState::kFailed) ids.insert(m.id);
  return {ids.begin(), ids.end()};
}

std::expected<engine::ModelHandle, ApiError> acquire_model(ServerContext& ctx, const std::string& id) {
  std::string model_id = id.empty() ? ctx.opt.default_model : id;
  if (model_id.empty()) return std::unexpected(bad_request("You must provide a model parameter.", "model"));
  // One model served: any name means it (llama-server's habit), unless strict.
  if (!ctx.opt.strict_model_names && !ctx.models->is_registered(model_id)) {
    const std::vector<std::string> ids = served_model_ids(*ctx.models);
    if (ids.size() == 1 && ids.front() != model_id) model_id = ids.front();
  }
  auto model = ctx.models->acquire(model_id);
  if (model) return std::move(*model);
  const core::Error& err = model.error();
  // 404 only for an id that names no model: a registered model whose file
  // fails to load (e.g. a missing GGUF key, also kNotFound) is a server-side failure.
  if (err.code == core::Errc::kNotFound && !ctx.models->is_registered(model_id)) {
    ApiError e;
    e.status = 404;
    e.message = "The model '" + model_id + "' does not exist or you do not have access to it.";
    e.param = "model";
    e.code = "model_not_found";
    return std::unexpected(e);
  }
  if (err.code == core::Errc::kResourceExhausted) {
    // Loading elsewhere (retry soon), or no room in the budget / slots right now.
    bool loading = false;
    for (const auto& m : ctx.models->list())
      loading = loading || (m.id == model_id && m.state == engine::ModelState::kLoading);
    return std::unexpected(loading ? overloaded(err.message, "model_loading", 2)
                                   : overloaded(err.message, "insufficient_capacity", 5));
  }
  ApiError e;  // the file, not the request, is at fault: 500 whatever the loader's code
  e.status = 500;
  e.type = "server_error";
  e.code = "model_load_failed";
  e.message = "Model '" + model_id + "' could not be loaded: " + err.message;
  return std::unexpected(e);
}

ApiError draining_error() {
  return overloaded(
      "The server is draining before it stops (SIGTERM): requests already running finish, new and queued ones are "
      "refused. Retry on another instance or once this one has restarted.",
      "draining", 5);
}

ApiError job_cut_error(bool client_gone) {
  if (client_gone) {
    ApiError e;
    e.status = 499;
    e.type = "client_closed_request";
    e.message = "The client closed the connection before the answer was ready.";
    return e;
  }
  return overloaded("The server is shutting down.", "shutting_down", 5);
}

ApiError job_failure_error(const ServerContext& ctx, const core::Error& e, const std::string& model_id,
                           bool client_gone) {
  switch (e.code) {
    case core::Errc::kTimeout:
      return overloaded("The request timed out waiting for an engine replica.", "timeout", 1);
    case core::Errc::kCancelled:
      return job_cut_error(client_gone);
    case core::Errc::kUnsupported:
      // What the request asked for is beyond the engine (e.g. a grammar
      // whose start exceeds the matcher's limits): the request's fault, not
      // the server's, and retrying it cannot help.
      return from_core_error(core::Error{core::Errc::kInvalidArgument, e.message}, 400);
    case core::Errc::kResourceExhausted:
      if (ctx.stopping) return overloaded("The server is shutting down.", "shutting_down", 5);
      if (ctx.draining) return draining_error();
      return overloaded("Model '" + model_id +
                            "' was unloaded (by /admin/models/unload, or to make room for another model) before "
                            "this request started. Send it again to load the model again.",
                        "model_unloaded", 1);
    default:
      return from_core_error(e, 500);
  }
}

}  // namespace bonsai::server
