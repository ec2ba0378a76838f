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

#include "core/ggml_types.h"  // parse_q2_layout
#include "model/kv_cache.h"   // parse_kv_type

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
    if (key == "model") {
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
    } else if (key == "models") {
      const toml::table* t = node.as_table();
      if (!t) return core::fail(core::Errc::kInvalidArgument, where + ": expected a table of id = \"path\"");
      for (const auto& [id, path] : *t) {
        auto s = get_string(path, where + "." + std::string(id.str()));
        if (!s) return std::unexpected(s.error());
        config.models.push_back(ModelArg{std::string(id.str()), *s});
      }
    } else if (key == "router") {
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
    } else if (key == "host" || key == "api-key" || key == "q2-layout" || key == "cache-type-k" ||
               key == "cache-type-v" || key == "cors-origin") {
      auto s = get_string(node, where);
      if (!s) return std::unexpected(s.error());
      if (key == "api-key" && is_blank_key(*s))
        return core::fail(core::Errc::kInvalidArgument,
                          where +
                              ": the API key is blank (an unset variable?); give a key, or leave the key out to "
                              "serve without authentication");
      (key == "host"           ? config.host
       : key == "api-key"      ? config.api_key
       : key == "cache-type-k" ? config.cache_type_k
       : key == "cache-type-v" ? config.cache_type_v
       : key == "cors-origin"  ? config.cors_origin
                               : config.q2_layout) = *s;
    } else if (key == "no-repack" || key == "admin-open" || key == "no-cache-prompt") {
      if (!node.is_boolean()) return core::fail(core::Errc::kInvalidArgument, where + ": expected true or false");
      (key == "no-repack"    ? config.no_repack
       : key == "admin-open" ? config.admin_open
                             : config.no_cache_prompt) = *node.value<bool>();
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
    } else if (key == "batch-size" || key == "max-connections") {
      auto v = get_integer(node, where);
      if (!v) return std::unexpected(v.error());
      const int64_t lo = key == "batch-size" ? 0 : 1;
      if (*v < lo || *v > (int64_t{1} << 20))
        return core::fail(core::Errc::kInvalidArgument,
                          where + ": expected an integer in " + std::to_string(lo) + ".." + std::to_string(1 << 20));
      (key == "batch-size" ? config.batch_size : config.max_connections) = static_cast<int>(*v);
    } else if (key == "header-timeout" || key == "body-timeout" || key == "keep-alive-timeout" ||
               key == "write-timeout") {
      const auto v = node.value<double>();
      if (!v || !(*v >= 0.001) || *v > 86400)
        return core::fail(core::Errc::kInvalidArgument, where + ": expected seconds in 0.001..86400");
      (key == "header-timeout"       ? config.header_timeout_s
       : key == "body-timeout"       ? config.body_timeout_s
       : key == "keep-alive-timeout" ? config.keep_alive_timeout_s
                                     : config.write_timeout_s) = *v;
    } else if (key == "timeout") {
      if (!node.is_number()) return core::fail(core::Errc::kInvalidArgument, where + ": expected a number of seconds");
      config.timeout_s = *node.value<double>();
    } else if (key == "step-budget-ms") {
      const auto v = node.value<double>();  // an integer or a float
      if (!v || !(*v >= 0) || *v > 600000)
        return core::fail(core::Errc::kInvalidArgument, where + ": expected milliseconds in 0..600000");
      config.step_budget_ms = *v;
    } else if (key == "pool-size" || key == "models-max" || key == "mem-budget" || key == "ctx-size" ||
               key == "threads" || key == "port" || key == "max-body" || key == "queue-factor" ||
               key == "kv-budget-tokens" || key == "parallel") {
      auto v = get_integer(node, where);
      if (!v) return std::unexpected(v.error());
      if (*v < 0) return core::fail(core::Errc::kInvalidArgument, where + ": must be >= 0");
      // Every key but the two byte counts is an int: a larger value used to be
      // truncated silently (port = 4294975376 served on 8080).
      if (key != "mem-budget" && key != "max-body" && key != "kv-budget-tokens" && *v > std::numeric_limits<int>::max())
        return core::fail(core::Errc::kInvalidArgument, where + ": " + std::to_string(*v) + " is too large (at most " +
                                                            std::to_string(std::numeric_limits<int>::max()) + ")");
      if (key == "pool-size")
        config.pool_size = static_cast<int>(*v);
      else if (key == "models-max")
        config.models_max = static_cast<int>(*v);
      else if (key == "mem-budget")
        config.mem_budget_mb = static_cast<uint64_t>(*v);
      else if (key == "ctx-size")
        config.ctx_size = static_cast<int>(*v);
      else if (key == "threads")
        config.threads = static_cast<int>(*v);
      else if (key == "port")
        config.port = static_cast<int>(*v);
      else if (key == "max-body")
        config.max_body_bytes = static_cast<size_t>(*v);
      else if (key == "kv-budget-tokens")
        config.kv_budget_tokens = *v;
      else if (key == "parallel")
        config.parallel = static_cast<int>(*v);
      else
        config.queue_factor = static_cast<int>(*v);
    } else {
      return core::fail(core::Errc::kInvalidArgument,
                        where +
                            ": unknown key (known: model, models, router, pool-size, parallel, models-max, mem-budget, "
                            "ctx-size, kv-budget-tokens, threads, host, port, api-key, admin-open, timeout, max-body, "
                            "queue-factor, step-budget-ms, batch-size, seed, reasoning-format, no-cache-prompt, "
                            "max-connections, header-timeout, body-timeout, keep-alive-timeout, write-timeout, "
                            "q2-layout, cache-type-k, cache-type-v, cors-origin, no-repack)");
    }
  }
  return {};
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
  if (c.pool_size < 0 || c.models_max < 0 || c.ctx_size < 0 || c.threads < 0 || c.queue_factor < 0)
    return core::fail(core::Errc::kInvalidArgument,
                      "pool-size, models-max, ctx-size, threads and queue-factor must be >= 0");
  if (c.parallel < 1 || c.parallel > kMaxParallel)
    return core::fail(core::Errc::kInvalidArgument, "parallel must be in 1.." + std::to_string(kMaxParallel) +
                                                        " (live sequences per model), got " +
                                                        std::to_string(c.parallel));
  if (!(c.timeout_s > 0)) return core::fail(core::Errc::kInvalidArgument, "timeout must be > 0 seconds");
  if (c.max_body_bytes == 0) return core::fail(core::Errc::kInvalidArgument, "max-body must be > 0 bytes");
  if (!c.q2_layout.empty() && !core::parse_q2_layout(c.q2_layout))
    return core::fail(core::Errc::kInvalidArgument, "q2-layout: unknown Q2_0 layout '" + c.q2_layout +
                                                        "' (expected g64, g128-d-first or g128-qs-first)");
  for (const auto& [key, value] :
       {std::pair{"cache-type-k", &c.cache_type_k}, std::pair{"cache-type-v", &c.cache_type_v}}) {
    if (auto t = model::parse_kv_type(*value); !t)
      return core::fail(core::Errc::kInvalidArgument, std::string(key) + ": " + t.error().message);
  }
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
