// The CLI side of src/hub: the -hf / -hff flags that run, chat, serve,
// bench and info share (llama.cpp's names: `-hf, --hf-repo
// OWNER/NAME[:QUANT]`, `-hff, --hf-file FILE`; main.cpp rewrites the
// two-letter forms), and the fetch with a progress bar on a terminal.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace bonsai::app {

// What -hf / -hff gave (empty: not given).
struct HfFlags {
  std::string repo;  // --hf-repo OWNER/NAME[:QUANT]
  std::string file;  // --hf-file FILE (an exact file of the repository)
};

// Adds --hf-repo and --hf-file to `cmd` (help text names -hf / -hff).
void add_hf_flags(CLI::App* cmd, HfFlags& flags);

// The local path of the model `repo_arg` (OWNER/NAME[:QUANT]) and `file`
// name: from the Hugging Face cache, else downloaded into it (a progress
// bar on a terminal; options from the environment, hub::options_from_env).
// A model split in several files (gguf-split) is downloaded whole and its
// first part returned (gguf::File::open loads the set); an mmproj file is noted on
// stderr. Errors are printed as "bonsai <cmd>: <message>"; nullopt then
// (exit 1).
std::optional<std::string> resolve_hf_model(const char* cmd, const std::string& repo_arg, const std::string& file);

// `-m` and `-hf` together is a usage error: prints it and returns true.
bool hf_conflicts_with_m(const char* cmd, const HfFlags& flags, bool has_m);

void register_pull(CLI::App& app);  // cmd_pull.cpp  bonsai pull OWNER/NAME[:QUANT] [-hff FILE]
void register_list(CLI::App& app);  // cmd_pull.cpp  bonsai list [--json]

}  // namespace bonsai::app
