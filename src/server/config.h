// `bonsai serve` configuration: one table of settings (serve_settings())
// from which the command-line flags (add_serve_flags), the TOML config file's
// keys (--config FILE.toml, parsed with toml++), `bonsai serve --help` and
// the README's settings table (serve_settings_markdown) are all produced, so
// a setting cannot exist in one and not the other. Flags given on the
// command line override the file.
//
// TOML: every setting's long name is a key ('_' may replace '-'), with the
// same value as the flag (a switch takes true / false, a repeatable flag a
// string or an array of strings), except `config` itself. Two tables are
// other spellings of settings:
//   model = ["stories=/path/stories260K.gguf", "/path/other.gguf"]   # -m
//   [models]             # id = "path", each one more -m ID=FILE
//   tiny = "/path/qwen3-tiny-q1_0.gguf"
//   [router]
//   preload = ["stories"]   # --preload (the top-level key preload is the same)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error.h"
#include "engine/model_spec_fields.h"  // ModelSpec, kMaxModelParallel

namespace CLI {
class App;
}

namespace bonsai::server {

// `serve`'s default -np: 16 sequences per model batch in one step (issue
// 28: a 2-core machine serves 16 streams at once; a sequence slot costs a
// logits row, its KV comes from the model's one budget).
inline constexpr int kDefaultParallel = 16;
// Largest -np accepted (each slot holds an [n_vocab] logits row); the one
// ModelSpec parser's bound, the same for flags, config and admin loads.
inline constexpr int kMaxParallel = engine::kMaxModelParallel;

// One `-m [ID=]FILE`.
struct ModelArg {
  std::string id;  // defaults to the file name without .gguf
  std::string path;
  bool operator==(const ModelArg&) const = default;
};

struct ServeConfig {
  std::vector<ModelArg> models;
  // hf-repo (-hf, llama-server's flag): "[ID=]OWNER/NAME[:QUANT]" models
  // from Hugging Face, fetched into its cache by `bonsai serve` (src/hub)
  // before serving; ID defaults to the file name without .gguf.
  std::vector<std::string> hf_repos;
  std::string hf_file;               // hf-file (-hff): the exact file of the one hf-repo
  std::vector<std::string> preload;  // [router] preload
  bool preload_set = false;          // false: preload every model (up to models_max)
  // The model keys (pool-size, parallel, ctx-size, kv-budget-tokens,
  // queue-factor, step-budget-ms, batch-size, no-cache-prompt, q2-layout,
  // cache-type-k/v, no-repack) are ModelSpec fields: their types and ranges
  // are engine::set_model_field's (model_spec_fields.h); serve_model_spec
  // turns them into the ModelSpec.
  int pool_size = 0;  // replicas per model; 0: default_cpu_pool_size()
  // parallel (-np/--parallel, llama-server's flag; vLLM's max_num_seqs):
  // live sequences per model, batched in one step loop, whatever pool-size
  // is (ModelSpec::parallel). 1..kMaxParallel.
  int parallel = kDefaultParallel;
  int models_max = 0;          // resident models at most; 0: max(1, number of models)
  uint64_t mem_budget_mb = 0;  // 0: unlimited
  int ctx_size = 0;            // KV positions per replica; 0: min(model's, 4096)
  // kv-budget-tokens: KV positions per model, all sequences together (one
  // paged block pool); 0: pool_size x ctx_size. At least ctx_size.
  int64_t kv_budget_tokens = 0;
  int threads = 0;  // compute threads; 0: physical cores
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // empty: no authentication (a key that is given is never blank)
  // admin-open: /admin routes answer without a key on a non-loopback host
  // (ServerOptions::admin_open). Off: there they need api-key (403 without).
  bool admin_open = false;
  std::string cors_origin;  // cors-origin: ServerOptions::cors_origin (empty: CORS off)
  // alias (-a/--alias, llama-server's): the id of the one model served (in
  // /v1/models and answers) instead of the one -m derives; empty: that one.
  // validate_serve_config refuses it with more than one model.
  std::string alias;
  // strict-model-names: ServerOptions::strict_model_names (an unknown model
  // name is a 404 even when one model is served).
  bool strict_model_names = false;
  double timeout_s = 600;            // per request (waiting + generating)
  size_t max_body_bytes = 4u << 20;  // larger bodies get 413
  int queue_factor = 4;              // requests waiting per sequence slot (parallel) before 503
  // step-budget-ms: SchedulerOptions::step_budget_ms (0: twice the decode step).
  double step_budget_ms = 0;
  // The same keys as the flags of the same names (`serve --help`):
  int batch_size = 0;  // batch-size (-b): tokens per step; 0: 512
  // Speculative decoding (engine::SpecOptions; llama.cpp's names):
  std::string spec_type = "none";             // spec-type: none | ngram (prompt lookup) | draft (-md)
  std::string model_draft;                    // model-draft / -md: the draft model's GGUF (empty: none)
  int draft_max = 8;                          // draft-max: most proposed tokens per step (0: off)
  int draft_min = 0;                          // draft-min: fewest worth verifying
  double draft_p_min = 0.75;                  // draft-p-min: a draft model's (prompt lookup has no probabilities)
  bool seed_set = false;                      // seed (-s) given
  uint64_t seed = 0;                          // seed of requests that give none
  std::string reasoning_format = "deepseek";  // reasoning-format: deepseek | none
  bool no_cache_prompt = false;               // no-cache-prompt
  // Chat template (ModelSpec::jinja / chat_template / chat_template_file):
  // no-jinja, chat-template NAME|TEXT, chat-template-file FILE.
  bool no_jinja = false;
  std::string chat_template;
  std::string chat_template_file;
  int max_connections = 1024;  // max-connections: 1..2^20
  // header-timeout / body-timeout / keep-alive-timeout / write-timeout in
  // seconds (0: the transport's default; given: 0.001..86400).
  double header_timeout_s = 0, body_timeout_s = 0, keep_alive_timeout_s = 0, write_timeout_s = 0;
  // drain-timeout (--drain-timeout): seconds the first SIGTERM/SIGINT lets
  // running requests finish (Server::drain) before the rest are cancelled;
  // 0..86400, 0: no drain (cancel at once).
  double drain_timeout_s = 30;
  // Q2_0 layout name for every model (g64, g128-d-first, g128-qs-first);
  // empty: detected. Checked by validate_serve_config, not while parsing, so
  // `bonsai serve` can report a bad name with the same exit code as the flag.
  std::string q2_layout;
  // KV cache types of every model's replicas (llama.cpp's names f16 | f32 |
  // q8_0; keys cache-type-k / cache-type-v, `serve -ctk / -ctv`). Checked by
  // validate_serve_config (model::parse_kv_type), as q2_layout.
  std::string cache_type_k = "f16";
  std::string cache_type_v = "f16";
  // no-repack = true: every model's weights stay zero-copy views of the file
  // (`serve --no-repack`; model::LoadOptions::repack, DESIGN.md "Weights").
  bool no_repack = false;

