// llama.cpp's command lines, run unchanged: the multi-letter single-dash
// flags CLI11 cannot register (it reads `-ngl 99` as `-n gl 99`, `-sys X`
// as `-s ys X`, `-fa` as `-f a`), rewritten to long names before parsing,
// and the GPU / memory-placement flags that have no meaning on bonsai's CPU
// engine (-ngl, -fa, -ub, -nkvo, -sm, -mg, -ts, -dev, --mlock, --no-mmap,
// llama-bench's -mmp), accepted with their values checked and a one-line
// note that they are ignored. Flag names and value forms are llama.cpp's
// (common/arg.cpp, tools/llama-bench).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace bonsai::app {

// Rewrites argv's whole arguments after the command word (run, chat, serve,
// bench, info, pull) from llama.cpp's multi-letter single-dash names to the
// long names the commands register: -hf/-hff, -ctk/-ctv, -md, -np (serve),
// -pg (bench), -ngl, -fa, -ub, -nkvo, -sm, -mg, -ts, -dev, -mmp (bench),
// -sys, -cnv, -no-cnv (run, chat), -lv (all four), -cb, -nocb (serve); serve's --jinja
// (its default) is dropped. Only a whole argument is rewritten, and not
// the value of a text flag (`-p -ngl` asks about "-ngl"; also --prompt,
// --system, -sys, --stop, -a), as llama.cpp's parser reads them. The
// result points into static storage or into `argv`.
std::vector<char*> rewrite_llama_args(int argc, char** argv);

// Storage of the ignored llama.cpp flags' values (CLI11 writes them; what
// was given is read back from the command's options by
// report_ignored_llama_flags). Shared by run, chat, serve and bench.
struct IgnoredLlamaFlags {
  std::vector<std::string> gpu_layers;    // --n-gpu-layers / --gpu-layers / -ngl: N, all, auto (bench: a comma list)
  std::vector<std::string> flash_attn;    // --flash-attn / -fa [on|off|auto] (llama-bench: 0, 1); no value: on
  std::vector<std::string> ubatch;        // --ubatch-size / -ub: N >= 1 (bench: a comma list)
  std::vector<std::string> split_mode;    // --split-mode / -sm: none, layer, row
  std::vector<std::string> main_gpu;      // --main-gpu / -mg: N >= 0
  std::vector<std::string> tensor_split;  // --tensor-split / -ts: proportions, e.g. 3,1
  std::vector<std::string> device;        // --device / -dev: a device list, or none
  std::vector<std::string> mmap;          // llama-bench's --mmap / -mmp: 0 or 1 (a comma list)
  std::vector<std::string> batch;         // llama-bench's -b / --batch-size: N >= 1 (a comma list)
  bool no_kv_offload = false;             // --no-kv-offload / -nkvo
  bool mlock = false;                     // --mlock
  bool no_mmap = false;                   // --no-mmap (bonsai always maps the file)
  bool cont_batching = false;             // serve: --cont-batching / -cb (always on)
  bool no_cont_batching = false;          // serve: --no-cont-batching / -nocb (not available: refused)
  bool metrics = false;                   // serve: --metrics (/metrics is always served)
  bool slots = false;                     // serve: --slots (/slots is always served)
  // Logging, llama.cpp's common flags: --log-file and --log-disable act
  // (report_ignored_llama_flags applies them); the others are accepted.
  std::string log_file;       // --log-file FILE: stderr (serve: and stdout) appended to FILE
  bool log_disable = false;   // --log-disable: stderr discarded
  bool verbose = false;       // -v / --verbose
  std::string log_verbosity;  // --log-verbosity / -lv N
  bool log_decor = false;     // --log-timestamps / --log-prefix
};

// Which command the flags are added to: bench takes llama-bench's comma
// lists and -mmp; serve takes llama-server's --cont-batching / --metrics /
// --slots; run and chat take llama-cli's.
enum class LlamaCommand { kRun, kServe, kBench };

// Adds the ignored flags to `cmd` in a help group "llama.cpp compatibility
// (ignored)", each checking its value as llama.cpp would (a bad value is a
// usage error naming the flag and the values it takes).
void add_ignored_llama_flags(CLI::App* cmd, IgnoredLlamaFlags& flags, LlamaCommand which);

// Applies --log-file (stderr, and serve's stdout, appended to the file) or
// --log-disable (stderr discarded), then reports the ignored flags `app`
// (the command) was given: false after printing why for a log file that
// cannot be opened, both log flags, or --no-cont-batching (-nocb), which
// bonsai cannot honour (the caller exits kExitUsage); otherwise true, after
// one line "bonsai <cmd>: note: ignored -ngl, -fa (...)" on stderr when any
// was given (--cont-batching, --metrics and --slots describe what bonsai
// always does and are not noted).
bool report_ignored_llama_flags(std::string_view cmd, const CLI::App& app);

}  // namespace bonsai::app
