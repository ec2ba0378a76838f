// Model, health, metrics and admin routes. See routes_admin.h.
#include "server/routes_admin.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/load_fit.h"           // check_load_fit
#include "engine/model_spec_fields.h"  // set_model_field (the load body's ModelSpec fields)
#include "server/config.h"             // model_id_error, kMaxModelIdBytes
#include "server/web_ui.h"             // GET /: the embedded web chat page

namespace bonsai::server {

using json = nlohmann::json;

namespace {

// The handlers, shared by the registered routes (they hold it alive).
struct AdminRoutes {
  explicit AdminRoutes(ServerContext& c) : ctx_(c) {}

  ServerContext& ctx_;
  std::mutex scrape_mu_;  // one /metrics refresh + exposition at a time

  void handle_metrics(HttpResponse& res) {
    std::string text;
    {
      // refresh_model_gauges clears the per-model gauges and sets them
      // again: a concurrent scrape exposing in between would miss those series.
      std::lock_guard lock(scrape_mu_);
      refresh_model_gauges(ctx_.metrics, *ctx_.models);
      text = ctx_.metrics.expose();
    }
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  }

  // Models a request may name: registered ones (loadable on demand) and
  // resident ones; a failed load of an unregistered id is not one (it is
  // listed, with its reason, by GET /admin/models only).
  std::vector<std::string> all_model_ids() const { return served_model_ids(*ctx_.models); }

  // A /v1/models entry: OpenAI's model object plus the context length the
  // model is served with, as `context_length` (OpenRouter's / LM Studio's
  // name) and `max_model_len` (vLLM's): served_context_length (a registered
  // model not loaded now: its ctx-size, or its GGUF's context_length capped
  // at 4096; the fields are left out when its file cannot be read).
  json model_entry(const std::string& id) const {
    json j = model_object(id, created_of(id));
    const int64_t n_ctx = served_context_length(*ctx_.models, id);
    if (n_ctx > 0) {
      j["context_length"] = n_ctx;
      j["max_model_len"] = n_ctx;
    }
    return j;
  }

  int64_t created_of(const std::string& id) const {
    for (const auto& m : ctx_.models->list())
      if (m.id == id && m.created_unix > 0) return static_cast<int64_t>(m.created_unix);
    return ctx_.started_unix;
  }

  void handle_models(HttpResponse& res) {
    json data = json::array();
    for (const auto& id : all_model_ids()) data.push_back(model_entry(id));
    send_json(res, 200, json{{"object", "list"}, {"data", data}});
  }

  void handle_model(const std::string& id, HttpResponse& res) {
    auto ids = all_model_ids();
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
      ApiError e;
      e.status = 404;
      e.message = "The model '" + id + "' does not exist";
      e.param = "model";
      e.code = "model_not_found";
      return send_error(res, e);
    }
    send_json(res, 200, model_entry(id));
  }

  // The model rows of /admin/models and /health. `with_files`: include each
  // model's file path and failure reason (they name server paths and file
  // contents; /health is not behind --api-key, so it omits them when a key is set).
  json models_json(bool with_files = true) const {
    json arr = json::array();
    for (const auto& m : ctx_.models->list()) {
      json j{{"id", m.id},
             {"state", engine::model_state_name(m.state)},
             {"in_flight", m.in_flight},
             {"mem_bytes", m.mem_bytes},
             {"pool_size", m.pool_size},
             {"busy", m.busy},
             {"parallel", m.parallel},
             {"running", m.running}};
      if (m.kv_capacity_bytes > 0) {
        // The model's KV block pool: its budget, the bytes of blocks not free
        // (running sequences' and cached prefixes'), of those the prompt cache
        // only (evictable), and the running sequences' (pinned).
        j["kv_capacity_bytes"] = m.kv_capacity_bytes;
        j["kv_used_bytes"] = m.kv_used_bytes;
        j["kv_cached_bytes"] = m.kv_cached_bytes;
        j["kv_pinned_bytes"] = m.kv_pinned_bytes;
        j["kv_block_tokens"] = m.kv_block_tokens;
      }
      if (m.state_snapshot_budget_bytes > 0 || m.recurrent_state_budget_bytes > 0) {
        // A hybrid model's recurrent state: held by its running sequences now
        // (count and bytes), their bound, and the prompt cache's snapshots.
        j["recurrent_state_bytes"] = m.recurrent_state_bytes;
        j["recurrent_states"] = m.recurrent_states;
        j["recurrent_state_budget_bytes"] = m.recurrent_state_budget_bytes;
        j["state_snapshot_bytes"] = m.state_snapshot_bytes;
        j["state_snapshot_budget_bytes"] = m.state_snapshot_budget_bytes;
        j["state_snapshots"] = m.state_snapshots;
      }
      if (with_files) j["path"] = m.path;
      if (with_files && m.state == engine::ModelState::kFailed) j["reason"] = m.reason;
      arr.push_back(std::move(j));
    }
    return arr;
  }

