// `bonsai run` (one prompt, streamed to stdout) and `bonsai chat`
// (interactive multi-turn chat in the terminal). Flags follow llama.cpp's
// llama-cli names (-m, -p, -n, --temp, --top-k, --top-p, --min-p,
// --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty,
// --seed, -c, -t, and run's -f/--file prompt file).
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apps/bonsai/cli_common.h"
#include "apps/bonsai/commands.h"
#include "apps/bonsai/hub_cli.h"       // -hf / -hff
#include "apps/bonsai/llama_compat.h"  // llama.cpp's GPU flags, accepted and ignored
#include "apps/bonsai/synth.h"         // synth::ensure_default_model
#include "core/error.h"                // core::Expected
#include "core/ggml_types.h"           // parse_q2_layout
#include "core/thread_pool.h"          // set_global_thread_count
#include "engine/chat_output.h"        // ChatOutputParser (reasoning shown apart)
#include "engine/completion.h"         // prepare_completion
#include "engine/engine_pool.h"        // check_ctx_supported
#include "engine/inference_engine.h"   // InferenceEngine
#include "engine/model_pool.h"         // ModelSpec, chat_template_options
#include "engine/proposer.h"           // draft_model_proposer, check_draft_tokenizer
#include "model/kv_cache.h"            // parse_kv_type (-ctk / -ctv)
#include "model/model.h"               // Model::load
#include "tokenizer/tokenizer.h"       // Tokenizer, ChatTemplate

namespace bonsai::app {
namespace {

// Set by SIGINT while a generation runs; the engine checks it before each
// decode step, so Ctrl-C ends the answer (run: prints timings; chat: back to
// the prompt) instead of killing the process.
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

// Installs on_sigint for its lifetime, then restores the previous handler.
class SigintCancels {
 public:
  SigintCancels() {
    g_interrupted.store(false);
    previous_ = std::signal(SIGINT, on_sigint);
  }
  ~SigintCancels() { std::signal(SIGINT, previous_); }
  SigintCancels(const SigintCancels&) = delete;
  SigintCancels& operator=(const SigintCancels&) = delete;

