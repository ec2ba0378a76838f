// `bonsai serve` configuration: the settings table, the TOML reader, the
// README table. See config.h (the CLI11 flags: config_flags.cpp).
#include "server/config.h"

#include <arpa/inet.h>  // inet_pton (is_loopback_host)
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>
#include <variant>

#include "engine/model_spec_fields.h"  // set_model_field: the ModelSpec keys
#include "gguf/gguf.h"                 // parse_split_name: a split part's model id

namespace bonsai::server {
namespace {

std::string normalize_key(std::string_view k) {
  std::string s(k);
  for (char& c : s)
    if (c == '_') c = '-';
  return s;
}

core::Expected<std::string> get_string(const toml::node& n, const std::string& where) {
  if (auto v = n.value<std::string>(); v && n.is_string()) return *v;
  return core::fail(core::Errc::kInvalidArgument, where + ": expected a string");
}

}  // namespace

std::optional<std::string> model_id_error(std::string_view id) {
  if (id.empty()) return "empty";
  if (id.size() > kMaxModelIdBytes) return "longer than " + std::to_string(kMaxModelIdBytes) + " bytes";
  for (unsigned char c : id)
    if (c <= 0x20 || c == 0x7f || c == '\\')
      return "whitespace, control characters and backslashes are not allowed in a model id";
  if (id.front() == '/') return "a model id may not start with '/'";
  size_t at = 0;
  while (at <= id.size()) {
    const size_t slash = std::min(id.find('/', at), id.size());
    const std::string_view seg = id.substr(at, slash - at);
    if (seg == "." || seg == "..") return "'.' and '..' path segments are not allowed in a model id";
    at = slash + 1;
  }
  return std::nullopt;
}

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
    if (auto why = model_id_error(m.id))
      return core::fail(core::Errc::kInvalidArgument, "-m '" + std::string(arg) + "': invalid model id: " + *why);
  } else {
    m.path = std::string(arg);
    std::filesystem::path p(m.path);
    if (p.filename().empty()) p = p.parent_path();  // "models/": a directory, named "models"
    m.id = p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
    // A part of a split model ("Bonsai-8B-Q1_0-00001-of-00003.gguf") names the set: "Bonsai-8B-Q1_0".
    if (auto split = gguf::parse_split_name(p.filename().string()); split && !split->prefix.empty())
      m.id = split->prefix;
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
    case kJinja:
      return c.no_jinja;  // spelled no-jinja
    case kChatTemplate:
      return c.chat_template.empty() ? engine::FieldValue{} : engine::FieldValue{c.chat_template};
    case kChatTemplateFile:
      return c.chat_template_file.empty() ? engine::FieldValue{} : engine::FieldValue{c.chat_template_file};
    case kSpecType:
      return c.spec_type;
    case kModelDraft:
      return c.model_draft.empty() ? engine::FieldValue{} : engine::FieldValue{c.model_draft};
    case kDraftMax:
      return int64_t{c.draft_max};
    case kDraftMin:
      return int64_t{c.draft_min};
    case kDraftPMin:
      return c.draft_p_min;
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
    case kJinja:
      c.no_jinja = std::get<bool>(v);
      break;
    case kChatTemplate:
      c.chat_template = std::get<std::string>(v);
      break;
    case kChatTemplateFile:
      c.chat_template_file = std::get<std::string>(v);
      break;
    case kSpecType:
      c.spec_type = std::get<std::string>(v);
      break;
    case kModelDraft:
      c.model_draft = std::get<std::string>(v);
      break;
    case kDraftMax:
      c.draft_max = n;
      break;
    case kDraftMin:
      c.draft_min = n;
      break;
    case kDraftPMin:
      c.draft_p_min = i != nullptr ? static_cast<double>(*i) : std::get<double>(v);
      break;
  }
}

// ---- Values: converting a flag's text or a TOML node, checking the row ----

using enum SettingKind;
using enum SettingScope;

core::Expected<void> refuse(std::string reason) { return core::fail(core::Errc::kInvalidArgument, std::move(reason)); }

// A number as the messages print it: integers without a decimal point.
std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}

