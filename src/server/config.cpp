// `bonsai serve` configuration (flags + TOML). See config.h.
#include "server/config.h"

#include <arpa/inet.h>  // inet_pton (is_loopback_host)
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <variant>

#include "engine/model_spec_fields.h"  // set_model_field: the ModelSpec keys

namespace bonsai::server {
namespace {

std::string normalize_key(std::string_view k) {
  std::string s(k);
  for (char& c : s)
    if (c == '_') c = '-';
  return s;
}

core::Expected<int64_t> get_integer(const toml::node& n, const std::string& where) {
  if (auto v = n.value<int64_t>(); v && n.is_integer()) return *v;
  return core::fail(core::Errc::kInvalidArgument, where + ": expected an integer");
}

core::Expected<std::string> get_string(const toml::node& n, const std::string& where) {
  if (auto v = n.value<std::string>(); v && n.is_string()) return *v;
  return core::fail(core::Errc::kInvalidArgument, where + ": expected a string");
}

}  // namespace

core::Expected<ModelArg> parse_model_arg(std::string_view arg) {
  ModelArg m;
  auto eq = arg.find('=');
  // A file whose name holds '=' (e.g. /runs/lr=3e-4/model.gguf) is a FILE,
  // not ID=FILE: an existing file wins.
  std::error_code ec;
  if (eq != std::string_view::npos && std::filesystem::is_regular_file(std::string(arg), ec))
    eq = std::string_view::npos;
  if (eq != std::string_view::npos) {
    m.id = std::string(arg.substr(0, eq));
    m.path = std::string(arg.substr(eq + 1));
    if (m.id.empty())
      return core::fail(core::Errc::kInvalidArgument, "-m '" + std::string(arg) + "': empty model id before '='");
  } else {
    m.path = std::string(arg);
    std::filesystem::path p(m.path);
    m.id = p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
  }
  if (m.path.empty()) return core::fail(core::Errc::kInvalidArgument, "-m '" + std::string(arg) + "': empty file path");
  if (m.id.empty())
    return core::fail(core::Errc::kInvalidArgument, "-m '" + std::string(arg) + "': cannot derive a model id");
  return m;
}

namespace {

// A TOML value as the ModelSpec parser takes it (engine::FieldValue).
engine::FieldValue toml_field_value(const toml::node& n) {
  if (n.is_integer()) return *n.value<int64_t>();
  if (n.is_floating_point()) return *n.value<double>();
  if (n.is_boolean()) return *n.value<bool>();
  if (n.is_string()) return *n.value<std::string>();
  return std::monostate{};
}

// Where ServeConfig keeps ModelSpec field `f` as the config spells it, as a
// FieldValue (std::monostate: not given, e.g. an empty q2-layout).
engine::FieldValue config_model_value(const ServeConfig& c, engine::ModelField f) {
  using enum engine::ModelField;
  switch (f) {
    case kPoolSize:
      return int64_t{c.pool_size};
    case kCtxSize:
      return int64_t{c.ctx_size};
    case kParallel:
      return int64_t{c.parallel};
    case kQ2Layout:
      return c.q2_layout.empty() ? engine::FieldValue{} : engine::FieldValue{c.q2_layout};
    case kRepack:
      return c.no_repack;  // spelled no-repack
    case kCacheTypeK:
      return c.cache_type_k;
    case kCacheTypeV:
      return c.cache_type_v;
    case kQueueFactor:
      return int64_t{c.queue_factor};
    case kKvBudgetTokens:
      return c.kv_budget_tokens;
    case kBatchSize:
      return int64_t{c.batch_size};
    case kStepBudgetMs:
      return c.step_budget_ms;
    case kPromptCache:
      return c.no_cache_prompt;  // spelled no-cache-prompt
  }
  return std::monostate{};
}

// Stores a value set_model_field accepted (or, for a name, one of the right
// type) into ServeConfig: the inverse of config_model_value.
void store_model_value(ServeConfig& c, engine::ModelField f, const engine::FieldValue& v) {
  using enum engine::ModelField;
  const auto* i = std::get_if<int64_t>(&v);
  const int n = i != nullptr ? static_cast<int>(*i) : 0;  // in range (checked)
  switch (f) {
    case kPoolSize:
      c.pool_size = n;
      break;
    case kCtxSize:
      c.ctx_size = n;
      break;
    case kParallel:
      c.parallel = n;
      break;
    case kQ2Layout:
      c.q2_layout = std::get<std::string>(v);
      break;
    case kRepack:
      c.no_repack = std::get<bool>(v);
      break;
    case kCacheTypeK:
      c.cache_type_k = std::get<std::string>(v);
      break;
    case kCacheTypeV:
      c.cache_type_v = std::get<std::string>(v);
      break;
    case kQueueFactor:
      c.queue_factor = n;
      break;
    case kKvBudgetTokens:
      c.kv_budget_tokens = *i;
      break;
    case kBatchSize:
      c.batch_size = n;
      break;
    case kStepBudgetMs:
      c.step_budget_ms = i != nullptr ? static_cast<double>(*i) : std::get<double>(v);
      break;
    case kPromptCache:
      c.no_cache_prompt = std::get<bool>(v);
      break;
  }
}

// A ModelSpec key (engine::find_model_field), checked by the one parser with
// the file and key in the message; q2-layout only for its type here: its name
// is checked where the flag's is (cmd_serve, exit status 2), as the same
// BONSAI_Q2_LAYOUT / --q2-layout rules apply.
core::Expected<void> apply_model_key(const engine::ModelFieldInfo& f, const toml::node& node, const std::string& where,
                                     ServeConfig& config) {
  const engine::FieldValue v = toml_field_value(node);
  if (f.field == engine::ModelField::kQ2Layout) {
    if (!std::holds_alternative<std::string>(v))
      return core::fail(core::Errc::kInvalidArgument, where + ": expected a string");
  } else {
    engine::ModelSpec scratch;
    if (auto r = engine::set_model_field(scratch, f.toml_key, v); !r)
      return core::fail(core::Errc::kInvalidArgument, where + ": " + r.error().message);
  }
  store_model_value(config, f.field, v);
  return {};
}

// model = "ID=FILE" or ["ID=FILE", "FILE", ...] (-m).
core::Expected<void> apply_model_list(const toml::node& node, const std::string& where, ServeConfig& config) {
  std::vector<std::string> items;
  if (node.is_string()) {
    items.push_back(*node.value<std::string>());
  } else if (const toml::array* arr = node.as_array()) {
    for (size_t i = 0; i < arr->size(); ++i) {
      auto s = get_string(*arr->get(i), where + "[" + std::to_string(i) + "]");
      if (!s) return std::unexpected(s.error());
      items.push_back(*s);
    }
  } else {
    return core::fail(core::Errc::kInvalidArgument, where + ": expected a string or an array of strings");
  }
  for (const auto& it : items) {
    auto m = parse_model_arg(it);
    if (!m) return core::fail(core::Errc::kInvalidArgument, where + ": " + m.error().message);
    config.models.push_back(*m);
  }
  return {};
}

// [models] id = "path".
core::Expected<void> apply_models_table(const toml::node& node, const std::string& where, ServeConfig& config) {
  const toml::table* t = node.as_table();
  if (!t) return core::fail(core::Errc::kInvalidArgument, where + ": expected a table of id = \"path\"");
  for (const auto& [id, path] : *t) {
    auto s = get_string(path, where + "." + std::string(id.str()));
    if (!s) return std::unexpected(s.error());
    config.models.push_back(ModelArg{std::string(id.str()), *s});
  }
  return {};
}

// [router] preload = ["id", ...].
core::Expected<void> apply_router(const toml::node& node, const std::string& name, const std::string& where,
                                  ServeConfig& config) {
  const toml::table* t = node.as_table();
  if (!t) return core::fail(core::Errc::kInvalidArgument, where + ": expected a table");
  for (const auto& [rk, rv] : *t) {
    std::string rwhere = name + ": key 'router." + std::string(rk.str()) + "'";
    if (normalize_key(rk.str()) != "preload")
      return core::fail(core::Errc::kInvalidArgument, rwhere + ": unknown key (expected 'preload')");
    const toml::array* arr = rv.as_array();
    if (!arr) return core::fail(core::Errc::kInvalidArgument, rwhere + ": expected an array of model ids");
    config.preload.clear();
    for (size_t i = 0; i < arr->size(); ++i) {
      auto s = get_string(*arr->get(i), rwhere + "[" + std::to_string(i) + "]");
      if (!s) return std::unexpected(s.error());
      config.preload.push_back(*s);
    }
    config.preload_set = true;
  }
  return {};
}

// The server's own keys (not ModelSpec fields): host, port, timeouts...
// Returns false in `known` for a key that is none of them.
core::Expected<void> apply_server_key(const std::string& key, const toml::node& node, const std::string& where,
                                      ServeConfig& config, bool& known) {
  known = true;
  if (key == "host" || key == "api-key" || key == "cors-origin") {
    auto s = get_string(node, where);
    if (!s) return std::unexpected(s.error());
    if (key == "api-key" && is_blank_key(*s))
      return core::fail(core::Errc::kInvalidArgument,
                        where +
                            ": the API key is blank (an unset variable?); give a key, or leave the key out to "
                            "serve without authentication");
    (key == "host" ? config.host : key == "api-key" ? config.api_key : config.cors_origin) = *s;
  } else if (key == "admin-open") {
    if (!node.is_boolean()) return core::fail(core::Errc::kInvalidArgument, where + ": expected true or false");
    config.admin_open = *node.value<bool>();
  } else if (key == "reasoning-format") {
    auto v = get_string(node, where);
    if (!v) return std::unexpected(v.error());
    if (*v != "deepseek" && *v != "none")
      return core::fail(core::Errc::kInvalidArgument, where + ": expected \"deepseek\" or \"none\"");
    config.reasoning_format = *v;
  } else if (key == "seed") {
    auto v = get_integer(node, where);
    if (!v) return std::unexpected(v.error());
    if (*v < 0) return core::fail(core::Errc::kInvalidArgument, where + ": must be >= 0");
    config.seed = static_cast<uint64_t>(*v);
    config.seed_set = true;
  } else if (key == "max-connections") {
    auto v = get_integer(node, where);
    if (!v) return std::unexpected(v.error());
    if (*v < 1 || *v > (int64_t{1} << 20))
      return core::fail(core::Errc::kInvalidArgument, where + ": expected an integer in 1.." + std::to_string(1 << 20));
    config.max_connections = static_cast<int>(*v);
  } else if (key == "header-timeout" || key == "body-timeout" || key == "keep-alive-timeout" ||
             key == "write-timeout") {
    const auto v = node.value<double>();
    if (!v || !(*v >= 0.001) || *v > 86400)
      return core::fail(core::Errc::kInvalidArgument, where + ": expected seconds in 0.001..86400");
    (key == "header-timeout"       ? config.header_timeout_s
     : key == "body-timeout"       ? config.body_timeout_s
     : key == "keep-alive-timeout" ? config.keep_alive_timeout_s
                                   : config.write_timeout_s) = *v;
  } else if (key == "drain-timeout") {
    const auto v = node.value<double>();
    if (!v || !(*v >= 0) || *v > 86400)
      return core::fail(core::Errc::kInvalidArgument, where + ": expected seconds in 0..86400");
    config.drain_timeout_s = *v;
  } else if (key == "timeout") {
    if (!node.is_number()) return core::fail(core::Errc::kInvalidArgument, where + ": expected a number of seconds");
    config.timeout_s = *node.value<double>();
  } else if (key == "models-max" || key == "mem-budget" || key == "threads" || key == "port" || key == "max-body") {
    auto v = get_integer(node, where);
    if (!v) return std::unexpected(v.error());
    if (*v < 0) return core::fail(core::Errc::kInvalidArgument, where + ": must be >= 0");
    // Every key but the two byte counts is an int: a larger value used to be
    // truncated silently (port = 4294975376 served on 8080).
    if (key != "mem-budget" && key != "max-body" && *v > std::numeric_limits<int>::max())
      return core::fail(core::Errc::kInvalidArgument, where + ": " + std::to_string(*v) + " is too large (at most " +
                                                          std::to_string(std::numeric_limits<int>::max()) + ")");
    if (key == "mem-budget")
      config.mem_budget_mb = static_cast<uint64_t>(*v);
    else if (key == "max-body")
      config.max_body_bytes = static_cast<size_t>(*v);
    else
      (key == "models-max" ? config.models_max
       : key == "threads"  ? config.threads
                           : config.port) = static_cast<int>(*v);
  } else {
    known = false;
  }
  return {};
}

}  // namespace

core::Expected<void> apply_serve_toml(std::string_view text, const std::string& name, ServeConfig& config) {
  // This toml++ build reports syntax errors by throwing toml::parse_error;
  // it is caught here so nothing crosses the part boundary.
  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& err) {
    std::ostringstream os;
    os << name << ":" << err.source().begin.line << ":" << err.source().begin.column << ": " << err.description();
    return core::fail(core::Errc::kInvalidArgument, os.str());
  }
  for (const auto& [key_node, node] : root) {
    const std::string key = normalize_key(key_node.str());
    const std::string where = name + ": key '" + std::string(key_node.str()) + "'";
    core::Expected<void> r;
    bool known = true;
    const engine::ModelFieldInfo* field = engine::find_model_field(key);
    if (key == "model")
      r = apply_model_list(node, where, config);
    else if (key == "models")
      r = apply_models_table(node, where, config);
    else if (key == "router")
      r = apply_router(node, name, where, config);
    else if (field != nullptr && key == field->toml_key)
      r = apply_model_key(*field, node, where, config);
    else
      r = apply_server_key(key, node, where, config, known);
    if (!r) return r;
    if (!known)
      return core::fail(
          core::Errc::kInvalidArgument,
          where +
              ": unknown key (known: model, models, router, pool-size, parallel, models-max, mem-budget, "
              "ctx-size, kv-budget-tokens, threads, host, port, api-key, admin-open, timeout, max-body, "
              "queue-factor, step-budget-ms, batch-size, seed, reasoning-format, no-cache-prompt, "
              "max-connections, header-timeout, body-timeout, keep-alive-timeout, write-timeout, drain-timeout, "
              "q2-layout, cache-type-k, cache-type-v, cors-origin, no-repack)");
  }
  return {};
}