 private:
  void (*previous_)(int) = SIG_DFL;
};

// Writes `text` to stdout at once (the answer streams as it comes).
void write_out(std::string_view text) {
  if (text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// Generates `ids`, handing each released piece of text to `on_text` (none:
// nothing is shown); Ctrl-C cancels.
core::Expected<engine::GenerationResult> generate_streamed(engine::InferenceEngine& eng,
                                                           const std::vector<int32_t>& ids,
                                                           std::function<void(std::string_view)> on_text) {
  SigintCancels sigint;
  engine::GenerateRequest req;
  req.prompt = ids;
  req.cancel = &g_interrupted;
  if (on_text) {
    req.on_token = [&on_text](const engine::TokenEvent& ev) {
      if (!ev.text.empty()) on_text(ev.text);
      return true;
    };
  }
  return eng.generate_request(req);
}

// How a chat answer shows the model's reasoning (run --chat, chat): the
// flags, llama.cpp's --reasoning-format and colour names, Ollama's
// --hidethinking.
struct ReasoningOptions {
  std::string reasoning_format = "deepseek";  // deepseek: reasoning apart from the answer; none: raw text
  bool hide_thinking = false;                 // deepseek: the reasoning is not shown
  std::string color = "auto";                 // on | off | auto (a terminal without NO_COLOR)
};

void add_reasoning_flags(CLI::App* cmd, ReasoningOptions& o) {
  cmd->add_option("--reasoning-format", o.reasoning_format,
                  "deepseek: show the reasoning (<think>...</think>) apart from the answer; none: the raw text, "
                  "tags included")
      ->check(CLI::IsMember({"deepseek", "none"}))
      ->capture_default_str();
  cmd->add_flag("--hidethinking,--hide-thinking", o.hide_thinking,
                "Do not show the reasoning, only the answer (with --reasoning-format deepseek)");
  cmd->add_option("--color", o.color,
                  "Dim the reasoning: on, off, or auto (when stdout is a terminal and NO_COLOR is not set)")
      ->check(CLI::IsMember({"on", "off", "auto"}))
      ->capture_default_str();
}

// Whether `o.color` asks for ANSI colour on stdout: "on", or "auto" on a
// terminal (not TERM=dumb) without NO_COLOR (https://no-color.org).
bool use_color(const ReasoningOptions& o) {
  if (o.color != "auto") return o.color == "on";
  const char* no_color = std::getenv("NO_COLOR");
  const char* term = std::getenv("TERM");
  return ::isatty(STDOUT_FILENO) == 1 && (no_color == nullptr || *no_color == '\0') &&
         !(term != nullptr && std::string_view(term) == "dumb");
}

// Prints a chat answer as it streams, split by engine::ChatOutputParser as
// the server splits it: with --reasoning-format deepseek the reasoning is
// shown apart from the answer, dimmed (SGR 2) with colour, else between a
// "Thinking:" line and a "...done thinking." line, then a blank line and
// the answer; --hidethinking leaves it out. With none, the raw text (the
// "<think>\n" a Qwen3.5 prompt opened in front, as the server's none).
// Keeps the answer's content and reasoning for the conversation.
class AnswerPrinter {
 public:
  // `parse`: the parser's options for this answer (chat_output_options).
  AnswerPrinter(const ReasoningOptions& o, const engine::ChatOutputParser::Options& parse)
      : hide_(o.hide_thinking), color_(use_color(o)), parser_(parse) {}

  void feed(std::string_view text) { put(parser_.feed(text)); }
  // End of the generation: what the parser held back.
  void finish() {
    put(parser_.finish());
    if (in_reasoning_ && color_) write_out("\x1b[0m");
  }
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }

 private:
  void put(const engine::ChatOutputDelta& d) {
    if (!d.reasoning.empty()) {
      reasoning_ += d.reasoning;
      if (!hide_) {
        if (!in_reasoning_) write_out(color_ ? "\x1b[2m" : "Thinking:\n");
        in_reasoning_ = true;
        write_out(d.reasoning);
      }
    }
    if (!d.content.empty()) {
      content_ += d.content;
      if (in_reasoning_) write_out(color_ ? "\x1b[0m\n\n" : "\n...done thinking.\n\n");
      in_reasoning_ = false;
      write_out(d.content);
    }
  }

  bool hide_;
  bool color_;
  engine::ChatOutputParser parser_;
  bool in_reasoning_ = false;  // reasoning shown, the answer not begun
  std::string content_, reasoning_;
};

// Options shared by run and chat. The sampling flags write straight into
// the engine's SamplingParams (llama.cpp's flag names, OpenAI's field names:
// -n is max_tokens, --temp temperature); the CLI's -n default is 256.
struct GenOptions {
  std::string model_path;
  HfFlags hf;  // -hf / -hff: a Hugging Face model instead of -m
  engine::SamplingParams sampling{.max_tokens = 256};
  int64_t ctx = 0;
  int threads = 0;
  std::string q2_layout;             // --q2-layout, else env BONSAI_Q2_LAYOUT (as info/validate/logits)
  bool no_repack = false;            // --no-repack: weights stay zero-copy views
  std::string cache_type_k = "f16";  // -ctk: f16 | f32 | q8_0 (llama.cpp's names)
  std::string cache_type_v = "f16";  // -ctv
  // The chat template (engine::ModelSpec's fields of the same names, as serve).
  bool jinja = false;              // --jinja: the default, accepted for llama.cpp's command lines
  bool no_jinja = false;           // --no-jinja: the built-in renderer of the template's family
  std::string chat_template;       // --chat-template NAME|TEMPLATE
  std::string chat_template_file;  // --chat-template-file FILE
  std::string spec_type;         // --spec-type: none | ngram | draft (engine::SpecType); empty: none, or draft with -md
  std::string model_draft;       // --model-draft / -md: the draft model (GGUF) for --spec-type draft
  engine::SpecOptions spec;      // --draft-max / --draft-min / --draft-p-min (type from spec_type)
  IgnoredLlamaFlags llama;       // -ngl, -fa, ... (llama_compat.h)
  bool conversation = false;     // llama-cli's -cnv / --conversation
  bool no_conversation = false;  // llama-cli's -no-cnv / --no-conversation
};

void add_gen_flags(CLI::App* cmd, GenOptions& o) {
  cmd->add_option("-m,--model", o.model_path, "GGUF model file (default: the built-in tiny model)");
  add_hf_flags(cmd, o.hf);
  // llama-cli's -md (main.cpp passes it on as --model-draft).
  cmd->add_option("--model-draft", o.model_draft,
                  "Draft model for speculative decoding (also -md; implies --spec-type draft): a small GGUF model "
                  "with the target's tokenizer")
      ->type_name("FILE");  // a file that cannot be read: exit 1 when it loads, as -m
  engine::SamplingParams& p = o.sampling;
  cmd->add_option("-n,--n-predict", p.max_tokens, "Tokens to generate (-1: until EOS or the context is full)")
      ->capture_default_str();
  cmd->add_option("--temp", p.temperature, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", p.top_k, "Top-k sampling (0: off)")->capture_default_str();
  cmd->add_option("--top-p", p.top_p, "Top-p (nucleus) sampling (1.0: off)")->capture_default_str();
  cmd->add_option("--min-p", p.min_p, "Min-p sampling (0.0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", p.repeat_penalty, "Repetition penalty (1.0: off)")->capture_default_str();
  cmd->add_option("--repeat-last-n", p.repeat_last_n, "Tokens the penalties look back over (-1: all)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", p.presence_penalty, "OpenAI presence penalty")->capture_default_str();
  cmd->add_option("--frequency-penalty", p.frequency_penalty, "OpenAI frequency penalty")->capture_default_str();
  // A negative seed is a fresh one from the clock, taken when the flag is read.
  cmd->add_option("-s,--seed", p.seed, "RNG seed (-1: random)")
      ->transform([](const std::string& s) {
        int64_t v = 0;
        const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || ptr != s.data() + s.size() || v >= 0) return s;
        return std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
      })
      ->type_name("INT")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o.ctx, "Context size in tokens (0: the model's, at most 4096)")
      ->check(CLI::NonNegativeNumber)  // -c -5: a usage error naming the flag (was the engine's exit 1)
      ->capture_default_str();
  cmd->add_option("-t,--threads", o.threads, "Compute threads (default, 0 or -1: physical cores)")
      ->check(CLI::Range(-1, core::ThreadPool::kMaxThreads));
  cmd->add_flag("--ignore-eos", p.ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_option("--stop", p.stop, "Stop string (repeatable); not printed");
  cmd->add_option("--q2-layout", o.q2_layout,
                  "Force the type-42 layout: g64, g128-d-first, g128-qs-first (env BONSAI_Q2_LAYOUT)");
  cmd->add_flag("--no-repack", o.no_repack, kNoRepackHelp);
  cmd->add_flag("--jinja", o.jinja, "Render chat prompts with the model's Jinja chat template (the default)");
  cmd->add_flag("--no-jinja", o.no_jinja, "Render chat prompts with the built-in renderer of the template's family");
  cmd->add_option("--chat-template", o.chat_template,
                  "Chat template: a built-in renderer (chatml, qwen3, qwen35) or a Jinja template's text");
  cmd->add_option("--chat-template-file", o.chat_template_file, "Chat template read from a Jinja file");
  const auto kv_type_ok = [](const std::string& s) {
    const auto t = model::parse_kv_type(s);
    return t ? std::string() : t.error().message;
  };
  cmd->add_option("--cache-type-k", o.cache_type_k, "KV cache type for K: f16, f32, q8_0")
      ->check(kv_type_ok)
      ->capture_default_str();
  cmd->add_option("--cache-type-v", o.cache_type_v, "KV cache type for V: f16, f32, q8_0")
      ->check(kv_type_ok)
      ->capture_default_str();
  // Speculative decoding (llama.cpp's flag names; engine::SpecOptions).
  cmd->add_option("--spec-type", o.spec_type,
                  "Speculative decoding: ngram (prompt lookup: proposes what followed earlier occurrences of the "
                  "last tokens, verified in one step; off by itself where it does not pay), draft (the -md model "
                  "proposes) or none (the default without -md)")
      ->check([](const std::string& s) {
        const auto t = engine::parse_spec_type(s);
        return t ? std::string() : t.error().message;
      });
  cmd->add_option("--draft-max,--draft,--draft-n", o.spec.draft_max,
                  "Most tokens proposed per step (0: no speculation); fewer where acceptance is low")
      ->check(CLI::Range(0, engine::kMaxDraft))
      ->capture_default_str();
  cmd->add_option("--draft-min,--draft-n-min", o.spec.draft_min, "Fewest proposed tokens worth verifying")
      ->check(CLI::Range(0, engine::kMaxDraft))
      ->capture_default_str();
  cmd->add_option("--draft-p-min", o.spec.draft_p_min,
                  "Smallest draft-model probability of a proposed token (a draft model's; prompt lookup has none)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  add_ignored_llama_flags(cmd, o.llama, LlamaCommand::kRun);
  cmd->add_flag("--conversation", o.conversation,
                "llama-cli's -cnv: chat takes it (it is always a conversation); run refuses it (use chat)");
  cmd->add_flag("--no-conversation", o.no_conversation,
                "llama-cli's -no-cnv: run takes it (one prompt, no conversation); chat refuses it (use run)");
}

// The CLI's request preparation: an empty prompt starts from BOS alone, and
// -n beyond the context stops at the full context (finish "length").
constexpr engine::PrepareOptions kCliPrepare{.empty_prompt_is_bos = true, .refuse_overflow = false};

// A loaded model, tokenizer and one engine replica.
struct Session {
  std::string path;  // the model file (-m, -hf's cached file, or the built-in default's)
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  std::optional<engine::InferenceEngine> engine;
};

// The chat template flags as engine::ModelSpec's fields (as serve's).
engine::ModelSpec chat_spec_of(const GenOptions& o) {
  engine::ModelSpec spec;
  spec.jinja = !o.no_jinja;
  spec.chat_template = o.chat_template;
  spec.chat_template_file = o.chat_template_file;
  return spec;
}

// Resolves the model path (built-in default when none), loads everything.
// Prints a message naming `cmd` and returns nullopt on error, with `*rc` the
// exit code: kExitUsage for a flag that does not fit the model (-hf with -m,
// -c beyond the context the model supports), 1 for a runtime failure (a
// model or draft model that cannot be read or loaded).
std::optional<Session> open_session(const char* cmd, const GenOptions& o, int* rc) {
  *rc = kExitUsage;
  if (o.threads > 0 && !core::set_global_thread_count(o.threads)) {
    std::cerr << "bonsai " << cmd << ": warning: -t ignored (the thread pool already started)\n";
  }
  if (hf_conflicts_with_m(cmd, o.hf, !o.model_path.empty())) return std::nullopt;
  *rc = 1;
  std::string path = o.model_path;
  if (!o.hf.repo.empty()) {
    auto p = resolve_hf_model(cmd, o.hf.repo, o.hf.file);
    if (!p) return std::nullopt;
    path = *p;
  }
  if (path.empty()) {
    auto p = synth::ensure_default_model();
    if (!p) {
      std::cerr << "bonsai " << cmd << ": cannot prepare the built-in default model: " << p.error().message << "\n";
      return std::nullopt;
    }
    path = *p;
    std::cerr << "bonsai " << cmd << ": no -m given; using the built-in default model " << path
              << " (a tiny synthetic model: its text is not meaningful)\n";
  }
  const auto open_options = open_options_from_cli(o.q2_layout, o.no_repack);
  if (!open_options) {
    std::cerr << "bonsai " << cmd << ": " << open_options.error().message << "\n";
    return std::nullopt;
  }
  auto model = model::Model::load(path, *open_options);
  if (!model) {
    std::cerr << "bonsai " << cmd << ": cannot load model: " << model.error().message << "\n";
    return std::nullopt;
  }
  const auto chat = engine::chat_template_options(chat_spec_of(o));
  if (!chat) {
    std::cerr << "bonsai " << cmd << ": " << chat.error().message << "\n";
    return std::nullopt;
  }
  auto tok = tokenizer::Tokenizer::from_gguf((*model)->file(), *chat);
  if (!tok) {
    std::cerr << "bonsai " << cmd << ": cannot load the tokenizer of " << path << ": " << tok.error().message << "\n";
    return std::nullopt;
  }
  if (!(*tok)->load_warning().empty())
    std::cerr << "bonsai " << cmd << ": warning: " << path << ": " << (*tok)->load_warning() << "\n";
  if (auto ok = engine::check_ctx_supported(path, o.ctx, (*model)->config()); !ok) {
    std::cerr << "bonsai " << cmd << ": " << ok.error().message << "\n";
    *rc = kExitUsage;  // -c's value
    return std::nullopt;
  }
  engine::EngineOptions eo;
  eo.max_seq_len = o.ctx;
  eo.params = o.sampling;  // validated by InferenceEngine::create
  eo.kv_type_k = model::parse_kv_type(o.cache_type_k).value_or(model::KvType::kF16);  // checked by the parser
  eo.kv_type_v = model::parse_kv_type(o.cache_type_v).value_or(model::KvType::kF16);
  eo.spec = o.spec;
  // -md implies --spec-type draft; draft needs -md (checked by runtime_usage_ok).
  eo.spec.type = o.spec_type.empty() ? (o.model_draft.empty() ? engine::SpecType::kNone : engine::SpecType::kDraft)
                                     : engine::parse_spec_type(o.spec_type).value_or(engine::SpecType::kNone);
  if (eo.spec.type != engine::SpecType::kNone && (*model)->config().n_recurrent_layer() > 0) {
    // Sequence::propose never proposes for such a model: say so, and load no draft.
    std::cerr << "bonsai " << cmd << ": warning: speculative decoding is off for " << path << " ("
              << (*model)->config().arch_name
              << "): its recurrent state cannot roll back a rejected proposal; --spec-type / -md ignored\n";
    eo.spec.type = engine::SpecType::kNone;
  }
  if (eo.spec.type == engine::SpecType::kDraft) {
    auto draft = model::Model::load(o.model_draft, *open_options);
    if (!draft) {
      std::cerr << "bonsai " << cmd << ": cannot load the draft model " << o.model_draft << ": "
                << draft.error().message << "\n";
      return std::nullopt;
    }
    auto draft_tok = tokenizer::Tokenizer::from_gguf((*draft)->file(), *chat);
    if (!draft_tok) {
      std::cerr << "bonsai " << cmd << ": cannot load the tokenizer of the draft model " << o.model_draft << ": "
                << draft_tok.error().message << "\n";
      return std::nullopt;
    }
    if (auto ok = engine::check_draft_tokenizer(**tok, path, **draft_tok, o.model_draft); !ok) {
      std::cerr << "bonsai " << cmd << ": " << ok.error().message << "\n";
      return std::nullopt;
    }
    eo.spec.proposer = engine::draft_model_proposer(*draft, eo.kv_type_k, eo.kv_type_v);
  }
  auto eng = engine::InferenceEngine::create(*model, *tok, eo);
  if (!eng) {
    std::cerr << "bonsai " << cmd << ": " << eng.error().message << "\n";
    return std::nullopt;
  }
  Session s;
  s.path = path;
  s.model = *model;
  s.tok = *tok;
  s.engine.emplace(std::move(*eng));
  return s;
}

// Says when the prompt is not written in the model's own template: none in
// the GGUF (ChatML is used), or --no-jinja with a template of no built-in
// family (written as ChatML), instead of silently sending a prompt format
// the model may never have seen.
void warn_if_not_chatml(const char* cmd, const tokenizer::Tokenizer& tok) {
  const std::string& src = tok.chat_template().source();
  if (tok.chat_template().uses_jinja()) return;
  if (src.empty()) {
    std::cerr << "bonsai " << cmd << ": note: the model has no chat template (tokenizer.chat_template); using ChatML\n";
  } else if (src.find("<|im_start|>") == std::string::npos) {
    std::cerr << "bonsai " << cmd
              << ": warning: the model's chat template is not ChatML, the only format rendered; "
                 "the prompt is written as ChatML anyway\n";
  }
}

double per_second(int64_t n, double ms) { return ms > 0 ? static_cast<double>(n) * 1000.0 / ms : 0.0; }

void print_timings(const engine::GenerationResult& r) {
  std::fprintf(stderr, "\nprompt:     %5d tokens in %9.2f ms (%9.2f tokens/s)\n", r.prompt_tokens, r.prompt_ms,
               per_second(r.prompt_tokens, r.prompt_ms));
  std::fprintf(stderr, "generation: %5d tokens in %9.2f ms (%9.2f tokens/s)\n", r.completion_tokens, r.gen_ms,
               per_second(r.completion_tokens, r.gen_ms));
  if (r.draft_tokens > 0)
    std::fprintf(stderr, "speculation: %5d tokens proposed, %d accepted (%.1f%%)\n", r.draft_tokens, r.draft_accepted,
                 100.0 * r.draft_accepted / r.draft_tokens);
  std::fprintf(stderr, "finish_reason: %s\n", engine::finish_reason_name(r.finish_reason));
}

// llama.cpp server's `timings` object names.
nlohmann::ordered_json timings_json(const engine::GenerationResult& r) {
  return {{"prompt_n", r.prompt_tokens},
          {"prompt_ms", r.prompt_ms},
          {"prompt_per_second", per_second(r.prompt_tokens, r.prompt_ms)},
          {"predicted_n", r.completion_tokens},
          {"predicted_ms", r.gen_ms},
          {"predicted_per_second", per_second(r.completion_tokens, r.gen_ms)},
          {"ttft_ms", r.rate.ttft_ms},
          {"draft_n", r.draft_tokens},
          {"draft_n_accepted", r.draft_accepted}};
}

// ---- bonsai run ----------------------------------------------------------------

struct RunOptions {
  GenOptions gen;
  std::string prompt;
  std::string prompt_file;  // -f: the prompt is this file's bytes, as they are
  std::string system;
  bool chat = false;
  bool no_think = false;
  ReasoningOptions reasoning;  // with --chat
  bool json = false;
  bool prompt_given = false;  // -p was on the command line (even as -p '')
  bool file_given = false;    // -f was (even as -f '', which then fails to read)
};

// Largest prompt file read (bytes): far above any context window (a 1M-token
// context is ~4 MiB of text), so only endless inputs (/dev/zero, a pipe
// that never closes) hit it instead of exhausting memory.
constexpr size_t kMaxPromptFileBytes = size_t{256} << 20;

// The whole file at `path`, byte for byte (no newline trimming, no encoding
// check: the tokenizer takes the bytes as -p would); "-" is stdin, read to
// its end (llama-cli's and most Unix tools' convention). Error messages:
// "<path>: cannot read prompt file: <strerror(errno)>", or
// "<path>: prompt file is larger than 268435456 bytes".
core::Expected<std::string> read_prompt_file(const std::string& path) {
  auto fail = [&path](int err) {
    return core::fail(core::Errc::kIo, path + ": cannot read prompt file: " + std::strerror(err));
  };
  const bool is_stdin = path == "-";
  const int fd = is_stdin ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno);
  auto close_fd = [fd, is_stdin] {
    if (!is_stdin) ::close(fd);
  };
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;  // e.g. EISDIR for a directory
      close_fd();
      return fail(err);
    }
    if (text.size() + static_cast<size_t>(n) > kMaxPromptFileBytes) {
      close_fd();
      return core::fail(core::Errc::kInvalidArgument,
                        path + ": prompt file is larger than " + std::to_string(kMaxPromptFileBytes) + " bytes");
    }
    text.append(buf, static_cast<size_t>(n));
  }
  close_fd();
  return text;
}

// The CLI's runtime initialisation (cli_common.h: BONSAI_KERNEL, -t,
// --q2-layout / BONSAI_Q2_LAYOUT): a bad value is a usage error (exit 2, as
// in every command), reported before anything is loaded.
bool runtime_usage_ok(const char* cmd, const GenOptions& g) {
  const auto spec = engine::parse_spec_type(g.spec_type.empty() ? "none" : g.spec_type);
  if (spec && *spec == engine::SpecType::kDraft && g.model_draft.empty()) {
    std::cerr << "bonsai " << cmd << ": --spec-type draft needs a draft model (-md FILE)\n";
    return false;
  }
  if (spec && !g.spec_type.empty() && *spec != engine::SpecType::kDraft && !g.model_draft.empty()) {
    std::cerr << "bonsai " << cmd << ": -md/--model-draft is for --spec-type draft, not " << g.spec_type << "\n";
    return false;
  }
  // The sampling flags' ranges (--top-p 2, --min-p -1, ...) and the chat
  // template flags, as InferenceEngine::create and open_session would check
  // them after the load: bad flag values, not runtime failures.
  if (auto ok = g.sampling.validate(); !ok) {
    std::cerr << "bonsai " << cmd << ": " << ok.error().message << "\n";
    return false;
  }
  if (auto chat = engine::chat_template_options(chat_spec_of(g)); !chat) {
    std::cerr << "bonsai " << cmd << ": " << chat.error().message << "\n";
    return false;
  }
  return init_runtime_or_report(cmd,
                                RuntimeFlags{.threads = g.threads, .q2_layout = g.q2_layout, .no_repack = g.no_repack})
      .has_value();
}

int run_main(RunOptions o) {
  // Usage errors (exit 2) before the model is loaded.
  if (!runtime_usage_ok("run", o.gen)) return 2;
  if (o.file_given) {
    if (o.prompt_given) {
      std::cerr << "bonsai run: -p/--prompt and -f/--file cannot be used together\n";
      return 2;
    }
    auto text = read_prompt_file(o.prompt_file);
    if (!text) {
      std::cerr << "bonsai run: " << text.error().message << "\n";
      return 2;
    }
    o.prompt = std::move(*text);
  }
  int rc = 1;
  auto s = open_session("run", o.gen, &rc);
  if (!s) return rc;
  const tokenizer::Tokenizer& tok = *s->tok;
  // Prompt, BOS rule and context check as the server does (engine/completion.h);
  // an empty prompt starts from BOS alone.
  engine::CompletionInput in;
  // A system message is a chat message: --system (llama-cli's -sys) renders
  // the prompt with the chat template, as llama-cli's -sys does.
  if (!o.system.empty()) o.chat = true;
  in.chat = o.chat;
  if (o.chat) {
    warn_if_not_chatml("run", tok);
    if (!o.system.empty()) in.messages.push_back({.role = "system", .content = o.system});
    in.messages.push_back({.role = "user", .content = o.prompt});
    in.chat_options.enable_thinking = !o.no_think;
  } else {
    // Control tokens' text ("<|im_start|>") is parsed as those tokens, as
    // llama.cpp's CLI and our /v1/completions do (a prompt file holding a
    // rendered ChatML conversation must reach the model as ChatML).
    in.prompt = o.prompt;
  }
  auto prepared = engine::prepare_completion(tok, s->engine->max_seq_len(), o.gen.sampling, in, {}, kCliPrepare);
  if (!prepared) {
    std::cerr << "bonsai run: " << prepared.error().error.message << "\n";
    return 1;
  }
  const std::vector<int32_t>& ids = prepared->prompt;

  std::optional<AnswerPrinter> printer;
  if (o.chat && !o.json)
    printer.emplace(o.reasoning, engine::chat_output_options(tok.chat_template(), in.chat_options,
                                                             o.reasoning.reasoning_format == "deepseek",
                                                             /*parse_tool_calls=*/false));
  std::function<void(std::string_view)> on_text;
  if (printer) {
    on_text = [&printer](std::string_view t) { printer->feed(t); };
  } else if (!o.json) {
    on_text = write_out;
  }
  auto r = generate_streamed(*s->engine, ids, on_text);
  if (printer) printer->finish();
  if (!r) {
    std::cerr << "\nbonsai run: " << r.error().message << "\n";
    return 1;
  }
  if (o.json) {
    nlohmann::ordered_json j = {{"prompt_tokens", ids},
                                {"tokens", r->tokens},
                                {"text", r->text},
                                {"finish_reason", engine::finish_reason_name(r->finish_reason)},
                                {"timings", timings_json(*r)}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fputc('\n', stdout);
    std::fflush(stdout);
    print_timings(*r);
  }
  return 0;
}

// ---- bonsai chat -------------------------------------------------------------------

struct ChatCliOptions {
  GenOptions gen;
  std::string system;
  bool no_think = false;
  ReasoningOptions reasoning;
};

// chat's `/show info`: the model's summary, as Ollama's `/show info` and
// the head of `bonsai info` (architecture, parameters, context, embedding
// length, layers, weight type), then the file, this session's context and
// chat template. Written to stdout.
void print_model_summary(const Session& s) {
  const model::Model& m = *s.model;
  const model::ModelConfig& c = m.config();
  uint64_t n_params = 0;
  for (const auto& t : m.file().tensors()) n_params += static_cast<uint64_t>(t.n_elements());
  char params[32];
  const double p = static_cast<double>(n_params);
  if (p >= 1e9) {
    std::snprintf(params, sizeof params, "%.2fB", p / 1e9);
  } else {
    std::snprintf(params, sizeof params, p >= 1e6 ? "%.2fM" : "%.2fK", p >= 1e6 ? p / 1e6 : p / 1e3);
  }
  std::string weights = "?";  // the layer matrices' type (qwen35's layer 0 is a GDN layer: its ffn_up)
  if (const auto* t = m.file().find_tensor("blk.0.attn_q.weight")) {
    weights = core::ggml_type_name(t->type_id);
  } else if (const auto* u = m.file().find_tensor("blk.0.ffn_up.weight")) {
    weights = core::ggml_type_name(u->type_id);
  }
  std::printf(
      "  architecture      %s\n  parameters        %s\n  context length    %lld\n  embedding length  %lld\n"
      "  layers            %lld\n  weights           %s\n  file              %s\n  session context   %lld\n"
      "  chat template     %s\n",
      c.arch_name.c_str(), params, static_cast<long long>(c.n_ctx_train), static_cast<long long>(c.n_embd),
      static_cast<long long>(c.n_layer), weights.c_str(), s.path.c_str(),
      static_cast<long long>(s.engine->max_seq_len()), s.tok->chat_template().describe().c_str());
}

// chat's slash commands (Ollama's and llama-cli's names), listed by /help.
constexpr const char* kChatHelp =
    "  /help, /?           this list\n"
    "  /bye, /exit, /quit  quit (as end of input does)\n"
    "  /clear, /reset      forget the conversation (the system prompt stays)\n"
    "  /set system TEXT    make TEXT the system prompt (from now on, for the whole conversation)\n"
    "  /show info          the model's summary\n"
    "  //TEXT or \\/TEXT    send /TEXT as a message (a line that starts with '/' is a command)\n";

int chat_main(const ChatCliOptions& o) {
  if (!runtime_usage_ok("chat", o.gen)) return 2;
  int rc = 1;
  auto s = open_session("chat", o.gen, &rc);
  if (!s) return rc;
  const tokenizer::Tokenizer& tok = *s->tok;
  engine::InferenceEngine& eng = *s->engine;
  warn_if_not_chatml("chat", tok);
  std::cerr << "bonsai chat: template " << tok.chat_template().describe()
            << ". Type a message; /help lists the commands, /bye or end of input quits,\n"
            << "Ctrl-C stops an answer.\n";

  std::vector<tokenizer::ChatMessage> msgs;
  if (!o.system.empty()) msgs.push_back({.role = "system", .content = o.system});
  size_t n_fixed = msgs.size();  // the system message, if any (/set system adds or replaces it)
  tokenizer::ChatOptions co;
  co.enable_thinking = !o.no_think;
  const engine::SamplingParams& defaults = o.gen.sampling;  // as the engine's (validated by open_session)

  std::string line;
  while (true) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    // CRLF input (a file written on Windows, piped in): the '\r' is not part
    // of the message, nor of a command such as "/exit".
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Slash commands; "//TEXT" and "\\/TEXT" send "/TEXT". Commands go
    // nowhere near the model: an unknown one is reported, not sent.
    if (line.starts_with("//") || line.starts_with("\\/")) {
      line.erase(0, 1);
    } else if (line.starts_with('/')) {
      const size_t sp = line.find_first_of(" \t");
      const std::string word = line.substr(0, sp);
      const size_t rest_at = sp == std::string::npos ? sp : line.find_first_not_of(" \t", sp);
      const std::string rest = rest_at == std::string::npos ? std::string() : line.substr(rest_at);
      if (word == "/bye" || word == "/exit" || word == "/quit") break;
      if (word == "/help" || word == "/?") {
        std::fputs(kChatHelp, stdout);
      } else if (word == "/clear" || word == "/reset") {
        msgs.resize(n_fixed);
        std::cerr << "(conversation cleared)\n";
      } else if (word == "/set" && rest.starts_with("system") &&
                 (rest.size() == 6 || rest[6] == ' ' || rest[6] == '\t')) {
        const size_t text_at = rest.find_first_not_of(" \t", 6);
        if (text_at == std::string::npos) {
          std::cerr << "bonsai chat: usage: /set system TEXT\n";
        } else if (n_fixed == 1) {
          msgs.front().content = rest.substr(text_at);
          std::cerr << "(system prompt set)\n";
        } else {
          msgs.insert(msgs.begin(), {.role = "system", .content = rest.substr(text_at)});
          n_fixed = 1;
          std::cerr << "(system prompt set)\n";
        }
      } else if (word == "/set") {
        std::cerr << "bonsai chat: usage: /set system TEXT\n";
      } else if (word == "/show" && rest == "info") {
        print_model_summary(*s);
      } else if (word == "/show") {
        std::cerr << "bonsai chat: usage: /show info\n";
      } else {
        std::cerr << "bonsai chat: unknown command '" << word << "', /help lists them\n";
      }
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({.role = "user", .content = line});

    // Render; drop the oldest turns while the prompt leaves no room to answer.
    std::vector<int32_t> ids;
    bool too_long = false;
    while (true) {
      engine::CompletionInput in;
      in.chat = true;
      in.messages = msgs;
      in.chat_options = co;
      auto prepared = engine::prepare_completion(tok, eng.max_seq_len(), defaults, in, {}, kCliPrepare);
      if (prepared) {
        ids = std::move(prepared->prompt);
        break;
      }
      if (prepared.error().code != "context_length_exceeded") {
        std::cerr << "bonsai chat: " << prepared.error().error.message << "\n";
        return 1;
      }
      if (msgs.size() <= n_fixed + 1) {
        too_long = true;
        break;
      }
      msgs.erase(msgs.begin() + static_cast<std::ptrdiff_t>(n_fixed));
    }
    if (too_long) {
      std::cerr << "bonsai chat: the message is too long for the context (" << eng.max_seq_len()
                << " tokens; see -c)\n";
      msgs.pop_back();
      continue;
    }
    const bool parse_reasoning = o.reasoning.reasoning_format == "deepseek";
    AnswerPrinter printer(
        o.reasoning, engine::chat_output_options(tok.chat_template(), co, parse_reasoning, /*parse_tool_calls=*/false));
    auto r = generate_streamed(eng, ids, [&printer](std::string_view t) { printer.feed(t); });
    printer.finish();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!r) {
      std::cerr << "bonsai chat: " << r.error().message << "\n";
      msgs.pop_back();
      continue;
    }
    // The turn as the template reads it back: the answer and, parsed, its
    // reasoning apart (the template drops or keeps it); raw, the text.
    if (parse_reasoning) {
      tokenizer::ChatMessage answer{.role = "assistant", .content = printer.content()};
      if (!printer.reasoning().empty()) answer.reasoning_content = printer.reasoning();
      msgs.push_back(std::move(answer));
    } else {
      msgs.push_back({.role = "assistant", .content = r->text});
    }
  }
  return 0;
}

}  // namespace

