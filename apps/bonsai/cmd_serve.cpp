// `bonsai serve`: the OpenAI-compatible HTTP server over one or more models.
//
//   bonsai serve [-m [ID=]FILE ...] [--config FILE.toml] [SETTING ...]
//
// The settings are one table (server::serve_settings, src/server/config.h):
// the flags (server::add_serve_flags), `serve --help`, the config file's
// keys and the README's table (`serve --help-markdown`) all come from it.
// Flags follow llama.cpp's llama-server names where they exist (main.cpp
// rewrites -np / -ctk / -ctv to their long names). Flags given on the
// command line win over the --config file. With no model at all, the built-in default model
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
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/bonsai/cli_common.h"  // open_options_from_cli
#include "apps/bonsai/commands.h"
#include "apps/bonsai/hub_cli.h"       // resolve_hf_model: -hf
#include "apps/bonsai/llama_compat.h"  // llama-server's GPU flags, accepted and ignored
#include "apps/bonsai/synth.h"         // synth::ensure_default_model
#include "core/ggml_types.h"           // parse_q2_layout, q2_layout_name
#include "core/thread_pool.h"          // set_global_thread_count
#include "engine/engine_pool.h"        // default_cpu_pool_size
#include "engine/model_pool.h"         // ModelPool, gguf_model_loader
#include "engine/model_spec_fields.h"  // set_model_field: the config's q2-layout name
#include "gguf/gguf.h"                 // parse_split_name: a models directory's split parts
#include "model/model.h"               // Model::file (the Q2_0 layout used), describe(RepackStats)
#include "server/config.h"             // ServeConfig, load_serve_toml
#include "server/server.h"             // Server
#include "server/shutdown.h"           // ShutdownSignals
#include "tokenizer/tokenizer.h"       // Tokenizer::load_warning

