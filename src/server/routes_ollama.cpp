// Ollama's API: /api/version, /api/tags, /api/show, /api/ps, /api/chat,
// /api/generate, /api/embed, /api/embeddings. See routes_ollama.h.
#include "server/routes_ollama.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "core/ggml_types.h"          // ggml_type_name
#include "engine/chat_output.h"       // ChatOutputParser
#include "gguf/gguf.h"                // File (model details for /api/tags, /api/show)
#include "server/job_pump.h"          // add_job_route, JobAnswer
#include "server/routes_tokens.h"     // submit_embeddings
#include "tokenizer/chat_template.h"  // ChatTemplate (capabilities)

namespace bonsai::server {

namespace {

using Json = nlohmann::ordered_json;  // request side: document order (tool schemas, arguments)
using nlohmann::json;                 // answer side
using Clock = engine::Clock;

// `obj[key]` when present and not null, else nullptr.
const Json* member(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

ApiError missing(const std::string& field) {
  return bad_request("Missing required field '" + field + "'.", field, "missing_required_parameter");
}

ApiError unsupported(const std::string& field, const std::string& why) {
  return bad_request("'" + field + "' is not supported: " + why, field, "unsupported_value");
}

// The body as a JSON object (document order), or the 400 saying why not.
std::optional<ApiError> parse_body(std::string_view text, Json& out) {
  if (json_nesting_exceeds(text, kMaxJsonDepth))
    return bad_request(
        "The request body nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels.", {},
        "invalid_json");
  out = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) return bad_request("The request body is not valid JSON.", {}, "invalid_json");
  if (!out.is_object()) return bad_request("The request body must be a JSON object.", {}, "invalid_json");
  return std::nullopt;
}

std::optional<ApiError> optional_string(const Json& body, const char* key, std::string& out) {
  if (const Json* v = member(body, key)) {
    if (!v->is_string()) return wrong_type(key, "a string", *v);
    out = v->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> optional_bool(const Json& body, const char* key, bool& out) {
  if (const Json* v = member(body, key)) {
    if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
    out = v->get<bool>();
  }
  return std::nullopt;
}

// "model": a non-empty string.
std::optional<ApiError> required_model(const Json& body, std::string& out) {
  const Json* v = member(body, "model");
  if (!v) v = member(body, "name");  // the older field name (/api/show, /api/pull)
  if (!v) return missing("model");
  if (!v->is_string()) return wrong_type("model", "a string", *v);
  out = v->get<std::string>();
  if (out.empty()) return missing("model");
  return std::nullopt;
}

// `options` onto chat's sampling fields (routes_ollama.h lists them).
std::optional<ApiError> translate_options(const Json& body, Json& chat) {
  const Json* o = member(body, "options");
  if (!o) return std::nullopt;
  if (!o->is_object()) return wrong_type("options", "an object", *o);
  if (const Json* n = member(*o, "num_predict")) {
    if (!n->is_number_integer()) return wrong_type("options.num_predict", "an integer", *n);
    if (n->get<int64_t>() > 0) chat["max_tokens"] = *n;  // <= 0 (-1 infinite, -2 fill the context): no limit
  }
  // Checked by the chat parser under the same names (ollama_error renames them back).
  for (const char* key : {"temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty",
                          "presence_penalty", "frequency_penalty"})
    if (const Json* v = member(*o, key)) chat[key] = *v;
  return std::nullopt;
}

// `format`: "json" or a JSON Schema object ("" and null: none).
std::optional<ApiError> translate_format(const Json& body, Json& chat) {
  const Json* f = member(body, "format");
  if (!f || (f->is_string() && f->get<std::string>().empty())) return std::nullopt;
  if (f->is_string() && f->get<std::string>() == "json") {
    chat["response_format"] = Json{{"type", "json_object"}};
    return std::nullopt;
  }
  if (!f->is_object())
    return bad_request("Invalid value for 'format': " + f->dump() + " (expected \"json\" or a JSON Schema object).",
                       "format", "invalid_value");
  chat["response_format"] =
      Json{{"type", "json_schema"}, {"json_schema", {{"name", "format"}, {"schema", *f}, {"strict", true}}}};
  return std::nullopt;
}

// `think`: a boolean, or "high" / "medium" / "low" (thinking on).
std::optional<ApiError> translate_think(const Json& body, Json& chat) {
  const Json* t = member(body, "think");
  if (!t) return std::nullopt;
  bool on = true;
  if (t->is_boolean()) {
    on = t->get<bool>();
  } else if (!(t->is_string() && (*t == "high" || *t == "medium" || *t == "low"))) {
    return bad_request(
        "Invalid value for 'think': " + t->dump() + " (expected a boolean, \"high\", \"medium\" or \"low\").", "think",
        "invalid_value");
  }
  chat["chat_template_kwargs"] = Json{{"enable_thinking", on}};
  return std::nullopt;
}

// What chat and generate share: model, format, think, options, and the
// bonsai extensions a client may add (OpenAI's tool_choice and
// parallel_tool_calls, llama.cpp's grammar).
std::optional<ApiError> translate_common(const Json& body, Json& chat) {
  std::string model;
  if (auto e = required_model(body, model)) return e;
  chat["model"] = model;
  if (auto e = translate_format(body, chat)) return e;
  if (auto e = translate_think(body, chat)) return e;
  if (auto e = translate_options(body, chat)) return e;
  for (const char* key : {"tool_choice", "parallel_tool_calls", "grammar"})
    if (const Json* v = member(body, key)) chat[key] = *v;
  return std::nullopt;
}

// A non-empty `images` is refused: the models served read text only.
std::optional<ApiError> no_images(const Json& obj, const std::string& where) {
  const Json* im = member(obj, "images");
  if (im && !(im->is_array() && im->empty())) return unsupported(where, "the models this server runs read text only.");
  return std::nullopt;
}

// One Ollama message into an OpenAI chat message.
std::optional<ApiError> translate_message(const Json& m, const std::string& where, Json& out) {
  if (!m.is_object()) return wrong_type(where, "an object", m);
  out = Json::object();
  const Json* role = member(m, "role");
  if (!role) return missing(where + ".role");
  out["role"] = *role;  // values checked by the chat parser
  if (const Json* c = member(m, "content")) {
    if (!c->is_string()) return wrong_type(where + ".content", "a string", *c);
    out["content"] = *c;
  } else {
    out["content"] = "";
  }
  if (auto e = no_images(m, where + ".images")) return e;
  if (const Json* t = member(m, "thinking")) {
    if (!t->is_string()) return wrong_type(where + ".thinking", "a string", *t);
    out["reasoning_content"] = *t;
  }
  if (const Json* calls = member(m, "tool_calls")) {
    if (!calls->is_array()) return wrong_type(where + ".tool_calls", "an array", *calls);
    Json tc = Json::array();
    for (size_t k = 0; k < calls->size(); ++k) {
      const Json& c = (*calls)[k];
      const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
      if (!c.is_object()) return wrong_type(cw, "an object", c);
      const Json* fn = member(c, "function");
      if (!fn) return missing(cw + ".function");
      if (!fn->is_object()) return wrong_type(cw + ".function", "an object", *fn);
      const Json* name = member(*fn, "name");
      if (!name) return missing(cw + ".function.name");
      if (!name->is_string()) return wrong_type(cw + ".function.name", "a string", *name);
      const Json* args = member(*fn, "arguments");
      Json call{{"type", "function"},
                {"function", {{"name", *name}, {"arguments", args ? *args : Json::object()}}}};  // an object: kept
      if (const Json* id = member(c, "id"); id && id->is_string()) call["id"] = *id;
      tc.push_back(std::move(call));
    }
    out["tool_calls"] = std::move(tc);
  }
  if (const Json* n = member(m, "tool_name")) {
    if (!n->is_string()) return wrong_type(where + ".tool_name", "a string", *n);
    out["name"] = *n;
  }
  if (const Json* id = member(m, "tool_call_id")) out["tool_call_id"] = *id;
  return std::nullopt;
}

// An error from the chat path with the chat field names put back into
// Ollama's (options.*, format, think).
ApiError ollama_error(ApiError e) {
  if (e.param.empty()) return e;
  static const std::set<std::string> kOptions = {
      "temperature",      "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty", "presence_penalty",
      "frequency_penalty"};
  std::string renamed = e.param;
  auto starts = [&](std::string_view s) { return e.param.rfind(s, 0) == 0; };
  if (e.param == "max_tokens") {
    renamed = "options.num_predict";
  } else if (kOptions.contains(e.param) || (starts("stop[") && kOptions.contains("stop"))) {
    renamed = "options." + e.param;
  } else if (starts("response_format")) {
    renamed = "format";
  } else if (starts("chat_template_kwargs")) {
    renamed = "think";
  } else if (starts("messages[") && e.param.find(".reasoning_content") != std::string::npos) {
    renamed = e.param.substr(0, e.param.find(".reasoning_content")) + ".thinking";
  }
  if (renamed == e.param) return e;
  const std::string from = "'" + e.param + "'", to = "'" + renamed + "'";
  for (size_t at = e.message.find(from); at != std::string::npos; at = e.message.find(from, at + to.size()))
    e.message.replace(at, from.size(), to);
  e.param = renamed;
  return e;
}

// An error of /api/generate's chat request with "messages" (the prompt made
// the conversation's user message: its length) put back as Ollama's "prompt".
ApiError generate_error(ApiError e) {
  e = ollama_error(std::move(e));
  if (e.param != "messages") return e;
  e.param = "prompt";
  for (size_t at = e.message.find("messages"); at != std::string::npos; at = e.message.find("messages", at + 6))
    e.message.replace(at, 8, "prompt");
  return e;
}

// RFC 3339 UTC time with nanoseconds (Ollama's created_at: "2023-08-04T19:22:45.499127Z").
std::string rfc3339(std::chrono::system_clock::time_point t) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(ns % 1000000000));
  return buf;
}

// /api/ps's expires_at for a model kept until it is evicted or unloaded (no keep_alive timer).
constexpr std::string_view kNoExpiry = "9999-12-31T23:59:59Z";

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

// Models a request may name (as GET /v1/models lists them): registered and resident, not failed.
std::vector<std::string> served_ids(const ServerContext& ctx) {
  std::set<std::string> ids;
  for (const auto& id : ctx.models->registered_ids()) ids.insert(id);
  for (const auto& m : ctx.models->list())
    if (m.state != engine::ModelState::kFailed) ids.insert(m.id);
  return {ids.begin(), ids.end()};
}

// keep_alive 0: unloads `id` when no request holds it (a request in flight
// keeps it, as Ollama keeps a model busy with another request).
void unload_when_idle(ServerContext& ctx, const std::string& id) {
  for (const auto& m : ctx.models->list())
    if (m.id == id && m.state == engine::ModelState::kLoaded && m.in_flight == 0) (void)ctx.models->unload(id);
}

// keep_alive (parse_keep_alive's seconds) as the pool's idle expiry of
// model `id` (ModelPool::set_keep_alive): positive, unloaded once idle that
// long; absent or negative, none (kept until evicted or unloaded, the
// server's default, as Ollama's default applies to a request without one).
// 0 is the caller's (unload_when_idle). A model no longer loaded is left
// alone (nothing to expire).
void apply_keep_alive(ServerContext& ctx, const std::string& id, std::optional<double> seconds) {
  std::optional<std::chrono::steady_clock::duration> idle;
  if (seconds && *seconds > 0) {
    const double s = std::min(*seconds, 1e9);  // the pool's longest (~31 years)
    idle = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
  }
  (void)ctx.models->set_keep_alive(id, idle);
}

// ---- model files --------------------------------------------------------------

// What /api/tags, /api/show and /api/ps say of one GGUF file, read from its
// header once per (path, size, mtime).
struct FileInfo {
  uint64_t size = 0;         // the file given (part 1 of a split model): the cache stamp
  uint64_t model_bytes = 0;  // the model's bytes: all parts of a split model (Ollama's "size")
  int64_t mtime = 0;
  std::string modified_at;  // RFC 3339
  std::string digest;       // identifies the file version (see file_info), not a content hash
  json details;             // Ollama's ModelDetails
  json model_info;          // scalar metadata + general.parameter_count
  std::string chat_template;
  std::vector<std::string> capabilities;
};

// Ollama's parameter_size: "8.0B", "494.0M", "260.0K".
std::string parameter_size(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) {
    std::snprintf(buf, sizeof buf, "%.1fB", static_cast<double>(n) / 1e9);
  } else if (n >= 1000000ull) {
    std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(n) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.1fK", static_cast<double>(n) / 1e3);
  }
  return buf;
}

json metadata_value(const gguf::Value& v) {
  return std::visit(
      [](const auto& x) -> json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string_view>) {
          return std::string(x);
        } else if constexpr (std::is_same_v<T, gguf::Array>) {
          return nullptr;  // arrays (vocabularies, merges) are left out, as Ollama's non-verbose show does
        } else {
          return x;
        }
      },
      v.v);
}

