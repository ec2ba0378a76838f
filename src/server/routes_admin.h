// The server's model, health, metrics and admin routes (internal to
// src/server):
//   GET /v1/models, GET /v1/models/{id}   OpenAI model list / object
//   GET /health                           200 when a model is loaded, else 503
//                                         (status loading / unavailable / shutting_down)
//   GET /                                 the embedded web chat page (web_ui.h)
//   GET /metrics                          Prometheus text (metrics.h)
//   GET /admin/models                     every model with state, memory, replicas
//   POST /admin/models/load               202, background load; 400 before anything
//                                         is allocated when ctx_size exceeds the model
//                                         or the KV caches exceed the memory limit
//   POST /admin/models/unload             200; 404 model_not_loaded; 409 while loading
// Authorization of /v1 and /admin is checked before routing (server.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "engine/model_pool.h"     // ModelSpec
#include "server/routes_common.h"  // ServerContext, ApiError
#include "server/transport.h"      // HttpTransport

namespace bonsai::server {

// Applies the ModelSpec fields of an admin load body (`body`, a JSON object:
// every engine::model_fields() row by its canonical name; absent or null
// leaves the field alone) onto `spec` with engine::set_model_field. Returns
// the 400 for a key that is not "id", "path" or a field name
// ("Unrecognized request argument supplied: '<key>'.", unknown_parameter),
// else for the first bad field: "Invalid '<field>': <message>."
// (invalid_value) or "Invalid type for '<field>': <message>." (invalid_type),
// param = the key.
std::optional<ApiError> apply_admin_model_fields(const nlohmann::json& body, engine::ModelSpec& spec);

// Registers the routes above on `http`. `ctx` must outlive `http`'s handlers.
void add_admin_routes(HttpTransport& http, ServerContext& ctx);

}  // namespace bonsai::server