  // 200 "ok" while a model is loaded; 503 "shutting_down", "draining"
  // (Server::drain: load balancers stop sending here), "loading" or "unavailable".
  void handle_health(HttpResponse& res) {
    const size_t loaded = ctx_.models->loaded_count();
    const bool down = ctx_.stopping || ctx_.draining;
    json body{{"status", ctx_.stopping   ? "shutting_down"
                         : ctx_.draining ? "draining"
                         : loaded > 0    ? "ok"
                                         : "unavailable"},
              {"models_loaded", loaded},
              {"models", models_json(/*with_files=*/ctx_.opt.api_key.empty())}};
    if (loaded == 0 && !down) {
      for (const auto& m : ctx_.models->list())
        if (m.state == engine::ModelState::kLoading) body["status"] = "loading";
    }
    send_json(res, loaded > 0 && !down ? 200 : 503, body);
  }

  void handle_admin_list(HttpResponse& res) {
    send_json(res, 200,
              json{{"object", "list"},
                   {"data", models_json()},
                   {"capacity", ctx_.models->capacity()},
                   {"mem_budget_bytes", ctx_.models->mem_budget_bytes()},
                   {"mem_bytes", ctx_.models->current_mem_bytes()}});
  }

  static std::optional<ApiError> parse_admin_body(const std::string& body_text, json& body) {
    if (json_nesting_exceeds(body_text, kMaxJsonDepth))
      return bad_request("The request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels.", {},
                         "invalid_json");
    body = json::parse(body_text, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return bad_request("The request body must be a JSON object.", {}, "invalid_json");
    auto id = body.find("id");
    if (id == body.end() || !id->is_string() || id->get<std::string>().empty())
      return bad_request("Missing required parameter: 'id' (a non-empty string).", "id", "missing_required_parameter");
    // Ids end up in /v1/models, /metrics labels and logs: keep them bounded.
    if (id->get_ref<const std::string&>().size() > kMaxModelIdBytes)
      return bad_request("Invalid 'id': longer than " + std::to_string(kMaxModelIdBytes) + " bytes.", "id",
                         "invalid_value");
    return std::nullopt;
  }

  void handle_admin_load(const std::string& body_text, HttpResponse& res) {
    json body;
    if (auto e = parse_admin_body(body_text, body)) return send_error(res, *e);
    const std::string id = body["id"].get<std::string>();
    // A new id follows -m ID=FILE's rule (unload takes any id a model has).
    if (auto why = model_id_error(id))
      return send_error(res, bad_request("Invalid 'id': " + *why + ".", "id", "invalid_value"));
    // With a path: the server's defaults for that file; without: the id's
    // registration. Either way pool_size / ctx_size / q2_layout in the body override.
    engine::ModelSpec spec = ctx_.opt.default_spec;
    auto path = body.find("path");
    if (path != body.end()) {
      if (!path->is_string())
        return send_error(res, bad_request("Invalid type for 'path': expected a string.", "path", "invalid_type"));
      spec.path = path->get<std::string>();
    } else if (auto reg = ctx_.models->registration(id)) {
      spec = *reg;
    } else {
      return send_error(res, bad_request("Missing required parameter: 'path' (model '" + id + "' is not registered).",
                                         "path", "missing_required_parameter"));
    }
    // Every model field (engine::model_fields(), by its canonical name):
    // absent or null keeps the registration's (a new path: the server's).
    if (auto e = apply_admin_model_fields(body, spec)) return send_error(res, *e);
    std::error_code ec;
    if (path != body.end() && !std::filesystem::is_regular_file(spec.path, ec))
      return send_error(
          res, bad_request("Invalid 'path': " + spec.path + " is not a readable file.", "path", "invalid_value"));
    auto given = [&](const char* f) { return body.contains(f) && !body[f].is_null(); };
    if (auto e = check_load_fits(id, spec, given("ctx_size"), given("pool_size"))) return send_error(res, *e);
    // Registers and loads as one step: a refused or failed load leaves the
    // id's previous registration (the file a served model reloads from) alone.
    core::Expected<void> r = ctx_.models->load_in_background(id, spec);
    if (!r) {
      ApiError e = from_core_error(r.error());
      switch (r.error().code) {
        case core::Errc::kInvalidArgument:  // the id is loading or loaded
          e.status = 409;
          e.code = "conflict";
          break;
        case core::Errc::kResourceExhausted:  // no room: the models holding it are busy (named in the message)
          e = overloaded(r.error().message, "insufficient_capacity", 5);
          break;
        case core::Errc::kFormat:       // not a GGUF file, truncated, tensor past the end...
        case core::Errc::kUnsupported:  // an architecture or tensor type this runtime does not run
        case core::Errc::kIo:           // unreadable
        case core::Errc::kNotFound:     // a required key or tensor is missing (not a 404 route)
          e.status = 400;
          e.param = "path";
          e.code = "invalid_value";
          break;
        default:
          break;
      }
      return send_error(res, e);
    }
    send_json(res, 202, json{{"id", id}, {"state", "loading"}});
  }

  // Refuses an admin load before anything is allocated (engine::check_load_fit).
  std::optional<ApiError> check_load_fits(const std::string& id, const engine::ModelSpec& spec, bool ctx_given,
                                          bool pool_given) const {
    auto refusal = engine::check_load_fit(id, spec, ctx_given, pool_given, ctx_.models->mem_budget_bytes(),
                                          ctx_.opt.admin_mem_limit_bytes);
    if (!refusal) return std::nullopt;
    return bad_request(std::move(refusal->message), std::move(refusal->param), std::move(refusal->code));
  }

  void handle_admin_unload(const std::string& body_text, HttpResponse& res) {
    json body;
    if (auto e = parse_admin_body(body_text, body)) return send_error(res, *e);
    const std::string id = body["id"].get<std::string>();
    auto r = ctx_.models->unload(id);
    if (!r) {
      ApiError e = from_core_error(r.error());
      if (r.error().code == core::Errc::kNotFound) e.code = "model_not_loaded";
      if (r.error().code == core::Errc::kInvalidArgument) {
        e.status = 409;
        e.code = "conflict";
      }
      return send_error(res, e);
    }
    send_json(res, 200, json{{"id", id}, {"state", "unloaded"}});
  }
};

}  // namespace

std::optional<ApiError> apply_admin_model_fields(const json& body, engine::ModelSpec& spec) {
  // Only "id", "path" and the model fields by their canonical names: a
  // misspelled or dashed key is refused, not silently ignored.
  for (const auto& item : body.items()) {
    const std::string& key = item.key();
    if (key == "id" || key == "path") continue;
    const engine::ModelFieldInfo* f = engine::find_model_field(key);
    if (f == nullptr || f->name != key)
      return bad_request("Unrecognized request argument supplied: '" + key + "'.", key, "unknown_parameter");
  }
  for (const engine::ModelFieldInfo& f : engine::model_fields()) {
    const std::string name(f.name);
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    engine::FieldValue value;
    if (it->is_number_integer())
      value = it->get<int64_t>();
    else if (it->is_number_float())
      value = it->get<double>();
    else if (it->is_boolean())
      value = it->get<bool>();
    else if (it->is_string())
      value = it->get<std::string>();
    auto r = engine::set_model_field(spec, name, value);
    if (r) continue;
    if (r.error().kind == engine::FieldErrorKind::kWrongType)
      return bad_request("Invalid type for '" + name + "': " + r.error().message + ".", name, "invalid_type");
    return bad_request("Invalid '" + name + "': " + r.error().message + ".", name, "invalid_value");
  }
  return std::nullopt;
}

void add_admin_routes(HttpTransport& http, ServerContext& ctx) {
  auto r = std::make_shared<AdminRoutes>(ctx);
  for (const char* path : {"/v1/models", "/models"})  // the second: llama-server's name without /v1
    http.get(path, [r](const HttpRequest&, HttpResponse& res) { r->handle_models(res); });
  http.get("/v1/models/*", [r](const HttpRequest& req, HttpResponse& res) {
    r->handle_model(req.path.substr(std::string_view("/v1/models/").size()), res);
  });
  http.get("/health", [r](const HttpRequest&, HttpResponse& res) { r->handle_health(res); });
  // The web chat page (web_ui.h): public like /health; the API calls it
  // makes carry the key the user enters in its settings.
  http.get("/", [](const HttpRequest&, HttpResponse& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Content-Type-Options", "nosniff");
    const std::string_view page = web_ui_html();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  http.get("/metrics", [r](const HttpRequest&, HttpResponse& res) { r->handle_metrics(res); });
  http.get("/admin/models", [r](const HttpRequest&, HttpResponse& res) { r->handle_admin_list(res); });
  auto bad_body = [](const HttpRequest&, HttpResponse& res) {
    send_error(res, bad_request("The request body must be JSON (got multipart/form-data).", {}, "invalid_json"));
  };
  http.post_json(
      "/admin/models/load",
      [r](const HttpRequest&, const std::string& body, HttpResponse& res) { r->handle_admin_load(body, res); },
      bad_body);
  http.post_json(
      "/admin/models/unload",
      [r](const HttpRequest&, const std::string& body, HttpResponse& res) { r->handle_admin_unload(body, res); },
      bad_body);
}

}  // namespace bonsai::server