  bool operator==(const ServeConfig&) const = default;
};

// True for a host the server reaches only from this machine: "localhost",
// 127.0.0.0/8, "::1".
bool is_loopback_host(std::string_view host);
// True when `key` is empty or only whitespace (an API key that was given
// must not be: `--api-key "$UNSET_VAR"` would turn authentication off).
bool is_blank_key(std::string_view key);

// Longest model id (bytes): ids end up in /v1/models, /metrics labels and logs.
inline constexpr size_t kMaxModelIdBytes = 256;
// Why `id` is not a valid model id, or nullopt when it is. The one rule for
// -m ID=FILE, and POST /admin/models/load's "id": 1..kMaxModelIdBytes bytes,
// no whitespace, control character or backslash, not starting with '/', and
// no "." or ".." path segment ("org/name" is fine). The reason reads after
// "Invalid 'id': " (e.g. "longer than 256 bytes").
std::optional<std::string> model_id_error(std::string_view id);

// Parses "ID=FILE" or "FILE" (id = file name without directories and ".gguf";
// for a split part "NAME-00001-of-00003.gguf", NAME).
// An argument that names an existing file is a FILE even if it holds '='.
// Errors: kInvalidArgument for an empty path or an ID=FILE id that breaks
// model_id_error's rule (empty included).
core::Expected<ModelArg> parse_model_arg(std::string_view arg);

// What a setting's value is, on the command line and in TOML.
enum class SettingKind : uint8_t {
  kSwitch,  // a flag without a value (--no-repack); TOML true / false
  kInt,     // an integer in [min, max]
  kNumber,  // an integer or a decimal number in [min_number, max_number] (seconds, ms)
  kString,  // text; one of `choices` where the row has them
  kList,    // a repeatable flag (-m A -m B); TOML a string or an array of strings
};

// Where a setting applies.
enum class SettingScope : uint8_t {
  kServer,       // the server process (host, timeouts, ...)
  kModel,        // every model given with -m / in the config, and the default of admin loads of new files:
                 // an engine::ModelSpec field (model_spec_fields.h), which POST /admin/models/load may set per model
  kCommandLine,  // a flag only (--config: a config file cannot name another)
};

// A setting's value as a source read it (a flag's text converted by its
// kind, a TOML node); std::monostate: none of what the kind takes.
using SettingValue = std::variant<std::monostate, int64_t, double, bool, std::string, std::vector<std::string>>;

struct SettingInfo;
// Stores a value of the row's kind, already checked for its type, range and
// choices, into `config`, checking what else the setting needs (a blank API
// key, an -m argument). Errors: kInvalidArgument with the bare reason, which
// the caller frames with the flag or the file and key.
using SettingApply = core::Expected<void> (*)(const SettingInfo& info, const SettingValue& value, ServeConfig& config);

// One row of the settings table. Static storage (serve_settings()).
struct SettingInfo {
  std::string_view name;   // the long flag without "--", and the TOML key ("ctx-size")
  std::string_view alias;  // short flag ("-c"; "-np", "-ctk" as llama-server spells them), or empty
  SettingKind kind;
  SettingScope scope;
  std::string_view value_name;            // the value in --help and the README ("N", "SECONDS"); empty for a switch
  std::string_view default_text;          // what applies when the setting is not given, in words ("16", "off")
  std::string_view help;                  // what it does, plain text
  std::string_view example;               // a valid value other than the default, as flag text ("true" for a switch)
  int64_t min = 0, max = 0;               // kInt server settings: the range, both ends included
  double min_number = 0, max_number = 0;  // kNumber server settings: the range
  std::string_view choices;               // kString: "a|b", a closed set; empty: any text `apply` accepts
  // kServer / kCommandLine: stores the value; kModel rows use the one
  // ModelSpec parser (engine::set_model_field: its ranges and messages) and
  // leave this null.
  SettingApply apply = nullptr;
};

// Every setting of `bonsai serve`, in the order --help and the README list them.
std::span<const SettingInfo> serve_settings();

// The row whose name (with '-' or '_'), "--" + name or alias is `key`; nullptr for none.
const SettingInfo* find_serve_setting(std::string_view key);

// What flag `s` given with `texts` (its values in order; a switch: none, or
// "true" / "false") does to `config`: the text converted by the row's kind
// (a model row's by engine::parse_model_field_text), checked and stored, as
// the same value in TOML would be. Errors: kInvalidArgument with the bare
// reason ("expected an integer in [0, 65535]"), which the caller frames.
core::Expected<void> apply_serve_setting_text(const SettingInfo& s, std::span<const std::string> texts,
                                              ServeConfig& config);

// Registers one CLI11 option per row on `cmd` (`bonsai serve`): "--name"
// plus a one-letter alias (the longer ones, -np / -ctk / -ctv, are rewritten
// to their long names by main.cpp), the row's help with its default, and a
// check that runs the row's parser, so a bad value is a usage error
// "--name: <reason>". The options refer only to the static table.
void add_serve_flags(CLI::App& cmd);

// After `cmd` parsed a command line: applies every flag that was given over
// `config` (the flags win over the file); --config is the caller's. Errors:
// kInvalidArgument "--name: <reason>" (the checks make these rare).
core::Expected<void> apply_serve_flags(const CLI::App& cmd, ServeConfig& config);

// The README's table of settings (GitHub markdown, one row per setting,
// ending in a newline): flag, TOML key, default, scope, help. The README
// holds it between "<!-- serve-settings:begin -->" and
// "<!-- serve-settings:end -->"; `bonsai serve --help-markdown` prints it and
// scripts/settings_table.sh writes it there.
std::string serve_settings_markdown();

// Applies the keys of TOML text `text` (from file `name`, for messages) onto
// `config`: each key through its row of serve_settings(), as the flag's
// value would be. Unknown keys are errors listing the known ones (a typo
// should not be silently ignored), as are wrong types and ranges: messages
// "<name>: key '<key>': <reason>".
core::Expected<void> apply_serve_toml(std::string_view text, const std::string& name, ServeConfig& config);

// Reads `path` and applies it as above. Errors: kNotFound/kIo for the file.
core::Expected<void> load_serve_toml(const std::string& path, ServeConfig& config);

// The ModelSpec the config's model keys describe (pool-size, parallel,
// ctx-size, kv-budget-tokens, queue-factor, batch-size, step-budget-ms,
// no-cache-prompt, q2-layout, cache-type-k/v, no-repack), each checked by
// engine::set_model_field; path is left empty. Errors: kInvalidArgument
// "<config key>: <the parser's message>".
core::Expected<engine::ModelSpec> serve_model_spec(const ServeConfig& config);

// Checks ranges (port 0..65535 where 0 = any free port, sizes >= 0, preload
// ids that name a model, the model keys as serve_model_spec). Errors:
// kInvalidArgument naming the key.
core::Expected<void> validate_serve_config(const ServeConfig& config);

}  // namespace bonsai::server