// "expected ...": what the row takes (a server row's; model rows say theirs
// through engine::set_model_field).
std::string expected_text(const SettingInfo& s) {
  switch (s.kind) {
    case kSwitch:
      return "expected true or false";
    case kInt:
      return "expected an integer in [" + std::to_string(s.min) + ", " + std::to_string(s.max) + "]";
    case kNumber:
      return "expected a number in [" + number_text(s.min_number) + ", " + number_text(s.max_number) + "]";
    case kList:
      return "expected a string or an array of strings";
    case kString:
      break;
  }
  if (s.choices.empty()) return "expected a string";
  std::string out = "expected";
  std::string_view rest = s.choices;
  for (bool first = true; !rest.empty(); first = false) {
    const size_t bar = rest.find('|');
    const std::string_view choice = rest.substr(0, bar);
    rest = bar == std::string_view::npos ? std::string_view{} : rest.substr(bar + 1);
    out += first ? " \"" : rest.empty() ? " or \"" : ", \"";
    out += std::string(choice) + "\"";
  }
  return out;
}

// A TOML node as the row's kind takes it (std::monostate: another type).
SettingValue toml_setting_value(const SettingInfo& s, const toml::node& n) {
  switch (s.kind) {
    case kSwitch:
      if (n.is_boolean()) return *n.value<bool>();
      break;
    case kInt:
      if (n.is_integer()) return *n.value<int64_t>();
      break;
    case kNumber:
      if (n.is_integer()) return *n.value<int64_t>();
      if (n.is_floating_point()) return *n.value<double>();
      break;
    case kString:
      if (n.is_string()) return *n.value<std::string>();
      break;
    case kList:
      if (n.is_string()) return std::vector<std::string>{*n.value<std::string>()};
      if (const toml::array* arr = n.as_array()) {
        std::vector<std::string> items;
        for (const toml::node& item : *arr) {
          if (!item.is_string()) return std::monostate{};
          items.push_back(*item.value<std::string>());
        }
        return items;
      }
      break;
  }
  return std::monostate{};
}

// Command-line text as the row's kind takes it: the last of `texts` (a
// repeatable flag: all of them).
SettingValue text_setting_value(const SettingInfo& s, std::span<const std::string> texts) {
  if (s.kind == kList) return std::vector<std::string>(texts.begin(), texts.end());
  if (texts.empty()) return s.kind == kSwitch ? SettingValue{true} : SettingValue{};
  const std::string& t = texts.back();
  switch (s.kind) {
    case kSwitch:
      if (t.empty() || t == "true" || t == "1") return true;
      if (t == "false" || t == "0") return false;
      break;
    case kInt: {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
      if (ec == std::errc() && end == t.data() + t.size()) return v;
      break;
    }
    case kNumber: {
      int64_t i = 0;
      if (const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), i);
          ec == std::errc() && end == t.data() + t.size())
        return i;
      char* end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end == t.c_str() + t.size() && !std::isnan(d)) return d;  // "inf": a timeout without a limit
      break;
    }
    case kString:
      return t;
    case kList:
      break;
  }
  return std::monostate{};
}

double number_of(const SettingValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::get<double>(v);
}
const std::string& text_of(const SettingValue& v) { return std::get<std::string>(v); }
const std::vector<std::string>& list_of(const SettingValue& v) { return std::get<std::vector<std::string>>(v); }

// A server row's value: of its kind, in its range, one of its choices.
core::Expected<void> check_server_value(const SettingInfo& s, const SettingValue& v) {
  bool ok = false;
  switch (s.kind) {
    case kSwitch:
      ok = std::holds_alternative<bool>(v);
      break;
    case kInt:
      ok = std::holds_alternative<int64_t>(v) && std::get<int64_t>(v) >= s.min && std::get<int64_t>(v) <= s.max;
      break;
    case kNumber:
      ok = (std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v)) && number_of(v) >= s.min_number &&
           number_of(v) <= s.max_number;
      break;
    case kString:
      ok = std::holds_alternative<std::string>(v);
      if (ok && !s.choices.empty()) {
        ok = false;
        std::string_view rest = s.choices;
        while (!ok && !rest.empty()) {
          const size_t bar = rest.find('|');
          ok = rest.substr(0, bar) == text_of(v);
          rest = bar == std::string_view::npos ? std::string_view{} : rest.substr(bar + 1);
        }
      }
      break;
    case kList:
      ok = std::holds_alternative<std::vector<std::string>>(v);
      break;
  }
  return ok ? core::Expected<void>{} : refuse(expected_text(s));
}

