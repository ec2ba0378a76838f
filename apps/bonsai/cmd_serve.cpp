// `bonsai serve`: the OpenAI-compatible HTTP server over one or more models.
//
//   bonsai serve [-m [ID=]FILE ...] [--pool-size N] [-np N] [--models-max K]
//                [--mem-budget MB] [-c CTX] [-t THREADS] [--host 127.0.0.1]
//                [--port 8080] [--api-key KEY] [--config FILE.toml]
//                [--q2-layout g64|g128-d-first|g128-qs-first] [--no-repack]
//                [-s SEED] [-b BATCH] [--step-budget-ms MS] [--no-cache-prompt]
//                [--reasoning-format deepseek|none] [--cors-origin ORIGINS]
//
// Flags follow llama.cpp's llama-server names where they exist. A TOML file
// (--config) may hold the same keys (see src/server/config.h); flags given
// on the command line win. With no model at all, the built-in default model
// is served. SIGINT/SIGTERM drain (running requests finish within
// --drain-timeout, new and queued ones get 503) and exit 0; a second one
// exits at once (status 130/143).
//
// The type-42 (Q2_0) layout of the models given with -m or in the config is
// --q2-layout, else env BONSAI_Q2_LAYOUT, else the config's q2-layout, else
// detected per file (as run/info/validate/logits). Models loaded later with
// POST /admin/models/load and a new path are detected unless the body gives
// "q2_layout". An unknown layout name exits with code 2.
// Weights are repacked at load where the kernels compute them faster in
// another layout (model::RepackStats, printed in the "loaded" line);
// --no-repack, env BONSAI_NO_REPACK=1 or the config's no-repack = true keep
// them zero-copy views (an admin load may say "repack": false).
#include <malloc.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/bonsai/cli_common.h"  // open_options_from_cli
#include "apps/bonsai/commands.h"
#include "apps/bonsai/synth.h"         // synth::ensure_default_model
#include "core/ggml_types.h"           // parse_q2_layout, q2_layout_name
#include "core/thread_pool.h"          // set_global_thread_count
#include "engine/engine_pool.h"        // default_cpu_pool_size
#include "engine/model_pool.h"         // ModelPool, gguf_model_loader
#include "engine/model_spec_fields.h"  // set_model_field: the model flags
#include "model/model.h"               // Model::file (the Q2_0 layout used), describe(RepackStats)
#include "server/config.h"             // ServeConfig, load_serve_toml
#include "server/server.h"             // Server
#include "server/shutdown.h"           // ShutdownSignals

