// PLACEHOLDER until its owner implements it: registers `bonsai synth`, which
// reports that it is not built yet and exits 2.
#include <CLI/CLI.hpp>

#include <iostream>

#include "apps/bonsai/commands.h"

namespace bonsai::app {

void register_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth", "Write a Qwen3 GGUF with random weights (not implemented yet)");
  cmd->allow_extras();
  cmd->callback([] {
    std::cerr << "bonsai synth: not implemented yet\n";
    set_exit_code(2);
  });
}

}  // namespace bonsai::app