// A model row's value as the ModelSpec parser takes it.
engine::FieldValue field_value(const SettingValue& v) {
  return std::visit(
      [](const auto& x) -> engine::FieldValue {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::vector<std::string>>)
          return std::monostate{};
        else
          return x;
      },
      v);
}

// A model row (a ModelSpec field): checked by the one parser, the same for
// the flag, the key and the admin load body; q2-layout only for its type
// here: its name is checked where the flag's is (cmd_serve, exit status 2),
// as the same BONSAI_Q2_LAYOUT / --q2-layout rules apply.
core::Expected<void> apply_model_setting(const SettingInfo& s, const engine::FieldValue& v, ServeConfig& config) {
  const engine::ModelFieldInfo* f = engine::find_model_field(s.name);
  if (f == nullptr) return refuse("not a model setting");  // the table says it is: a bug, reported
  if (f->field == engine::ModelField::kQ2Layout) {
    if (!std::holds_alternative<std::string>(v)) return refuse("expected a string");
  } else {
    engine::ModelSpec scratch;
    if (auto r = engine::set_model_field(scratch, f->toml_key, v); !r) return refuse(r.error().message);
  }
  store_model_value(config, f->field, v);
  return {};
}

// Checks and stores a server or command-line row's value.
core::Expected<void> apply_server_setting(const SettingInfo& s, const SettingValue& v, ServeConfig& config) {
  if (auto r = check_server_value(s, v); !r) return r;
  if (s.apply == nullptr) return {};
  return s.apply(s, v, config);
}

// ---- The rows' appliers (value already of the row's kind and range) ----

