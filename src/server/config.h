// `bonsai serve` configuration: the command-line flags and the same keys in
// a TOML file (--config FILE.toml, parsed with toml++). Flags given on the
// command line override the file.
//
// TOML keys (the long flag names; '_' may replace '-'):
//   model = ["stories=/path/stories260K.gguf", "/path/other.gguf"]   # -m, repeatable
//   pool-size = 2        models-max = 2        mem-budget = 0   # MiB, 0 = unlimited
//   ctx-size = 2048      threads = 4           host = "127.0.0.1"   port = 8080
//   api-key = "..."      timeout = 600         # seconds per request (api-key: never blank)
//   admin-open = false   # /admin without a key on a non-loopback host (--admin-open)
//   parallel = 16        # live sequences per model (-np), independent of pool-size
//   step-budget-ms = 0   # step-time budget for prompt chunks (0: twice the decode step)
//   batch-size = 512     seed = 42             reasoning-format = "deepseek"   no-cache-prompt = false
//   max-connections = 1024   header-timeout = 10   body-timeout = 30   keep-alive-timeout = 5   write-timeout = 60
//   drain-timeout = 30   # seconds running requests get to finish after SIGTERM
//   max-body = 4194304   # bytes               queue-factor = 4     # waiting per sequence slot
//   q2-layout = "g128-d-first"   # force the type-42 layout of every model (--q2-layout)
//   cors-origin = "*"    # CORS: "*" or "https://a.example,https://b.example" (--cors-origin; default off)
//   [models]             # another way to name models: id = "path"
//   tiny = "/path/qwen3-tiny-q1_0.gguf"
//   [router]
//   preload = ["stories"]   # loaded at start; the others load on first use
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "engine/model_spec_fields.h"  // ModelSpec, kMaxModelParallel

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
};

struct ServeConfig {
  std::vector<ModelArg> models;
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
  std::string cors_origin;           // cors-origin: ServerOptions::cors_origin (empty: CORS off)
  double timeout_s = 600;            // per request (waiting + generating)
  size_t max_body_bytes = 4u << 20;  // larger bodies get 413
  int queue_factor = 4;              // requests waiting per sequence slot (parallel) before 503
  // step-budget-ms: SchedulerOptions::step_budget_ms (0: twice the decode step).
  double step_budget_ms = 0;
  // The same keys as the flags of the same names (`serve --help`):
  int batch_size = 0;                         // batch-size (-b): tokens per step; 0: 512
  bool seed_set = false;                      // seed (-s) given
  uint64_t seed = 0;                          // seed of requests that give none
  std::string reasoning_format = "deepseek";  // reasoning-format: deepseek | none
  bool no_cache_prompt = false;               // no-cache-prompt
  int max_connections = 1024;                 // max-connections: 1..2^20
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
};

// True for a host the server reaches only from this machine: "localhost",
// 127.0.0.0/8, "::1".
bool is_loopback_host(std::string_view host);
// True when `key` is empty or only whitespace (an API key that was given
// must not be: `--api-key "$UNSET_VAR"` would turn authentication off).
bool is_blank_key(std::string_view key);

// Parses "ID=FILE" or "FILE" (id = file name without directories and ".gguf").
// An argument that names an existing file is a FILE even if it holds '='.
// Errors: kInvalidArgument for an empty id or path.
core::Expected<ModelArg> parse_model_arg(std::string_view arg);

// Applies the keys of TOML text `text` (from file `name`, for messages) onto
// `config`. Unknown keys are errors (a typo should not be silently ignored),
// as are wrong types; messages name the file and the key.
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
