// PLACEHOLDER until its owner implements it: registers `bonsai validate`,
// which reports that it is not built yet and exits 2.
#include <CLI/CLI.hpp>

#include <iostream>

#include "apps/bonsai/commands.h"

namespace bonsai::app {

void register_validate(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "Check that a GGUF is a loadable model (not implemented yet)");
  cmd->allow_extras();
  cmd->callback([] {
    std::cerr << "bonsai validate: not implemented yet\n";
    set_exit_code(2);
  });
}

}  // namespace bonsai::app