core::Expected<void> apply_models(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  std::vector<ModelArg> models;
  for (const auto& item : list_of(v)) {
    auto m = parse_model_arg(item);
    if (!m) return std::unexpected(m.error());
    models.push_back(*m);
  }
  c.models = std::move(models);  // the flags replace the file's; in a file, [models] adds to them
  return {};
}
core::Expected<void> apply_hf_repos(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  for (const auto& item : list_of(v))
    if (item.empty() || item.find('/') == std::string::npos)
      return refuse("'" + item + "': expected [ID=]OWNER/NAME[:QUANT] (e.g. prism-ml/Bonsai-8B-gguf:Q1_0)");
  c.hf_repos = list_of(v);
  return {};
}
core::Expected<void> apply_hf_file(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.hf_file = text_of(v);
  return {};
}
core::Expected<void> apply_preload(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.preload = list_of(v);
  c.preload_set = true;
  return {};
}
core::Expected<void> apply_host(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.host = text_of(v);
  return {};
}
core::Expected<void> apply_port(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.port = static_cast<int>(std::get<int64_t>(v));
  return {};
}
core::Expected<void> apply_api_key(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  if (is_blank_key(text_of(v)))
    return refuse(
        "the API key is blank (an unset variable?); give a key, or leave the setting out to serve without "
        "authentication");
  c.api_key = text_of(v);
  return {};
}
core::Expected<void> apply_admin_open(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.admin_open = std::get<bool>(v);
  return {};
}
core::Expected<void> apply_alias(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.alias = text_of(v);
  if (c.alias.empty()) return core::fail(core::Errc::kInvalidArgument, "the alias is empty");
  return {};
}
core::Expected<void> apply_strict_model_names(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.strict_model_names = std::get<bool>(v);
  return {};
}
core::Expected<void> apply_cors_origin(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.cors_origin = text_of(v);
  return {};
}
core::Expected<void> apply_timeout(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.timeout_s = number_of(v);
  return {};
}
core::Expected<void> apply_models_max(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.models_max = static_cast<int>(std::get<int64_t>(v));
  return {};
}
core::Expected<void> apply_mem_budget(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.mem_budget_mb = static_cast<uint64_t>(std::get<int64_t>(v));
  return {};
}
core::Expected<void> apply_threads(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.threads = static_cast<int>(std::get<int64_t>(v));
  return {};
}
core::Expected<void> apply_seed(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.seed = static_cast<uint64_t>(std::get<int64_t>(v));
  c.seed_set = true;
  return {};
}
core::Expected<void> apply_reasoning_format(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.reasoning_format = text_of(v);
  return {};
}
core::Expected<void> apply_max_connections(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.max_connections = static_cast<int>(std::get<int64_t>(v));
  return {};
}
core::Expected<void> apply_max_body(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.max_body_bytes = static_cast<size_t>(std::get<int64_t>(v));
  return {};
}
// The transport's four timeouts, told apart by the row's name.
core::Expected<void> apply_transport_timeout(const SettingInfo& s, const SettingValue& v, ServeConfig& c) {
  (s.name == "header-timeout"       ? c.header_timeout_s
   : s.name == "body-timeout"       ? c.body_timeout_s
   : s.name == "keep-alive-timeout" ? c.keep_alive_timeout_s
                                    : c.write_timeout_s) = number_of(v);
  return {};
}
core::Expected<void> apply_drain_timeout(const SettingInfo&, const SettingValue& v, ServeConfig& c) {
  c.drain_timeout_s = number_of(v);
  return {};
}

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The table. Defaults here are words for people; the values themselves are
// ServeConfig's member initialisers (and ModelSpec's, for model rows).
constexpr SettingInfo kSettings[] = {
    // What is served.
    {.name = "model",
     .alias = "-m",
     .kind = kList,
     .scope = kServer,
     .value_name = "[ID=]FILE",
     .default_text = "the built-in model",
     .help = "A model to serve; ID is the name requests give, the file name without .gguf if left out. Repeatable. "
             "A directory (no ID) serves each .gguf file in it, a split model's parts as one model.",
     .example = "tiny=/models/tiny.gguf",
     .apply = apply_models},
    {.name = "hf-repo",
     .alias = "-hf",
     .kind = kList,
     .scope = kServer,
     .value_name = "[ID=]OWNER/NAME[:QUANT]",
     .default_text = "none",
     .help = "A model from Hugging Face (QUANT: Q1_0, Q2_0, PQ2_0, PTQ1_0, ...), downloaded into its cache before "
             "serving and read from there afterwards (HF_HOME, HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE). Repeatable.",
     .example = "prism-ml/Bonsai-8B-gguf:Q1_0",
     .apply = apply_hf_repos},
    {.name = "hf-file",
     .alias = "-hff",
     .kind = kString,
     .scope = kServer,
     .value_name = "FILE",
     .default_text = "chosen by QUANT",
     .help = "The exact file of the one hf-repo repository.",
     .example = "Bonsai-8B-Q1_0.gguf",
     .apply = apply_hf_file},
    {.name = "alias",
     .alias = "-a",
     .kind = kString,
     .scope = kServer,
     .value_name = "NAME",
     .default_text = "the model's id",
     .help = "The name /v1/models lists and answers report for the one model served (llama-server's --alias); "
             "with several models, name each with -m ID=FILE instead.",
     .example = "qwen3",
     .apply = apply_alias},
    {.name = "strict-model-names",
     .kind = kSwitch,
     .scope = kServer,
     .default_text = "off: with one model served, any model name is that model",
     .help = "A request naming a model that is not served gets 404 model_not_found even when only one model is "
             "served (by default any name means the one model, as llama-server does).",
     .example = "true",
     .apply = apply_strict_model_names},
    {.name = "config",
     .kind = kString,
     .scope = kCommandLine,
     .value_name = "FILE",
     .default_text = "none",
     .help = "A TOML file of these settings, keyed by their long names; flags given on the command line win.",
     .example = "serve.toml"},
    {.name = "preload",
     .kind = kList,
     .scope = kServer,
     .value_name = "ID",
     .default_text = "the first models-max models",
     .help = "A model to load at start (repeatable); the others load on first use. TOML: also [router] preload.",
     .example = "tiny",
     .apply = apply_preload},
    {.name = "models-max",
     .kind = kInt,
     .scope = kServer,
     .value_name = "K",
     .default_text = "the number of models",
     .help = "Models resident at once (LRU; only idle models are evicted).",
     .example = "2",
     .min = 0,
     .max = kIntMax,
     .apply = apply_models_max},
    {.name = "mem-budget",
     .kind = kInt,
     .scope = kServer,
     .value_name = "MIB",
     .default_text = "0: unlimited",
     .help = "Memory budget of the resident models in MiB.",
     .example = "4096",
     .min = 0,
     .max = kInt64Max,
     .apply = apply_mem_budget},
    {.name = "threads",
     .alias = "-t",
     .kind = kInt,
     .scope = kServer,
     .value_name = "N",
     .default_text = "the physical cores",
     .help = "Compute threads shared by all models.",
     .example = "2",
     .min = 0,
     .max = kIntMax,
     .apply = apply_threads},
    // Listening.
    {.name = "host",
     .kind = kString,
     .scope = kServer,
     .value_name = "ADDR",
     .default_text = "127.0.0.1",
     .help = "Address to listen on.",
     .example = "0.0.0.0",
     .apply = apply_host},
    {.name = "port",
     .kind = kInt,
     .scope = kServer,
     .value_name = "PORT",
     .default_text = "8080",
     .help = "Port to listen on; 0: any free port.",
     .example = "9090",
     .min = 0,
     .max = 65535,
     .apply = apply_port},
    {.name = "api-key",
     .kind = kString,
     .scope = kServer,
     .value_name = "KEY",
     .default_text = "none: no authentication",
     .help = "Require 'Authorization: Bearer KEY' (or Anthropic's 'x-api-key: KEY') on /v1 and /admin. Never blank: an "
             "empty or whitespace key is "
             "a usage error. Without a key on a non-loopback host the server warns and /admin answers 403.",
     .example = "secret",
     .apply = apply_api_key},
    {.name = "admin-open",
     .kind = kSwitch,
     .scope = kServer,
     .default_text = "off",
     .help = "Serve /admin without an API key on a non-loopback host (otherwise 403 there).",
     .example = "true",
     .apply = apply_admin_open},
    {.name = "cors-origin",
     .kind = kString,
     .scope = kServer,
     .value_name = "ORIGINS",
     .default_text = "off",
     .help = "Allow browsers on these origins to call the API (CORS): '*' or a comma-separated list.",
     .example = "https://a.example",
     .apply = apply_cors_origin},
    // Each model (ModelSpec fields; POST /admin/models/load may set them per model).
    {.name = "pool-size",
     .kind = kInt,
     .scope = kModel,
     .value_name = "N",
     .default_text = "the cores, at most 4",
     .help = "Engine replicas per model; sizes the default KV budget (pool-size x ctx-size).",
     .example = "2"},
    {.name = "parallel",
     .alias = "-np",
     .kind = kInt,
     .scope = kModel,
     .value_name = "N",
     .default_text = "16",
     .help = "Sequences per model generating at once, batched in one step loop, whatever pool-size is.",
     .example = "4"},
    {.name = "ctx-size",
     .alias = "-c",
     .kind = kInt,
     .scope = kModel,
     .value_name = "N",
     .default_text = "0: the model's, at most 4096",
     .help = "Context size of a sequence in tokens.",
     .example = "512"},
    {.name = "kv-budget-tokens",
     .kind = kInt,
     .scope = kModel,
     .value_name = "N",
     .default_text = "pool-size x ctx-size",
     .help = "KV cache budget per model in tokens, shared by all its sequences in blocks as they grow; at least "
             "ctx-size.",
     .example = "8192"},
    {.name = "batch-size",
     .alias = "-b",
     .kind = kInt,
     .scope = kModel,
     .value_name = "N",
     .default_text = "512",
     .help = "Most tokens per scheduler step: running streams' tokens plus prompt chunks.",
     .example = "64"},
    {.name = "step-budget-ms",
     .kind = kNumber,
     .scope = kModel,
     .value_name = "MS",
     .default_text = "0: twice the decode step",
     .help = "Target duration of a scheduler step with running streams: long prompts advance in chunks sized to it "
             "from measured step costs, so streams keep their pace.",
     .example = "40"},
    {.name = "spec-type",
     .kind = kString,
     .scope = kModel,
     .value_name = "TYPE",
     .default_text = "none",
     .help = "Speculative decoding: ngram (prompt lookup: tokens that followed an earlier occurrence of the last "
             "ones are verified as extra rows of one step; greedy text is unchanged, sampled text keeps its "
             "distribution; each sequence turns it off where its proposals are not accepted) or none (the default "
             "until it is shown to pay on this machine: bench/spec_bench.sh); draft: the model-draft model "
             "proposes (implied by -md).",
     .example = "ngram",
     .choices = "none|ngram|draft"},
    {.name = "model-draft",
     .alias = "-md",
     .kind = kString,
     .scope = kModel,
     .value_name = "FILE",
     .default_text = "none",
     .help = "Draft model for speculative decoding (llama-server's flag; implies spec-type draft): a small GGUF "
             "with the model's tokenizer (checked at load: a different vocabulary is refused naming both files), "
             "run greedy for up to draft-max tokens per sequence and step, stopping below draft-p-min; its "
             "weights and a KV cache per sequence count in the model's memory.",
     .example = "draft.gguf"},
    {.name = "draft-max",
     .kind = kInt,
     .scope = kModel,
     .value_name = "N",
     .default_text = "8",
     .help = "Most tokens proposed per sequence and step (0: no speculation); fewer where acceptance is low.",
     .example = "4"},
    {.name = "draft-min",
     .kind = kInt,
     .scope = kModel,
     .value_name = "N",
     .default_text = "0",
     .help = "Fewest proposed tokens worth verifying: a shorter proposal is not run.",
     .example = "2"},
    {.name = "draft-p-min",
     .kind = kNumber,
     .scope = kModel,
     .value_name = "P",
     .default_text = "0.75",
     .help = "Smallest draft-model probability of a proposed token (for a draft model; prompt lookup has none).",
     .example = "0.5"},
    {.name = "queue-factor",
     .kind = kInt,
     .scope = kModel,
     .value_name = "N",
     .default_text = "4",
     .help = "Requests that may wait per sequence slot (parallel) before new ones get 503 + Retry-After.",
     .example = "2"},
    {.name = "no-cache-prompt",
     .kind = kSwitch,
     .scope = kModel,
     .default_text = "off: the prompt cache is on",
     .help = "Do not reuse cached prompt prefixes across requests.",
     .example = "true"},
    {.name = "cache-type-k",
     .alias = "-ctk",
     .kind = kString,
     .scope = kModel,
     .value_name = "TYPE",
     .default_text = "f16",
     .help = "KV cache type of K: f16, f32 or q8_0 (llama.cpp's names; with q8_0 keys attention scores int8 "
             "queries against them, as llama.cpp's CPU flash attention).",
     .example = "q8_0"},
    {.name = "cache-type-v",
     .alias = "-ctv",
     .kind = kString,
     .scope = kModel,
     .value_name = "TYPE",
     .default_text = "f16",
     .help = "KV cache type of V: f16, f32 or q8_0.",
     .example = "f32"},
    {.name = "q2-layout",
     .kind = kString,
     .scope = kModel,
     .value_name = "LAYOUT",
     .default_text = "detected per file",
     .help = "Force the type-42 (Q2_0) layout of the models named here: g64, g128-d-first or g128-qs-first. The "
             "flag wins over env BONSAI_Q2_LAYOUT, which wins over the config's key.",
     .example = "g64"},
    {.name = "no-repack",
     .kind = kSwitch,
     .scope = kModel,
     .default_text = "off",
     .help = "Keep every weight a zero-copy view of the file (no load-time repacked layout; env BONSAI_NO_REPACK=1).",
     .example = "true"},
    // Requests.
    {.name = "timeout",
     .kind = kNumber,
     .scope = kServer,
     .value_name = "SECONDS",
     .default_text = "600",
     .help = "Time limit of a request, queued and generating (inf: none). One that runs out while generating ends with "
             "what it "
             "produced: finish_reason \"length\" and \"timed_out\": true.",
     .example = "30",
     .min_number = 0.001,
     .max_number = std::numeric_limits<double>::infinity(),  // inf: no limit
     .apply = apply_timeout},
    {.name = "seed",
     .alias = "-s",
     .kind = kInt,
     .scope = kServer,
     .value_name = "N",
     .default_text = "a fresh random seed per request",
     .help = "Seed of requests that give none.",
     .example = "42",
     .min = 0,
     .max = kInt64Max,
     .apply = apply_seed},
    {.name = "no-jinja",
     .kind = kSwitch,
     .scope = kModel,
     .default_text = "off",
     .help = "Render chat prompts with the built-in renderer of the template's family (Qwen3, Qwen3.5, else "
             "ChatML) instead of the Jinja interpreter, which renders the model's template by default (llama-server's "
             "--jinja, accepted and ignored).",
     .example = "true"},
    {.name = "chat-template",
     .kind = kString,
     .scope = kModel,
     .value_name = "NAME|TEMPLATE",
     .default_text = "the GGUF's tokenizer.chat_template",
     .help = "Chat template: a built-in renderer (chatml, qwen3, qwen35) or a Jinja template's text (llama-server's "
             "flag).",
     .example = "chatml"},
    {.name = "chat-template-file",
     .kind = kString,
     .scope = kModel,
     .value_name = "FILE",
     .default_text = "none",
     .help = "Chat template read from a Jinja file when the model loads (llama-server's flag); wins over "
             "--chat-template.",
     .example = "template.jinja"},
    {.name = "reasoning-format",
     .kind = kString,
     .scope = kServer,
     .value_name = "FORMAT",
     .default_text = "deepseek",
     .help = "Chat answers' <think>...</think>: 'deepseek' returns it as reasoning_content, 'none' leaves it in "
             "content (llama-server's flag).",
     .example = "none",
     .choices = "deepseek|none",
     .apply = apply_reasoning_format},
    // Connections.
    {.name = "max-connections",
     .kind = kInt,
     .scope = kServer,
     .value_name = "N",
     .default_text = "1024",
     .help = "Open connections served at once; past it a new connection gets 503 and is closed.",
     .example = "64",
     .min = 1,
     .max = int64_t{1} << 20,
     .apply = apply_max_connections},
    {.name = "max-body",
     .kind = kInt,
     .scope = kServer,
     .value_name = "BYTES",
     .default_text = "4194304",
     .help = "Largest request body; a larger one gets 413.",
     .example = "100000",
     .min = 1,
     .max = int64_t{1} << 40,
     .apply = apply_max_body},
    {.name = "header-timeout",
     .kind = kNumber,
     .scope = kServer,
     .value_name = "SECONDS",
     .default_text = "10",
     .help = "Time a client has to send a request's whole header; then the connection is closed.",
     .example = "2.5",
     .min_number = 0.001,
     .max_number = 86400,
     .apply = apply_transport_timeout},
    {.name = "body-timeout",
     .kind = kNumber,
     .scope = kServer,
     .value_name = "SECONDS",
     .default_text = "30",
     .help = "Time a client has to send a request's whole body once its header is in.",
     .example = "3",
     .min_number = 0.001,
     .max_number = 86400,
     .apply = apply_transport_timeout},
    {.name = "keep-alive-timeout",
     .kind = kNumber,
     .scope = kServer,
     .value_name = "SECONDS",
     .default_text = "5",
     .help = "Time an idle keep-alive connection waits for its next request.",
     .example = "4",
     .min_number = 0.001,
     .max_number = 86400,
     .apply = apply_transport_timeout},
    {.name = "write-timeout",
     .kind = kNumber,
     .scope = kServer,
     .value_name = "SECONDS",
     .default_text = "60",
     .help = "Time one write to a client may make no progress before the connection is closed.",
     .example = "5",
     .min_number = 0.001,
     .max_number = 86400,
     .apply = apply_transport_timeout},
    {.name = "drain-timeout",
     .kind = kNumber,
     .scope = kServer,
     .value_name = "SECONDS",
     .default_text = "30",
     .help = "Time the first SIGTERM/SIGINT gives running requests to finish (new and queued ones get 503 draining, "
             "/health 503) before the rest are cancelled and the server exits 0; 0: at once.",
     .example = "7.5",
     .min_number = 0,
     .max_number = 86400,
     .apply = apply_drain_timeout},
};