class FileInfoCache {
 public:
  // The file's info, or nullptr when it cannot be read (then the fields are left out).
  std::shared_ptr<const FileInfo> get(const std::string& path) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) return nullptr;
    const auto mtime_fs = std::filesystem::last_write_time(path, ec);
    if (ec) return nullptr;
    const int64_t mtime = mtime_fs.time_since_epoch().count();
    {
      std::lock_guard lock(mu_);
      auto it = cache_.find(path);
      if (it != cache_.end() && it->second->size == size && it->second->mtime == mtime) return it->second;
    }
    auto info = read(path, size, mtime, mtime_fs);
    if (!info) return nullptr;
    std::lock_guard lock(mu_);
    cache_[path] = info;
    return info;
  }

 private:
  static std::shared_ptr<const FileInfo> read(const std::string& path, uint64_t size, int64_t mtime,
                                              std::filesystem::file_time_type mtime_fs) {
    auto f = gguf::File::open(path);
    if (!f) return nullptr;
    auto info = std::make_shared<FileInfo>();
    info->size = size;
    info->model_bytes = (*f)->total_bytes();
    info->mtime = mtime;
    info->modified_at = rfc3339(
        std::chrono::time_point_cast<std::chrono::system_clock::duration>(std::chrono::file_clock::to_sys(mtime_fs)));
    // FNV-1a 64 over the path, size and mtime: changes when the file does,
    // without reading gigabytes for a sha256 on every listing.
    uint64_t h = 1469598103934665603ull;
    for (const char c : path + "|" + std::to_string(size) + "|" + std::to_string(mtime)) {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ull;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    info->digest = hex;
    std::string arch = "unknown";
    if (auto a = (*f)->get<std::string>("general.architecture")) arch = *a;
    uint64_t params = 0;
    std::map<uint32_t, uint64_t> by_type;  // elements of matrices per type
    for (const auto& t : (*f)->tensors()) {
      params += static_cast<uint64_t>(t.n_elements());
      if (t.n_dims >= 2) by_type[t.type_id] += static_cast<uint64_t>(t.n_elements());
    }
    std::string quant = "unknown";
    uint64_t most = 0;
    for (const auto& [type, n] : by_type)
      if (n > most) most = n, quant = core::ggml_type_name(type);
    info->details = json{{"parent_model", ""},
                         {"format", "gguf"},
                         {"family", arch},
                         {"families", json::array({arch})},
                         {"parameter_size", parameter_size(params)},
                         {"quantization_level", quant}};
    json mi = json::object();
    for (const auto& kv : (*f)->metadata()) {
      if (kv.key == "tokenizer.chat_template") continue;  // show's "template"
      json v = metadata_value(kv.value);
      if (!v.is_null()) mi[std::string(kv.key)] = std::move(v);
    }
    mi["general.parameter_count"] = params;
    info->model_info = std::move(mi);
    if (auto t = (*f)->get<std::string>("tokenizer.chat_template")) info->chat_template = *t;
    // Every model completes and embeds (/api/embed); the Qwen families' templates render tools and <think>.
    info->capabilities = {"completion", "embedding"};
    const auto family = tokenizer::ChatTemplate::from_text(info->chat_template).family();
    if (family != tokenizer::ChatTemplate::Family::kChatML) {
      info->capabilities.push_back("tools");
      info->capabilities.push_back("thinking");
    }
    return info;
  }

  std::mutex mu_;  // guards cache_
  std::map<std::string, std::shared_ptr<const FileInfo>> cache_;
};