namespace bonsai::app {
namespace {

struct ServeFlags {
  std::vector<std::string> models;
  int pool_size = 0;
  int parallel = 0;  // -np/--parallel: live sequences per model (0: the config's, else 16)
  int models_max = 0;
  uint64_t mem_budget = 0;
  int ctx = 0;
  int64_t kv_budget_tokens = 0;  // --kv-budget-tokens: KV positions per model (0: pool-size x ctx-size)
  int threads = 0;
  std::string host;
  int port = 0;
  std::string api_key;
  bool admin_open = false;  // --admin-open: /admin without a key on a non-loopback host
  std::string config;
  std::string cache_type_k, cache_type_v;  // -ctk / -ctv (empty: the config's, else f16)
  double timeout = 0;
  std::string q2_layout;                      // --q2-layout, else env BONSAI_Q2_LAYOUT, else the config's q2-layout
  bool no_repack = false;                     // --no-repack, or the config's no-repack
  uint64_t seed = 0;                          // -s/--seed: default seed of requests without one (given: reproducible)
  int batch_size = 0;                         // -b/--batch-size: tokens per scheduler step (0: 512)
  double step_budget_ms = 0;                  // --step-budget-ms: prompt chunks sized in time (0: 2x decode step)
  bool no_cache_prompt = false;               // --no-cache-prompt: no prompt-prefix reuse across requests
  std::string reasoning_format = "deepseek";  // --reasoning-format: deepseek (reasoning_content) | none
  int max_connections = 1024;                 // --max-connections: open connections served; more get 503 and are closed
  // --header-timeout / --body-timeout / --keep-alive-timeout / --write-timeout (s; 0: the transport's default)
  double header_timeout = 0, body_timeout = 0, idle_timeout = 0, write_timeout = 0;
  std::string cors_origin;    // --cors-origin: "*" or a comma-separated list (empty: off)
  uint64_t max_body = 0;      // --max-body: request body bytes at most (config max-body; default 4 MiB)
  int queue_factor = 0;       // --queue-factor: requests waiting per sequence slot before 503 (default 4)
  double drain_timeout = 30;  // --drain-timeout: seconds running requests get after SIGTERM (config drain-timeout)
};

// The config file (--config), then every flag given on the command line
// over it (the flags win). Returns 0, or the exit code of a failure after
// reporting it (1: the file or a bad -m; kExitUsage: a blank --api-key).
int read_serve_config(CLI::App* cmd, const ServeFlags& f, server::ServeConfig& cfg) {
  if (!f.config.empty()) {
    if (auto r = server::load_serve_toml(f.config, cfg); !r) {
      std::cerr << "bonsai serve: " << r.error().message << "\n";
      return 1;
    }
  }
  auto given = [&](const char* name) { return cmd->get_option(name)->count() > 0; };
  if (given("--model")) {
    cfg.models.clear();
    for (const auto& m : f.models) {
      auto arg = server::parse_model_arg(m);
      if (!arg) {
        std::cerr << "bonsai serve: " << arg.error().message << "\n";
        return 1;
      }
      cfg.models.push_back(*arg);
    }
  }
  if (given("--pool-size")) cfg.pool_size = f.pool_size;
  if (given("--parallel")) cfg.parallel = f.parallel;
  if (given("--models-max")) cfg.models_max = f.models_max;
  if (given("--mem-budget")) cfg.mem_budget_mb = f.mem_budget;
  if (given("--ctx-size")) cfg.ctx_size = f.ctx;
  if (given("--kv-budget-tokens")) cfg.kv_budget_tokens = f.kv_budget_tokens;
  if (given("--threads")) cfg.threads = f.threads;
  if (given("--host")) cfg.host = f.host;
  if (given("--port")) cfg.port = f.port;
  if (given("--api-key")) {
    if (server::is_blank_key(f.api_key)) {
      std::cerr << "bonsai serve: --api-key is blank (an unset variable?); give a key, or leave the flag out to "
                   "serve without authentication\n";
      return kExitUsage;
    }
    cfg.api_key = f.api_key;
  }
  if (given("--admin-open")) cfg.admin_open = f.admin_open;
  if (given("--timeout")) cfg.timeout_s = f.timeout;
  if (given("--cache-type-k")) cfg.cache_type_k = f.cache_type_k;
  if (given("--cache-type-v")) cfg.cache_type_v = f.cache_type_v;
  if (given("--cors-origin")) cfg.cors_origin = f.cors_origin;
  if (given("--batch-size")) cfg.batch_size = f.batch_size;
  if (given("--seed")) {
    cfg.seed = f.seed;
    cfg.seed_set = true;
  }
  if (given("--reasoning-format")) cfg.reasoning_format = f.reasoning_format;
  if (given("--no-cache-prompt")) cfg.no_cache_prompt = f.no_cache_prompt;
  if (given("--max-connections")) cfg.max_connections = f.max_connections;
  if (given("--header-timeout")) cfg.header_timeout_s = f.header_timeout;
  if (given("--body-timeout")) cfg.body_timeout_s = f.body_timeout;
  if (given("--keep-alive-timeout")) cfg.keep_alive_timeout_s = f.idle_timeout;
  if (given("--write-timeout")) cfg.write_timeout_s = f.write_timeout;
  if (given("--max-body")) cfg.max_body_bytes = f.max_body;
  if (given("--queue-factor")) cfg.queue_factor = f.queue_factor;
  if (given("--step-budget-ms")) cfg.step_budget_ms = f.step_budget_ms;
  if (given("--drain-timeout")) cfg.drain_timeout_s = f.drain_timeout;
  return 0;
}

// The ModelSpec of every model named on the command line or in the config
// (and the server's default for admin loads of new files): `cfg`'s model
// keys (server::serve_model_spec, validated before) without the Q2_0 layout
// (admin loads of new files detect theirs), and `repack` (false:
// --no-repack / BONSAI_NO_REPACK=1; the config's no-repack also turns it off).
engine::ModelSpec base_model_spec(const server::ServeConfig& cfg, bool repack) {
  engine::ModelSpec base = server::serve_model_spec(cfg).value_or(engine::ModelSpec{});
  base.q2_layout.reset();
  base.repack = repack && base.repack;
  return base;
}

// A CLI11 check of a ModelSpec flag's value by the one parser
// (engine::set_model_field): CLI11 reports "--FLAG: <message>" as a usage error.
auto model_field_check(std::string_view name) {
  return [name](const std::string& text) {
    engine::ModelSpec scratch;
    const auto r = engine::set_model_field_text(scratch, name, text);
    return r ? std::string() : r.error().message;
  };
}

// Loads the models to preload (the config's [router] preload, else the first
// `capacity` models) and reports each one still resident. False after
// reporting a model that failed to load.
bool preload_models(engine::ModelPool& pool, const server::ServeConfig& cfg, size_t capacity) {
  std::vector<std::string> preload = cfg.preload;
  if (!cfg.preload_set)
    for (size_t i = 0; i < cfg.models.size() && i < capacity; ++i) preload.push_back(cfg.models[i].id);
  // Preloads; "loaded" is reported only once all are done, and only for the
  // models still resident then: with a memory budget (or --models-max) a
  // later preload can evict an earlier one, which then loads on first use.
  // (Only weak references are kept, so an evicted model's memory is freed
  // before the next one loads.)
  struct Preloaded {
    std::string id;
    std::weak_ptr<engine::LoadedModel> model;
    std::string line;  // the "loaded" line to print if it is still resident
  };
  std::vector<Preloaded> preloaded;
  for (const auto& id : preload) {
    auto m = pool.acquire(id);
    if (!m) {
      std::cerr << "bonsai serve: cannot load model '" << id << "': " << m.error().message << "\n";
      return false;
    }
    std::string line = "bonsai serve: loaded '" + id + "' from " + (*m)->spec.path + ": " +
                       std::to_string((*m)->scheduler ? (*m)->scheduler->options().max_sequences : 0) +
                       " parallel sequences, context " + std::to_string((*m)->n_ctx) + ", ~" +
                       std::to_string((*m)->mem_bytes >> 20) + " MiB";
    if (const auto layout = (*m)->model ? (*m)->model->file().q2_layout() : std::nullopt)
      line += ", Q2_0 layout " + std::string(core::q2_layout_name(*layout)) +
              ((*m)->spec.q2_layout ? " (forced)" : " (detected)");
    if ((*m)->model) line += "; " + model::describe((*m)->model->repack_stats());
    preloaded.push_back({id, m->shared(), std::move(line)});
    m->release();
  }
  for (const auto& p : preloaded) {
    const auto resident = pool.peek(p.id);
    if (resident != nullptr && resident == p.model.lock()) {
      std::cerr << p.line << "\n";
    } else {
      std::cerr << "bonsai serve: '" << p.id
                << "' was evicted at start-up to make room for a later model (--mem-budget " << cfg.mem_budget_mb
                << " MiB, --models-max " << capacity << "); it loads on first use\n";
    }
  }
  return true;
}

// The server's options from `cfg` (warning about an unauthenticated
// network-facing host); `base` is the spec of admin loads of new files.
server::ServerOptions server_options(const server::ServeConfig& cfg, const engine::ModelSpec& base) {
  server::ServerOptions so;
  so.host = cfg.host;
  so.port = cfg.port;
  so.api_key = cfg.api_key;
  so.admin_open = cfg.admin_open;
  if (cfg.api_key.empty() && !server::is_loopback_host(cfg.host)) {
    std::cerr << "bonsai serve: warning: listening on " << cfg.host
              << " with no --api-key: anyone who reaches it can use the API"
              << (cfg.admin_open ? " and the admin routes (--admin-open)"
                                 : "; the admin routes answer 403 (--api-key, or --admin-open)")
              << "\n";
  }
  so.max_body_bytes = cfg.max_body_bytes;
  so.timeout_s = cfg.timeout_s;
  so.default_model = cfg.models.front().id;
  so.default_spec = base;
  if (cfg.seed_set) so.default_seed = cfg.seed;
  so.parse_reasoning = cfg.reasoning_format == "deepseek";
  so.max_connections = cfg.max_connections;
  so.header_timeout_s = cfg.header_timeout_s;
  so.body_timeout_s = cfg.body_timeout_s;
  so.idle_timeout_s = cfg.keep_alive_timeout_s;
  so.write_timeout_s = cfg.write_timeout_s;
  so.cors_origin = cfg.cors_origin;
  return so;
}

int serve_main(CLI::App* cmd, const ServeFlags& f) {
  server::ServeConfig cfg;
  if (const int rc = read_serve_config(cmd, f, cfg); rc != 0) return rc;
  // Q2_0 layout: the flag or env (shared with the other commands), else the
  // config file's; a bad name anywhere is exit 2, as in validate and logits.
  // The CLI's runtime initialisation (BONSAI_KERNEL too); -t is applied below.
  const auto rt = init_runtime_or_report(
      "serve", RuntimeFlags{.size_global_pool = false, .q2_layout = f.q2_layout, .no_repack = f.no_repack});
  if (!rt) return kExitUsage;
  std::optional<core::Q2Layout> q2_layout = rt->open_options.file.q2_layout;
  if (!cfg.q2_layout.empty()) {
    engine::ModelSpec from_config;
    if (auto r = engine::set_model_field(from_config, "q2_layout", cfg.q2_layout); !r) {
      std::cerr << "bonsai serve: " << f.config << ": key 'q2-layout': " << r.error().message << "\n";
      return 2;
    }
    if (!q2_layout) q2_layout = from_config.q2_layout;
  }

  if (cfg.models.empty()) {
    auto p = synth::ensure_default_model();
    if (!p) {
      std::cerr << "bonsai serve: cannot prepare the built-in default model: " << p.error().message << "\n";
      return 1;
    }
    auto arg = server::parse_model_arg(*p);
    if (!arg) {
      std::cerr << "bonsai serve: " << arg.error().message << "\n";
      return 1;
    }
    cfg.models.push_back(*arg);
    std::cerr << "bonsai serve: no -m given; serving the built-in default model " << *p
              << " (a tiny synthetic model: its text is not meaningful)\n";
  }
  if (auto v = server::validate_serve_config(cfg); !v) {
    std::cerr << "bonsai serve: " << v.error().message << "\n";
    return 1;
  }
  // glibc gives each thread that allocates its own malloc arena (up to 8 x
  // cores). The transport's worker threads (request bodies, JSON, SSE
  // chunks), each model's step loop and the loaders all allocate short-lived
  // buffers, so RSS creeps up with fragmentation across many arenas under
  // concurrency; a few arenas keep it flat at the same throughput.
  // MALLOC_ARENA_MAX in the environment still wins.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) {
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    mallopt(M_ARENA_MAX, std::clamp(hw, 2, 8));
  }
  if (cfg.threads > 0 && !core::set_global_thread_count(cfg.threads))
    std::cerr << "bonsai serve: warning: -t ignored (the thread pool already started)\n";