// Applies `v` for row `s` (either scope).
core::Expected<void> apply_setting(const SettingInfo& s, const SettingValue& v, ServeConfig& config) {
  if (s.scope == kModel) return apply_model_setting(s, field_value(v), config);
  return apply_server_setting(s, v, config);
}

// [models] id = "path": each one more model.
core::Expected<void> apply_models_table(const toml::node& node, const std::string& where, ServeConfig& config) {
  const toml::table* t = node.as_table();
  if (!t) return refuse(where + ": expected a table of id = \"path\"");
  for (const auto& [id, path] : *t) {
    auto s = get_string(path, where + "." + std::string(id.str()));
    if (!s) return std::unexpected(s.error());
    config.models.push_back(ModelArg{std::string(id.str()), *s});
  }
  return {};
}

// [router] preload = ["id", ...]: the preload setting.
core::Expected<void> apply_router(const toml::node& node, const std::string& name, const std::string& where,
                                  ServeConfig& config) {
  const toml::table* t = node.as_table();
  if (!t) return refuse(where + ": expected a table");
  const SettingInfo& preload = *find_serve_setting("preload");
  for (const auto& [rk, rv] : *t) {
    const std::string rwhere = name + ": key 'router." + std::string(rk.str()) + "'";
    if (normalize_key(rk.str()) != "preload") return refuse(rwhere + ": unknown key (expected 'preload')");
    if (auto r = apply_setting(preload, toml_setting_value(preload, rv), config); !r)
      return refuse(rwhere + ": " + r.error().message);
  }
  return {};
}