// The routes' shared state.
struct OllamaRoutes {
  ServerContext& ctx;
  ChatSubmitter submit;
  FileInfoCache files;

  OllamaRoutes(ServerContext& c, ChatSubmitter s) : ctx(c), submit(std::move(s)) {}

  std::string path_of(const std::string& id) const {
    if (auto spec = ctx.models->registration(id)) return spec->path;
    for (const auto& m : ctx.models->list())
      if (m.id == id) return m.path;
    return {};
  }

  // The fields /api/tags and /api/ps share for `id`.
  json model_entry(const std::string& id) {
    json e{{"name", ollama_model_name(id)}, {"model", ollama_model_name(id)}};
    if (auto info = files.get(path_of(id))) {
      e["modified_at"] = info->modified_at;
      e["size"] = info->model_bytes;
      e["digest"] = info->digest;
      e["details"] = info->details;
    }
    return e;
  }

  void tags(HttpResponse& res) {
    json models = json::array();
    for (const auto& id : served_ids(ctx)) models.push_back(model_entry(id));
    send_json(res, 200, json{{"models", std::move(models)}});
  }

  void ps(HttpResponse& res) {
    json models = json::array();
    for (const auto& m : ctx.models->list()) {
      if (m.state != engine::ModelState::kLoaded) continue;
      json e = model_entry(m.id);
      e["size"] = m.mem_bytes;  // resident bytes (mapped file + KV pool), as Ollama's ps reports memory
      e["size_vram"] = 0;       // bonsai runs on the CPU
      e["expires_at"] = m.expires_at ? rfc3339(*m.expires_at) : std::string(kNoExpiry);
      if (auto lm = ctx.models->peek(m.id)) e["context_length"] = lm->n_ctx;
      models.push_back(std::move(e));
    }
    send_json(res, 200, json{{"models", std::move(models)}});
  }