  // Signals: SIGINT/SIGTERM blocked in every thread (threads started from
  // here inherit the mask) and watched by server::ShutdownSignals below: the
  // first one stops the server gracefully, a second one exits at once.
  server::ShutdownSignals::block();
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the process
  const size_t capacity =
      cfg.models_max > 0 ? static_cast<size_t>(cfg.models_max) : std::max<size_t>(1, cfg.models.size());
  auto pool = std::make_shared<engine::ModelPool>(capacity, cfg.mem_budget_mb, engine::gguf_model_loader(),
                                                  engine::gguf_model_estimator());
  const engine::ModelSpec base = base_model_spec(cfg, rt->open_options.repack);
  for (const auto& m : cfg.models) {
    engine::ModelSpec spec = base;
    spec.path = m.path;
    spec.q2_layout = q2_layout;  // these models only: admin loads of new files detect theirs
    pool->loader_register(m.id, spec);
  }
  if (!preload_models(*pool, cfg, capacity)) return 1;
  // From now on a model that just served a request is not evicted for
  // another model's request (no ping-pong over --models-max slots).
  pool->set_recent_use_grace(engine::kRecentUseGrace);

  const server::ServerOptions so = server_options(cfg, base);
  server::Server srv(pool, so);
  auto port = srv.bind();
  if (!port) {
    std::cerr << "bonsai serve: " << port.error().message << "\n";
    return 1;
  }
  const std::string url = "http://" + cfg.host + ":" + std::to_string(*port);
  std::printf("bonsai serve: listening on %s (OpenAI API at %s/v1; models:", url.c_str(), url.c_str());
  for (const auto& m : cfg.models) std::printf(" %s", m.id.c_str());
  std::printf(")\n");
  std::printf(
      "try: curl %s/v1/chat/completions -H 'Content-Type: application/json'%s -d '{\"model\": \"%s\", "
      "\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'\n",
      url.c_str(), cfg.api_key.empty() ? "" : " -H \"Authorization: Bearer $KEY\"", cfg.models.front().id.c_str());
  std::fflush(stdout);