// "unknown key (known: ...)": every TOML key, from the table.
std::string unknown_key_text() {
  std::string out = "unknown key (known: ";
  for (const SettingInfo& s : kSettings)
    if (s.scope != kCommandLine) out += std::string(s.name) + ", ";
  return out + "and the tables [models], [router])";
}

}  // namespace

std::span<const SettingInfo> serve_settings() { return kSettings; }

const SettingInfo* find_serve_setting(std::string_view key) {
  std::string k = normalize_key(key);
  if (k.starts_with("--")) k.erase(0, 2);
  for (const SettingInfo& s : kSettings)
    if (k == s.name || (!s.alias.empty() && key == s.alias)) return &s;
  return nullptr;
}

core::Expected<void> apply_serve_setting_text(const SettingInfo& s, std::span<const std::string> texts,
                                              ServeConfig& config) {
  if (s.scope == kModel && s.kind != kSwitch) {
    const engine::ModelFieldInfo* f = engine::find_model_field(s.name);
    if (f == nullptr || texts.empty()) return refuse("not a model setting");
    return apply_model_setting(s, engine::parse_model_field_text(*f, texts.back()), config);
  }
  return apply_setting(s, text_setting_value(s, texts), config);
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
    return refuse(os.str());
  }
  // (toml++ keeps a table's keys sorted: `model` comes before `models`,
  // whose entries add to it.)
  for (const auto& [key_node, node] : root) {
    const std::string key = normalize_key(key_node.str());
    const std::string where = name + ": key '" + std::string(key_node.str()) + "'";
    if (key == "models") {
      if (auto r = apply_models_table(node, where, config); !r) return r;
      continue;
    }
    if (key == "router") {
      if (auto r = apply_router(node, name, where, config); !r) return r;
      continue;
    }
    const SettingInfo* s = nullptr;
    for (const SettingInfo& row : kSettings)
      if (key == row.name) s = &row;
    if (s == nullptr) return refuse(where + ": " + unknown_key_text());
    if (s->scope == kCommandLine)
      return refuse(where + ": a command-line flag only (a config file cannot name another)");
    // A model row's value goes to the ModelSpec parser as TOML typed it (its
    // messages name the type it expected); a server row's by its kind.
    const core::Expected<void> r = s->scope == kModel ? apply_model_setting(*s, toml_field_value(node), config)
                                                      : apply_server_setting(*s, toml_setting_value(*s, node), config);
    if (!r) return refuse(where + ": " + r.error().message);
  }
  return {};
}