  void show(const std::string& text, HttpResponse& res) {
    Json body;
    if (auto e = parse_body(text, body)) return send_ollama_error(res, *e);
    std::string name;
    if (auto e = required_model(body, name)) return send_ollama_error(res, *e);
    const auto ids = served_ids(ctx);
    const std::string id = resolve_ollama_model(name, ids);
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
      ApiError e = bad_request("model '" + name + "' not found", "model", "model_not_found");
      e.status = 404;
      return send_ollama_error(res, e);
    }
    const std::string path = path_of(id);
    auto info = files.get(path);
    if (!info) {
      ApiError e = bad_request("model '" + name + "': its GGUF file cannot be read", "model");
      e.status = 500;
      return send_ollama_error(res, e);
    }
    // The sampling defaults the model is served with (Modelfile PARAMETER lines).
    std::string parameters;
    if (auto spec = ctx.models->registration(id)) {
      const auto& d = spec->defaults;
      char buf[256];
      std::snprintf(buf, sizeof buf, "temperature %g\ntop_k %d\ntop_p %g\nmin_p %g\nrepeat_penalty %g", d.temperature,
                    d.top_k, d.top_p, d.min_p, d.repeat_penalty);
      parameters = buf;
    }
    send_json(res, 200,
              json{{"modelfile", "FROM " + std::filesystem::path(path).filename().string() + "\n"},
                   {"parameters", parameters},
                   {"template", info->chat_template},
                   {"details", info->details},
                   {"model_info", info->model_info},
                   {"capabilities", info->capabilities},
                   {"modified_at", info->modified_at}});
  }

  std::optional<SubmittedJob> chat_or_generate(bool chat, const std::string& text, HttpResponse& res,
                                               Clock::time_point admitted);
  std::optional<SubmittedJob> embed(bool legacy, const std::string& text, HttpResponse& res,
                                    Clock::time_point admitted);
};

// ---- chat and generate ----------------------------------------------------------

// One admitted /api/chat or /api/generate request.
struct OllamaJob {
  ServerContext* ctx = nullptr;
  bool chat = true;     // /api/chat (message) or /api/generate (response)
  bool stream = true;   // NDJSON lines
  std::string name;     // the model as the client named it (answers repeat it)
  bool unload = false;  // keep_alive 0
  Clock::time_point admitted, submitted;
  SubmittedChat job;
};

