// PLACEHOLDER until its owner implements it: registers `bonsai serve`, which
// reports that it is not built yet and exits 2.
#include <CLI/CLI.hpp>

#include <iostream>

#include "apps/bonsai/commands.h"

namespace bonsai::app {

void register_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API (not implemented yet)");
  cmd->allow_extras();
  cmd->callback([] {
    std::cerr << "bonsai serve: not implemented yet\n";
    set_exit_code(2);
  });
}

}  // namespace bonsai::app