namespace {

// A markdown table cell: '|' escaped, so it stays one cell, and '<' as an
// entity, so "<think>" shows instead of being taken for an HTML tag.
std::string cell(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '<') {
      out += "&lt;";
      continue;
    }
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::string serve_settings_markdown() {
  std::string out =
      "| Flag | TOML key | Default | Applies to | What it does |\n"
      "|---|---|---|---|---|\n";
  for (const SettingInfo& s : kSettings) {
    std::string flag =
        "`--" + std::string(s.name) + (s.value_name.empty() ? "" : " " + std::string(s.value_name)) + "`";
    if (!s.alias.empty()) flag = "`" + std::string(s.alias) + "`, " + flag;
    const std::string key = s.scope == kCommandLine ? "-" : "`" + std::string(s.name) + "`";
    std::string scope = "server";
    if (s.scope == kCommandLine) scope = "command line";
    if (s.scope == kModel) {
      const engine::ModelFieldInfo* f = engine::find_model_field(s.name);
      scope = "each model (admin load: `" + std::string(f != nullptr ? f->name : s.name) + "`)";
    }
    out += "| " + cell(flag) + " | " + cell(key) + " | " + cell(s.default_text) + " | " + scope + " | " + cell(s.help) +
           " |\n";
  }
  return out;
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
  if (!c.alias.empty() && c.models.size() > 1)
    return core::fail(core::Errc::kInvalidArgument, "alias '" + c.alias + "' names the one model served, but " +
                                                        std::to_string(c.models.size()) +
                                                        " models are given; name each with -m ID=FILE instead");
  for (const auto& id : c.preload) {
    bool found = false;
    for (const auto& m : c.models) found = found || m.id == id;
    if (!found)
      return core::fail(core::Errc::kInvalidArgument, "router.preload names '" + id + "', which is not a model");
  }
  return {};
}

}  // namespace bonsai::server