// The answer (ChatJobAnswer): NDJSON lines as the text comes (stream), or
// one object at the end.
struct OllamaAnswer : ChatJobAnswer {
  std::shared_ptr<OllamaJob> job;
  std::string content, thinking;  // non-streamed: the whole answer
  json calls = json::array();     // every tool call, in Ollama's shape

  explicit OllamaAnswer(std::shared_ptr<OllamaJob> j)
      : ChatJobAnswer(j->job, j->stream, send_ollama_error), job(std::move(j)) {}

  json call_json(const engine::ParsedToolCall& c) {
    json args = json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
    if (args.is_discarded()) args = c.arguments;  // not JSON (cannot come from the grammar): the text as is
    return json{{"id", new_tool_call_id()},
                {"function", {{"index", calls.size()}, {"name", c.name}, {"arguments", std::move(args)}}}};
  }

  // A line's head: model, created_at, and the text fields.
  json piece(const std::string& text, const std::string& reasoning, json tool_calls) const {
    json p{{"model", job->name}, {"created_at", rfc3339(std::chrono::system_clock::now())}};
    if (job->chat) {
      json m{{"role", "assistant"}, {"content", text}};
      if (!reasoning.empty()) m["thinking"] = reasoning;
      if (!tool_calls.empty()) m["tool_calls"] = std::move(tool_calls);
      p["message"] = std::move(m);
    } else {
      p["response"] = text;
      if (!reasoning.empty()) p["thinking"] = reasoning;
    }
    return p;
  }

