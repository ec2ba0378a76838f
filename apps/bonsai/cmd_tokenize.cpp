// PLACEHOLDER until its owner implements it: registers `bonsai tokenize`, which
// reports that it is not built yet and exits 2.
#include <CLI/CLI.hpp>

#include <iostream>

#include "apps/bonsai/commands.h"

namespace bonsai::app {

void register_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text (not implemented yet)");
  cmd->allow_extras();
  cmd->callback([] {
    std::cerr << "bonsai tokenize: not implemented yet\n";
    set_exit_code(2);
  });
}

}  // namespace bonsai::app