core::Expected<engine::ModelSpec> serve_model_spec(const ServeConfig& c) {
  engine::ModelSpec spec;
  for (const engine::ModelFieldInfo& f : engine::model_fields()) {
    const engine::FieldValue v = config_model_value(c, f.field);
    if (std::holds_alternative<std::monostate>(v)) continue;
    if (auto r = engine::set_model_field(spec, f.toml_key, v); !r)
      return core::fail(core::Errc::kInvalidArgument, std::string(f.toml_key) + ": " + r.error().message);
  }
  return spec;
}

bool is_loopback_host(std::string_view host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  // A numeric IPv4 address in 127.0.0.0/8 (a name such as "127.example.com" is not).
  in_addr a{};
  const std::string h(host);
  return ::inet_pton(AF_INET, h.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

bool is_blank_key(std::string_view key) {
  return std::all_of(key.begin(), key.end(), [](unsigned char c) { return std::isspace(c) != 0; });
}

core::Expected<void> load_serve_toml(const std::string& path, ServeConfig& config) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return core::fail(std::filesystem::exists(path) ? core::Errc::kIo : core::Errc::kNotFound,
                      path + ": cannot open the config file");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return apply_serve_toml(ss.str(), path, config);
}

core::Expected<void> validate_serve_config(const ServeConfig& c) {
  if (c.port < 0 || c.port > 65535)
    return core::fail(core::Errc::kInvalidArgument, "port " + std::to_string(c.port) + " is not in 0..65535");
  if (c.models_max < 0 || c.threads < 0)
    return core::fail(core::Errc::kInvalidArgument, "models-max and threads must be >= 0");
  if (!(c.timeout_s > 0)) return core::fail(core::Errc::kInvalidArgument, "timeout must be > 0 seconds");
  if (c.max_body_bytes == 0) return core::fail(core::Errc::kInvalidArgument, "max-body must be > 0 bytes");
  // pool-size, ctx-size, parallel, q2-layout, cache-type-k/v, ...: the one parser.
  if (auto spec = serve_model_spec(c); !spec) return std::unexpected(spec.error());
  for (size_t i = 0; i < c.models.size(); ++i)
    for (size_t j = i + 1; j < c.models.size(); ++j)
      if (c.models[i].id == c.models[j].id)
        return core::fail(core::Errc::kInvalidArgument, "model id '" + c.models[i].id + "' is given twice");
  for (const auto& id : c.preload) {
    bool found = false;
    for (const auto& m : c.models) found = found || m.id == id;
    if (!found)
      return core::fail(core::Errc::kInvalidArgument, "router.preload names '" + id + "', which is not a model");
  }
  return {};
}

}  // namespace bonsai::server