  bool line(const json& j) { return send(j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"); }

  void begin_stream() override {
    exchange().start_stream(200, "application/x-ndjson", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  }

  // Takes one parsed delta: streamed as a line, or kept for the whole answer.
  void take(const engine::ChatOutputDelta& d) override {
    json tc = json::array();
    for (const auto& c : d.tool_calls) {
      tc.push_back(call_json(c));
      calls.push_back(tc.back());
    }
    if (!job->stream) {
      content += d.content;
      thinking += d.reasoning;
      return;
    }
    if (d.empty()) return;
    json p = piece(d.content, d.reasoning, std::move(tc));
    p["done"] = false;
    line(p);
  }

  // The model and the job go (before the last bytes, so a client that sees
  // the answer of a keep_alive 0 request finds the model unloaded).
  void release() {
    const std::string model = job->job.model;
    job->job = SubmittedChat{};
    if (job->unload) unload_when_idle(*job->ctx, model);
  }
  void before_error_end() override { release(); }
  void stream_error(const ApiError& e) override { line(json{{"error", e.message}}); }  // Ollama's mid-stream error line

  void complete(const engine::GenerationResult& r) override {
    json p = job->stream ? piece("", "", json::array()) : piece(content, thinking, calls);
    p["done"] = true;
    p["done_reason"] = r.finish_reason == engine::FinishReason::kLength ? "length" : "stop";
    const auto now = Clock::now();
    p["total_duration"] = ns_between(job->admitted, now);
    p["load_duration"] = ns_between(job->admitted, job->submitted);
    p["prompt_eval_count"] = job->job.prompt_tokens;
    p["prompt_eval_duration"] = static_cast<int64_t>(r.prompt_ms * 1e6);
    p["eval_count"] = r.completion_tokens;
    p["eval_duration"] = static_cast<int64_t>(r.gen_ms * 1e6);
    release();
    if (job->stream) {
      line(p);
      exchange().end_stream();
    } else {
      HttpResponse res;
      send_json(res, 200, p);
      exchange().respond(std::move(res));
    }
  }
};

std::optional<SubmittedJob> OllamaRoutes::chat_or_generate(bool chat, const std::string& text, HttpResponse& res,
                                                           Clock::time_point admitted) {
  auto fail = [&res](const ApiError& e) -> std::optional<SubmittedJob> {
    send_ollama_error(res, e);
    return std::nullopt;
  };
  Json body;
  if (auto e = parse_body(text, body)) return fail(*e);
  auto job = std::make_shared<OllamaJob>();
  job->ctx = &ctx;
  job->chat = chat;
  job->admitted = admitted;
  if (auto e = required_model(body, job->name)) return fail(*e);
  if (auto e = optional_bool(body, "stream", job->stream)) return fail(*e);
  std::optional<double> keep_alive;
  if (auto e = parse_keep_alive(body, keep_alive)) return fail(*e);
  job->unload = keep_alive && *keep_alive == 0;
  const std::string id = resolve_ollama_model(job->name, served_ids(ctx));

  // An empty conversation / prompt loads the model (or, keep_alive 0, unloads it) and answers at once.
  const Json* what = member(body, chat ? "messages" : "prompt");
  const bool empty =
      !what || (what->is_array() && what->empty()) || (what->is_string() && what->get<std::string>().empty());
  if (empty) {
    auto m = acquire_model(ctx, id);
    if (!m) return fail(m.error());
    m->release();
    if (job->unload) {
      unload_when_idle(ctx, id);
    } else {
      apply_keep_alive(ctx, id, keep_alive);
    }
    json p{{"model", job->name}, {"created_at", rfc3339(std::chrono::system_clock::now())}};
    if (chat) {
      p["message"] = json{{"role", "assistant"}, {"content", ""}};
    } else {
      p["response"] = "";
    }
    p["done"] = true;
    p["done_reason"] = job->unload ? "unload" : "load";
    if (job->stream) {
      res.status = 200;
      res.set_content(p.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/x-ndjson");
    } else {
      send_json(res, 200, p);
    }
    return std::nullopt;
  }

  Json cbody;
  Endpoint endpoint = Endpoint::kChat;
  if (chat) {
    if (auto e = ollama_chat_body(body, cbody)) return fail(*e);
  } else {
    if (auto e = ollama_generate_body(body, cbody, endpoint)) return fail(*e);
  }
  cbody["model"] = id;
  CompletionRequest cr;
  auto dialect_error = [chat](ApiError e) { return chat ? ollama_error(std::move(e)) : generate_error(std::move(e)); };
  if (auto e = parse_completion_request_json(cbody, endpoint, cr)) return fail(dialect_error(*e));
  // A prompt longer than the context (options.num_ctx, at most the model's)
  // is cut as Ollama cuts it, unless `truncate` is false: /api/chat drops
  // the oldest messages but system ones, /api/generate the start of its prompt.
  bool truncate = true;
  if (auto e = optional_bool(body, "truncate", truncate)) return fail(*e);
  if (truncate)
    cr.truncate =
        chat ? engine::PrepareOptions::Truncate::kOldestMessages : engine::PrepareOptions::Truncate::kPromptStart;
  if (const Json* o = member(body, "options"); o && o->is_object()) {
    if (const Json* n = member(*o, "num_ctx")) {
      if (!n->is_number_integer()) return fail(wrong_type("options.num_ctx", "an integer", *n));
      cr.truncate_ctx = std::max<int64_t>(n->get<int64_t>(), 0);
    }
  }
  auto submitted = submit(std::move(cr), admitted);
  if (!submitted) return fail(dialect_error(submitted.error()));
  job->submitted = Clock::now();
  job->job = std::move(*submitted);
  if (!job->unload) apply_keep_alive(ctx, job->job.model, keep_alive);  // held by the job: loaded
  auto handle = job->job.handle;
  return SubmittedJob{std::move(handle), 1, std::make_shared<OllamaAnswer>(std::move(job))};
}

// ---- embeddings -----------------------------------------------------------------

std::optional<SubmittedJob> OllamaRoutes::embed(bool legacy, const std::string& text, HttpResponse& res,
                                                Clock::time_point admitted) {
  auto fail = [&res](const ApiError& e) -> std::optional<SubmittedJob> {
    send_ollama_error(res, e);
    return std::nullopt;
  };
  Json body;
  if (auto e = parse_body(text, body)) return fail(*e);
  std::string name;
  if (auto e = required_model(body, name)) return fail(*e);
  std::optional<double> keep_alive;
  if (auto e = parse_keep_alive(body, keep_alive)) return fail(*e);
  const bool unload = keep_alive && *keep_alive == 0;
  const std::string id = resolve_ollama_model(name, served_ids(ctx));
  Json input;
  int64_t dimensions = 0;  // 0: the model's n_embd
  if (legacy) {
    std::string prompt;
    if (auto e = optional_string(body, "prompt", prompt)) return fail(*e);
    if (prompt.empty()) {  // Ollama answers an empty prompt with an empty embedding
      send_json(res, 200, json{{"embedding", json::array()}});
      return std::nullopt;
    }
    input = prompt;
  } else {
    const Json* in = member(body, "input");
    if (!in) return fail(missing("input"));
    if (!in->is_string() && !in->is_array()) return fail(wrong_type("input", "a string or an array of strings", *in));
    if (in->is_array())
      for (size_t k = 0; k < in->size(); ++k)
        if (!(*in)[k].is_string()) return fail(wrong_type("input[" + std::to_string(k) + "]", "a string", (*in)[k]));
    input = *in;
    if (const Json* d = member(body, "dimensions")) {
      if (!d->is_number_integer() || d->get<int64_t>() < 1)
        return fail(bad_request("Invalid value for 'dimensions': " + d->dump() + " (expected an integer >= 1).",
                                "dimensions", "invalid_value"));
      dimensions = d->get<int64_t>();
    }
  }
  EmbeddingsDialect dialect;
  dialect.error = send_ollama_error;
  dialect.truncate = true;  // Ollama's default
  if (auto e = optional_bool(body, "truncate", dialect.truncate)) return fail(*e);
  ServerContext* c = &ctx;
  auto submitted = std::make_shared<Clock::time_point>(admitted);  // set once the job is submitted
  dialect.body = [legacy, name, dimensions, unload, keep_alive, admitted, submitted, c](
                     std::vector<std::vector<float>> vecs, const std::string& model_id, int64_t tokens) {
    for (auto& v : vecs) {
      if (dimensions <= 0 || static_cast<size_t>(dimensions) >= v.size()) continue;
      // Shortened (Ollama's dimensions): the first `dimensions` values, L2-normalised again.
      v.resize(static_cast<size_t>(dimensions));
      double norm = 0;
      for (float x : v) norm += static_cast<double>(x) * x;
      norm = std::sqrt(norm);
      if (norm > 0)
        for (float& x : v) x = static_cast<float>(x / norm);
    }
    // The job is done: the model goes with the last holder (the answer's handle, released right after).
    if (unload) {
      (void)c->models->unload(model_id);
    } else {
      apply_keep_alive(*c, model_id, keep_alive);  // held by this job: loaded
    }
    if (legacy) return json{{"embedding", vecs.empty() ? std::vector<float>{} : std::move(vecs[0])}};
    return json{{"model", name},
                {"embeddings", std::move(vecs)},
                {"total_duration", ns_between(admitted, Clock::now())},
                {"load_duration", ns_between(admitted, *submitted)},
                {"prompt_eval_count", tokens}};
  };
  const Json obody{{"model", id}, {"input", std::move(input)}};
  auto job = submit_embeddings(ctx, obody.dump(), res, admitted, std::move(dialect));
  *submitted = Clock::now();  // before the pump starts: the body reads it later, on the pump's thread
  return job;
}

}  // namespace

// ---- public ---------------------------------------------------------------------

void send_ollama_error(HttpResponse& res, const ApiError& e) {
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  send_json(res, e.status, json{{"error", e.message}});
}

std::optional<ApiError> parse_keep_alive(const Json& body, std::optional<double>& seconds) {
  seconds.reset();
  const Json* v = member(body, "keep_alive");
  if (!v) return std::nullopt;
  auto bad = [&] {
    return bad_request("Invalid value for 'keep_alive': " + v->dump() +
                           " (expected a number of seconds or a duration such as \"5m\", \"1h30m\", \"0\").",
                       "keep_alive", "invalid_value");
  };
  if (v->is_number()) {
    seconds = v->get<double>();
    return std::isfinite(*seconds) ? std::nullopt : std::optional<ApiError>(bad());
  }
  if (!v->is_string()) return wrong_type("keep_alive", "a number or a duration string", *v);
  // Go's time.ParseDuration: [-+]? (decimal number, unit)+, or "0".
  const std::string s = v->get<std::string>();
  size_t i = 0;
  double sign = 1;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) sign = s[i++] == '-' ? -1 : 1;
  if (s.substr(i) == "0") {
    seconds = 0;
    return std::nullopt;
  }
  if (i == s.size()) return bad();
  {  // a bare number: seconds (as the number form)
    char* end = nullptr;
    const double x = std::strtod(s.c_str() + i, &end);
    if (end == s.c_str() + s.size() && std::isfinite(x) &&
        (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) {
      seconds = sign * x;
      return std::nullopt;
    }
  }
  static const std::pair<std::string_view, double> kUnits[] = {{"ns", 1e-9},        {"us", 1e-6}, {"\xC2\xB5s", 1e-6},
                                                               {"\xCE\xBCs", 1e-6}, {"ms", 1e-3}, {"s", 1},
                                                               {"m", 60},           {"h", 3600}};
  double total = 0;
  while (i < s.size()) {
    const size_t start = i;
    while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) ++i;
    if (i == start) return bad();
    char* end = nullptr;
    const std::string num = s.substr(start, i - start);
    const double x = std::strtod(num.c_str(), &end);
    if (end != num.c_str() + num.size()) return bad();
    bool found = false;
    for (const auto& [unit, scale] : kUnits) {  // "ms" before "m", "ns"/"us" before "s": longest first where it matters
      if (s.compare(i, unit.size(), unit) == 0 && !(unit == "m" && s.compare(i, 2, "ms") == 0)) {
        total += x * scale;
        i += unit.size();
        found = true;
        break;
      }
    }
    if (!found) return bad();
  }
  seconds = sign * total;
  return std::nullopt;
}

std::optional<ApiError> ollama_chat_body(const Json& body, Json& chat) {
  chat = Json::object();
  if (auto e = translate_common(body, chat)) return e;
  const Json* msgs = member(body, "messages");
  if (!msgs) return missing("messages");
  if (!msgs->is_array()) return wrong_type("messages", "an array", *msgs);
  Json out = Json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    Json m;
    if (auto e = translate_message((*msgs)[i], "messages[" + std::to_string(i) + "]", m)) return e;
    out.push_back(std::move(m));
  }
  chat["messages"] = std::move(out);
  if (const Json* t = member(body, "tools")) {
    if (!t->is_array()) return wrong_type("tools", "an array", *t);
    chat["tools"] = *t;  // OpenAI's shape; checked by the chat parser
  }
  return std::nullopt;
}

std::optional<ApiError> ollama_generate_body(const Json& body, Json& out, Endpoint& endpoint) {
  out = Json::object();
  if (auto e = translate_common(body, out)) return e;
  std::string prompt, system, suffix, tmpl;
  bool raw = false;
  if (auto e = optional_string(body, "prompt", prompt)) return e;
  if (auto e = optional_string(body, "system", system)) return e;
  if (auto e = optional_string(body, "suffix", suffix)) return e;
  if (auto e = optional_string(body, "template", tmpl)) return e;
  if (auto e = optional_bool(body, "raw", raw)) return e;
  if (!tmpl.empty())
    return unsupported("template",
                       "the prompt is rendered with the model's own chat template (or sent as is with raw).");
  if (auto e = no_images(body, "images")) return e;
  if (const Json* c = member(body, "context"); c && !(c->is_array() && c->empty()))
    return unsupported("context", "send the conversation to /api/chat instead (this server returns no context).");
  if (raw || !suffix.empty()) {  // a suffix: fill in the middle (prompt the prefix), as /v1/completions' suffix
    endpoint = Endpoint::kCompletion;
    out["prompt"] = prompt;
    if (!suffix.empty()) out["suffix"] = suffix;
    return std::nullopt;
  }
  endpoint = Endpoint::kChat;
  Json messages = Json::array();
  if (!system.empty()) messages.push_back(Json{{"role", "system"}, {"content", system}});
  messages.push_back(Json{{"role", "user"}, {"content", prompt}});
  out["messages"] = std::move(messages);
  return std::nullopt;
}

std::string resolve_ollama_model(const std::string& name, const std::vector<std::string>& ids) {
  if (std::find(ids.begin(), ids.end(), name) != ids.end()) return name;
  constexpr std::string_view kLatest = ":latest";
  if (name.size() > kLatest.size() && name.compare(name.size() - kLatest.size(), kLatest.size(), kLatest) == 0) {
    const std::string base = name.substr(0, name.size() - kLatest.size());
    if (std::find(ids.begin(), ids.end(), base) != ids.end()) return base;
  }
  return name;
}

std::string ollama_model_name(const std::string& id) { return id.find(':') == std::string::npos ? id + ":latest" : id; }

void add_ollama_routes(HttpTransport& http, ServerContext& ctx, ChatSubmitter submit) {
  auto r = std::make_shared<OllamaRoutes>(ctx, std::move(submit));
  http.get("/api/version", [](const HttpRequest&, HttpResponse& res) {
    send_json(res, 200, json{{"version", std::string(kOllamaApiVersion)}});
  });
  http.get("/api/tags", [r](const HttpRequest&, HttpResponse& res) { r->tags(res); });
  http.get("/api/ps", [r](const HttpRequest&, HttpResponse& res) { r->ps(res); });
  auto multipart = [](const HttpRequest&, HttpResponse& res) {
    send_ollama_error(res, bad_request("The request body must be JSON (got multipart/form-data).", {}, "invalid_json"));
  };
  http.post_json(
      "/api/show", [r](const HttpRequest&, const std::string& body, HttpResponse& res) { r->show(body, res); },
      multipart);
  for (const bool chat : {true, false})
    add_job_route(
        http, ctx, chat ? "/api/chat" : "/api/generate",
        [r, chat](const std::string& body, HttpResponse& res, Clock::time_point admitted) {
          return r->chat_or_generate(chat, body, res, admitted);
        },
        send_ollama_error);
  for (const bool legacy : {false, true})
    add_job_route(
        http, ctx, legacy ? "/api/embeddings" : "/api/embed",
        [r, legacy](const std::string& body, HttpResponse& res, Clock::time_point admitted) {
          return r->embed(legacy, body, res, admitted);
        },
        send_ollama_error);
  // Models are files here: a pull of a served model is a success, anything else says how models get here.
  http.post_json(
      "/api/pull",
      [r](const HttpRequest&, const std::string& text, HttpResponse& res) {
        Json body;
        if (auto e = parse_body(text, body)) return send_ollama_error(res, *e);
        std::string name;
        if (auto e = required_model(body, name)) return send_ollama_error(res, *e);
        const auto ids = served_ids(r->ctx);
        if (std::find(ids.begin(), ids.end(), resolve_ollama_model(name, ids)) != ids.end()) {
          res.status = 200;
          res.set_content(json{{"status", "success"}}.dump() + "\n", "application/x-ndjson");
          return;
        }
        ApiError e = bad_request("bonsai does not pull models: '" + name +
                                     "' is not served. Models are GGUF files: download one and start `bonsai serve "
                                     "-m ID=FILE.gguf`, or load it with POST /admin/models/load.",
                                 "model");
        e.status = 501;
        send_ollama_error(res, e);
      },
      multipart);
  auto files_only = [](const HttpRequest& req, HttpResponse& res) {
    ApiError e = bad_request(req.method + " " + req.path +
                             " is not supported: bonsai serves GGUF files named at start (-m ID=FILE) or loaded by "
                             "POST /admin/models/load; it does not create, copy, push or delete models.");
    e.status = 501;
    send_ollama_error(res, e);
  };
  for (const char* path : {"/api/push", "/api/create", "/api/copy"})
    http.route("POST", path, [files_only](const std::shared_ptr<Exchange>& ex) {
      HttpResponse res;
      files_only(ex->request(), res);
      ex->respond(std::move(res));
    });
  http.route("DELETE", "/api/delete", [files_only](const std::shared_ptr<Exchange>& ex) {
    HttpResponse res;
    files_only(ex->request(), res);
    ex->respond(std::move(res));
  });
  // Any other /api/ path: Ollama's error shape, not the transport's OpenAI one.
  for (const char* method : {"GET", "POST", "DELETE", "HEAD", "PUT"})
    http.route(method, "/api/*", [](const std::shared_ptr<Exchange>& ex) {
      HttpResponse res;
      ApiError e = bad_request("404 page not found: " + ex->request().method + " " + ex->request().path +
                               " is not an Ollama API route this server serves.");
      e.status = 404;
      send_ollama_error(res, e);
      ex->respond(std::move(res));
    });
}

}  // namespace bonsai::server