  // (Alive until after wait_background(), so a second signal still forces
  // the exit while background loads finish.)
  // The first signal drains (Server::drain: running requests finish within
  // --drain-timeout, new and queued ones get 503), then stops; exit 0.
  const double drain_s = cfg.drain_timeout_s;
  server::ShutdownSignals signals([&](int) { srv.drain(drain_s); }, {},
                                  [drain_s](int sig) {
                                    std::cerr << "bonsai serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                                              << ", draining: running requests get up to " << drain_s
                                              << " s (--drain-timeout), then shutting down (again to exit at once)\n";
                                  });
  srv.run();
  pool->wait_background();
  std::cerr << "bonsai serve: stopped\n";
  return 0;
}

}  // namespace

void register_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API (chat/completions, SSE streaming)");
  auto f = std::make_shared<ServeFlags>();
  cmd->add_option("-m,--model", f->models, "Model as [ID=]FILE (repeatable; default: the built-in model)");
  cmd->add_option("--pool-size", f->pool_size,
                  "Engine replicas per model; sizes the default KV budget (pool-size x ctx-size) "
                  "(default: cores, at most 4)")
      ->check(model_field_check("pool_size"));
  cmd->add_option("--parallel", f->parallel,
                  "Sequences per model generating at once, batched in one step loop, whatever --pool-size "
                  "is (default 16; also -np)")
      ->check(model_field_check("parallel"));
  cmd->add_option("--models-max", f->models_max, "Models resident at once (LRU; default: the number of -m)");
  cmd->add_option("--mem-budget", f->mem_budget, "Memory budget for resident models in MiB (0: unlimited)");
  cmd->add_option("-c,--ctx-size", f->ctx, "Context size per replica in tokens (0: the model's, at most 4096)")
      ->check(model_field_check("ctx_size"));
  cmd->add_option("-t,--threads", f->threads, "Compute threads shared by all replicas (default: physical cores)");
  cmd->add_option("--host", f->host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", f->port, "Port to listen on (default 8080; 0: any free port)");
  cmd->add_option("--api-key", f->api_key, "Require 'Authorization: Bearer KEY' on /v1 and /admin (never blank)");
  cmd->add_flag("--admin-open", f->admin_open,
                "Serve /admin without an API key on a non-loopback --host (otherwise 403 there)");
  cmd->add_option("--config", f->config, "TOML file with the same keys and [router] preload = [...]");
  cmd->add_option("--timeout", f->timeout, "Per-request timeout in seconds (default 600)");
  cmd->add_option("--cache-type-k", f->cache_type_k, "KV cache type for K: f16 (default), f32, q8_0 (also -ctk)")
      ->check(model_field_check("cache_type_k"));
  cmd->add_option("--cache-type-v", f->cache_type_v, "KV cache type for V: f16 (default), f32, q8_0 (also -ctv)")
      ->check(model_field_check("cache_type_v"));
  cmd->add_option("--max-connections", f->max_connections,
                  "Open connections served at once; past it a new connection gets 503 and is closed (default 1024)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--header-timeout", f->header_timeout,
                  "Seconds a client has to send a request's whole header; then the connection is closed (default 10)")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_option("--body-timeout", f->body_timeout,
                  "Seconds a client has to send a request's whole body once its header is in (default 30)")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_option("--keep-alive-timeout", f->idle_timeout,
                  "Seconds an idle keep-alive connection waits for its next request (default 5)")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_option("--write-timeout", f->write_timeout,
                  "Seconds one write to a client may make no progress before the connection is closed (default 60)")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_option("--q2-layout", f->q2_layout,
                  "Force the type-42 layout of the -m models: g64, g128-d-first, g128-qs-first "
                  "(env BONSAI_Q2_LAYOUT; default: detected)");
  cmd->add_flag("--no-repack", f->no_repack, kNoRepackHelp);
  cmd->add_option("-s,--seed", f->seed, "Seed of requests that give none (default: a fresh random seed per request)");
  cmd->add_option("--kv-budget-tokens", f->kv_budget_tokens,
                  "KV cache budget per model in tokens, shared by all its sequences in blocks as they grow "
                  "(default: pool-size x ctx-size; at least ctx-size)")
      ->check(model_field_check("kv_budget_tokens"));
  cmd->add_option("-b,--batch-size", f->batch_size,
                  "Most tokens per scheduler step: running streams' tokens plus prompt chunks (default 512)")
      ->check(model_field_check("batch_size"));
  cmd->add_option("--step-budget-ms", f->step_budget_ms,
                  "Target duration of a scheduler step with running streams, in ms: long prompts advance in "
                  "chunks sized to it from measured step costs (default 0: twice the decode step, so streams "
                  "keep their pace)")
      ->check(model_field_check("step_budget_ms"));
  cmd->add_flag("--no-cache-prompt", f->no_cache_prompt,
                "Do not reuse cached prompt prefixes across requests (the prompt cache is on by default)");
  cmd->add_option("--reasoning-format", f->reasoning_format,
                  "Chat answers' <think>...</think>: 'deepseek' returns it as reasoning_content (default), "
                  "'none' leaves it in content (llama-server's flag)")
      ->check(CLI::IsMember({"deepseek", "none"}));
  cmd->add_option("--max-body", f->max_body, "Largest request body in bytes; larger ones get 413 (default 4194304)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  cmd->add_option("--queue-factor", f->queue_factor,
                  "Requests that may wait per sequence slot (--parallel) before new ones get 503 + Retry-After "
                  "(default 4)")
      ->check(model_field_check("queue_factor"));
  cmd->add_option("--drain-timeout", f->drain_timeout,
                  "Seconds the first SIGTERM/SIGINT lets running requests finish (new and queued ones get 503 "
                  "draining; /health 503) before the rest are cancelled and the server exits 0; 0: at once "
                  "(default 30)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--cors-origin", f->cors_origin,
                  "Allow browsers on these origins to call the API (CORS): '*' or a comma-separated list "
                  "(default: off)");
  cmd->callback([cmd, f] { set_exit_code(serve_main(cmd, *f)); });
}

}  // namespace bonsai::app