namespace bonsai::app {
namespace {

// The config file (--config), then every flag given on the command line
// over it (the flags win); `config_path` is --config's value. Returns 0, or
// kExitUsage after reporting a failure: the config file is part of the
// command line, so a file that cannot be read, a bad key or value in it is a
// usage error as a bad flag is (README: "Exit status").
int read_serve_config(const CLI::App& cmd, const std::string& config_path, server::ServeConfig& cfg) {
  if (!config_path.empty()) {
    if (auto r = server::load_serve_toml(config_path, cfg); !r) {
      std::cerr << "bonsai serve: " << r.error().message << "\n";
      return kExitUsage;
    }
  }
  if (auto r = server::apply_serve_flags(cmd, cfg); !r) {
    std::cerr << "bonsai serve: " << r.error().message << "\n";
    return kExitUsage;
  }
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

// Bytes of memory available for new allocations now (MemAvailable of
// /proc/meminfo, Linux's estimate without swapping); 0 when unknown.
uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
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
    if ((*m)->tokenizer && !(*m)->tokenizer->load_warning().empty())
      line += "\nbonsai serve: warning: '" + id + "': " + (*m)->tokenizer->load_warning();
    if ((*m)->model && (*m)->model->config().n_recurrent_layer() > 0 &&
        ((*m)->spec.spec.type != engine::SpecType::kNone || !(*m)->spec.model_draft.empty())) {
      line += "\nbonsai serve: warning: speculative decoding is off for '" + id + "' (" +
              (*m)->model->config().arch_name +
              "): its recurrent state cannot roll back a rejected proposal; --spec-type / -md ignored";
    }
    // The KV pool is reserved, not touched, at load: a budget larger than
    // the machine starts, then fails under load. Say so now.
    if (const uint64_t avail = available_memory_bytes(); avail > 0 && (*m)->mem_bytes > avail) {
      line += "\nbonsai serve: warning: '" + id + "' may use ~" + std::to_string((*m)->mem_bytes >> 20) +
              " MiB when its KV cache fills, more than the " + std::to_string(avail >> 20) +
              " MiB of memory available; lower -c, -np or --kv-budget-tokens";
    }
    preloaded.push_back({id, m->shared(), std::move(line)});
    m->release();
    pool.forget_recent_use(id);  // preloaded, not used: --models-max may evict it for the first request
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

// Replaces each -m (or config [models]) entry that names a directory by
// the models in it: every *.gguf file directly inside, by name, with the
// ids parse_model_arg derives (the file name without .gguf; a split
// model's parts as one model, named by its first part; "mmproj" files
// skipped). Returns 0, or kExitUsage after reporting a directory given an
// ID (ID=DIR) or holding no model.
int expand_model_dirs(server::ServeConfig& cfg) {
  namespace fs = std::filesystem;
  std::vector<server::ModelArg> out;
  for (const server::ModelArg& m : cfg.models) {
    std::error_code ec;
    if (!fs::is_directory(m.path, ec)) {
      out.push_back(m);
      continue;
    }
    const auto plain = server::parse_model_arg(m.path);  // the id -m DIR derives (ID=DIR gives another)
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(m.path, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file(ec) || e.path().extension() != ".gguf" || name.find("mmproj") != std::string::npos)
        continue;
      if (const auto split = gguf::parse_split_name(name); split && split->no != 1) continue;  // loaded via part 1
      files.push_back(e.path().string());
    }
    if (ec) {
      std::cerr << "bonsai serve: -m " << m.path << ": cannot list the directory: " << ec.message() << "\n";
      return kExitUsage;
    }
    if (!plain || plain->id != m.id) {
      std::cerr << "bonsai serve: -m " << m.id << "=" << m.path
                << ": a directory serves each of its models under its own file name; give -m " << m.path
                << " without an ID, or -m ID=FILE for one model\n";
      return kExitUsage;
    }
    if (files.empty()) {
      std::cerr << "bonsai serve: -m " << m.path << ": the directory holds no .gguf model\n";
      return kExitUsage;
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      auto arg = server::parse_model_arg(f);
      if (!arg) {
        std::cerr << "bonsai serve: " << arg.error().message << "\n";
        return kExitUsage;
      }
      out.push_back(*arg);
    }
  }
  cfg.models = std::move(out);
  return 0;
}

// The server's options from `cfg` (warning about an unauthenticated
// network-facing host); `base` is the spec of admin loads of new files.
server::ServerOptions server_options(const server::ServeConfig& cfg, const engine::ModelSpec& base) {
  server::ServerOptions so;
  // "[::1]", as an IPv6 host is written in a URL (and curl's --resolve), is the address ::1.
  so.host = cfg.host;
  if (so.host.size() > 2 && so.host.front() == '[' && so.host.back() == ']')
    so.host = so.host.substr(1, so.host.size() - 2);
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
  so.strict_model_names = cfg.strict_model_names;
  return so;
}

int serve_main(const CLI::App& cmd) {
  server::ServeConfig cfg;
  const CLI::Option* config_opt = cmd.get_option("--config");
  const std::string config_path = config_opt->count() > 0 ? config_opt->as<std::string>() : std::string();
  if (const int rc = read_serve_config(cmd, config_path, cfg); rc != 0) return rc;
  // --q2-layout / --no-repack as given on the command line (the config's
  // q2-layout is applied below, after the env var; its no-repack through
  // the model spec).
  const bool q2_flag = cmd.get_option("--q2-layout")->count() > 0;
  const bool no_repack_flag = cmd.get_option("--no-repack")->count() > 0 && cfg.no_repack;
  // Q2_0 layout: the flag or env (shared with the other commands), else the
  // config file's; a bad name anywhere is exit 2, as in validate and logits.
  // The CLI's runtime initialisation (BONSAI_KERNEL too); -t is applied below.
  const auto rt = init_runtime_or_report("serve", RuntimeFlags{.size_global_pool = false,
                                                               .q2_layout = q2_flag ? cfg.q2_layout : std::string(),
                                                               .no_repack = no_repack_flag});
  if (!rt) return kExitUsage;
  std::optional<core::Q2Layout> q2_layout = rt->open_options.file.q2_layout;
  if (!cfg.q2_layout.empty()) {
    engine::ModelSpec from_config;
    if (auto r = engine::set_model_field(from_config, "q2_layout", cfg.q2_layout); !r) {
      std::cerr << "bonsai serve: " << config_path << ": key 'q2-layout': " << r.error().message << "\n";
      return 2;
    }
    if (!q2_layout) q2_layout = from_config.q2_layout;
  }

  if (!cfg.hf_file.empty() && cfg.hf_repos.size() != 1) {
    std::cerr << "bonsai serve: -hff (hf-file) names the file of one -hf repository; " << cfg.hf_repos.size()
              << " given\n";
    return kExitUsage;
  }
  // SIGINT/SIGTERM are blocked from here on, before the first thread starts
  // (writing the built-in model starts the compute pool): a thread started
  // with them unblocked would take a later SIGTERM's default action, killing
  // the server instead of draining it (status 143 on a first start under
  // systemd). Until serving starts, one stops the preparation at once: a
  // download keeps its .incomplete file for the next start to resume.
  server::ShutdownSignals::block();
  // -t before anything computes (writing the built-in model uses the pool).
  if (cfg.threads > 0 && !core::set_global_thread_count(cfg.threads))
    std::cerr << "bonsai serve: warning: -t ignored (the thread pool already started)\n";
  std::optional<server::ShutdownSignals> preparing(std::in_place, [](int sig) {
    std::fprintf(stderr, "bonsai serve: %s before serving started, exiting\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    std::_Exit(128 + sig);
  });
  // -hf / hf-repo: each model from the Hugging Face cache, downloaded first if needed.
  for (const std::string& item : cfg.hf_repos) {
    std::string id, repo = item;
    if (const size_t eq = item.find('='); eq != std::string::npos) {
      id = item.substr(0, eq);
      repo = item.substr(eq + 1);
    }
    auto path = resolve_hf_model("serve", repo, cfg.hf_file);
    if (!path) return 1;
    auto arg = server::parse_model_arg(id.empty() ? *path : id + "=" + *path);
    if (!arg) {
      std::cerr << "bonsai serve: -hf '" << item << "': " << arg.error().message << "\n";
      return kExitUsage;
    }
    cfg.models.push_back(*arg);
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
  if (const int rc = expand_model_dirs(cfg); rc != 0) return rc;
  if (auto v = server::validate_serve_config(cfg); !v) {  // ranges of flags and config keys: usage errors
    std::cerr << "bonsai serve: " << v.error().message << "\n";
    return kExitUsage;
  }
  if (!cfg.alias.empty()) cfg.models.front().id = cfg.alias;  // --alias: the one model's name (checked above)
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

  // Signals: SIGINT/SIGTERM blocked in every thread (blocked above, before
  // any thread started) and watched by server::ShutdownSignals below: the
  // first one stops the server gracefully, a second one exits at once.
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
  // The default model (requests without "model") takes no Ollama keep_alive
  // timer: clients that send keep_alive with every request must not leave
  // the server with its default model unloaded (ModelPool::pin).
  pool->pin(cfg.models.front().id);

  // The port is bound before the models load: a port in use (or a host that
  // is not this machine's) is reported at once, not after a load that can
  // take a minute (a 27B model). Connections made during the load wait in
  // the listen backlog and are served once it is done.
  const server::ServerOptions so = server_options(cfg, base);
  server::Server srv(pool, so);
  auto port = srv.bind();
  if (!port) {
    std::cerr << "bonsai serve: " << port.error().message << "\n";
    return 1;
  }
  if (!preload_models(*pool, cfg, capacity)) return 1;
  // From now on a model that just served a request is not evicted for
  // another model's request (no ping-pong over --models-max slots).
  pool->set_recent_use_grace(engine::kRecentUseGrace);
  // An IPv6 address in a URL is bracketed (RFC 3986): http://[::1]:8080.
  const std::string url_host = so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host;
  const std::string url = "http://" + url_host + ":" + std::to_string(*port);
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
  preparing.reset();  // the serving watcher takes over (a signal in between stays pending for it)
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
  // Every setting, from the one table (server/config.h): the flags, their
  // checks and their help.
  server::add_serve_flags(*cmd);
  // llama-server's GPU / batching flags that describe nothing bonsai can
  // change (-ngl, -fa, --cont-batching, --metrics, ...): not settings (no
  // TOML key, not in the README's table), so llama-server command lines run.
  auto llama = std::make_shared<IgnoredLlamaFlags>();
  add_ignored_llama_flags(cmd, *llama, LlamaCommand::kServe);
  cmd->footer(
      "Every option in the Options group but --config is also a key of the --config TOML file (its long name; "
      "'_' may replace '-'); see the README's settings table. The logging and llama.cpp compatibility flags are "
      "command-line only.");
  // The README's settings table (scripts/settings_table.sh writes it there).
  const std::string markdown_help = "Print the settings as the README's markdown table";
  CLI::Option* markdown = cmd->add_flag("--help-markdown", markdown_help);
  markdown->group("");  // hidden
  cmd->callback([cmd, markdown, llama] {
    if (markdown->count() > 0) {
      std::fputs(server::serve_settings_markdown().c_str(), stdout);
      return set_exit_code(0);
    }
    if (!report_ignored_llama_flags("serve", *cmd)) return set_exit_code(kExitUsage);
    set_exit_code(serve_main(*cmd));
  });
}

}  // namespace bonsai::app
