// The `bonsai` CLI: one register_* function per subcommand, each in its own
// cmd_*.cpp, so the parts' owners can work on their commands independently.
// A command's callback stores its process exit code with set_exit_code.
#pragma once

namespace CLI {
class App;
}

namespace bonsai::app {

void register_info(CLI::App& app);      // cmd_info.cpp      bonsai info -m FILE [--json]
void register_validate(CLI::App& app);  // cmd_validate.cpp     bonsai validate -m FILE
void register_synth(CLI::App& app);     // cmd_synth.cpp     bonsai synth -o FILE --preset ...
void register_tokenize(CLI::App& app);  // cmd_tokenize.cpp  bonsai tokenize -m FILE -p TEXT
void register_logits(CLI::App& app);    // cmd_logits.cpp    bonsai logits -m FILE ...
void register_run(CLI::App& app);       // cmd_run.cpp       bonsai run / bonsai chat
void register_serve(CLI::App& app);     // cmd_serve.cpp     bonsai serve
void register_bench(CLI::App& app);     // cmd_bench.cpp     bonsai bench -m FILE -p 512 -n 128 ...

// Exit code of the command that ran (0 by default).
void set_exit_code(int code);
int exit_code();

}  // namespace bonsai::app
