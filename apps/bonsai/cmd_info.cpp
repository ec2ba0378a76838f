// PLACEHOLDER until its owner implements it: registers `bonsai info`, which
// reports that it is not built yet and exits 2.
#include <CLI/CLI.hpp>

#include <iostream>

#include "apps/bonsai/commands.h"

namespace bonsai::app {

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show a GGUF file's metadata and tensors (not implemented yet)");
  cmd->allow_extras();
  cmd->callback([] {
    std::cerr << "bonsai info: not implemented yet\n";
    set_exit_code(2);
  });
}

}  // namespace bonsai::app