void register_run(CLI::App& app) {
  auto run_opts = std::make_shared<RunOptions>();
  auto* run = app.add_subcommand("run", "Generate text from a prompt, streamed to stdout");
  add_gen_flags(run, run_opts->gen);
  auto* prompt_opt = run->add_option("-p,--prompt", run_opts->prompt, "Prompt text (empty: start from BOS alone)");
  auto* file_opt = run->add_option("-f,--file", run_opts->prompt_file,
                                   "Read the prompt from this file (its bytes as they are; - is stdin; not with -p)");
  run->add_flag("--chat", run_opts->chat, "Wrap the prompt in the model's chat template (as a user message)");
  run->add_option("--system,--system-prompt", run_opts->system,
                  "System message (also -sys, as llama-cli); implies --chat");
  run->add_flag("--no-think", run_opts->no_think, "With --chat: enable_thinking = false (Qwen3)");
  add_reasoning_flags(run, run_opts->reasoning);
  run->add_flag("--json", run_opts->json,
                "Print one JSON object {prompt_tokens, tokens, text, finish_reason, timings} instead");
  run->callback([run, run_opts, prompt_opt, file_opt] {
    run_opts->prompt_given = prompt_opt->count() > 0;
    run_opts->file_given = file_opt->count() > 0;
    if (run_opts->gen.conversation) {
      std::cerr << "bonsai run: -cnv (--conversation): run answers one prompt; for an interactive conversation "
                   "use `bonsai chat` (same flags; -sys/--system for the system prompt)\n";
      return set_exit_code(kExitUsage);
    }
    if (!report_ignored_llama_flags("run", *run)) return set_exit_code(kExitUsage);
    set_exit_code(run_main(*run_opts));
  });

  auto chat_opts = std::make_shared<ChatCliOptions>();
  chat_opts->gen.sampling.max_tokens = 1024;  // answers (with reasoning) run longer than one-shot runs
  auto* chat = app.add_subcommand("chat", "Interactive multi-turn chat in the terminal");
  add_gen_flags(chat, chat_opts->gen);
  chat->add_option("--system,--system-prompt", chat_opts->system, "System message (also -sys, as llama-cli)");
  chat->add_flag("--no-think", chat_opts->no_think, "enable_thinking = false (Qwen3)");
  add_reasoning_flags(chat, chat_opts->reasoning);
  chat->callback([chat, chat_opts] {
    if (chat_opts->gen.no_conversation) {
      std::cerr << "bonsai chat: -no-cnv (--no-conversation): chat is a conversation; for one prompt use "
                   "`bonsai run -p TEXT` (same flags)\n";
      return set_exit_code(kExitUsage);
    }
    if (!report_ignored_llama_flags("chat", *chat)) return set_exit_code(kExitUsage);
    set_exit_code(chat_main(*chat_opts));
  });
}

}  // namespace bonsai::app
