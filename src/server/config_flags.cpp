// `bonsai serve`'s command-line flags, one CLI11 option per row of the
// settings table (config.h). Apart from config.cpp so that only this file
// compiles CLI11.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "server/config.h"

namespace bonsai::server {

void add_serve_flags(CLI::App& cmd) {
  for (const SettingInfo& s : serve_settings()) {
    std::string names = "--" + std::string(s.name);
    // CLI11 takes one letter after a single dash; main.cpp rewrites the rest.
    if (s.alias.size() == 2) names = std::string(s.alias) + "," + names;
    std::string help = std::string(s.help) + " (default: " + std::string(s.default_text) + ")";
    if (s.alias.size() > 2) help += " (also " + std::string(s.alias) + ")";
    if (s.kind == SettingKind::kSwitch) {
      const std::string& description = help;  // (CLI11 binds a non-const string as the flag's variable)
      cmd.add_flag(names, description);
      continue;
    }
    CLI::Option* opt = cmd.add_option(
        names, [](const CLI::results_t&) { return true; }, help);
    opt->type_name(std::string(s.value_name));
    if (s.kind == SettingKind::kList) opt->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    // The row's own parser on a scratch config: a bad value is CLI11's usage
    // error "--name: <reason>" before anything runs.
    const SettingInfo* row = &s;
    opt->check(
        [row](const std::string& text) {
          ServeConfig scratch;
          const std::vector<std::string> one{text};
          const auto r = apply_serve_setting_text(*row, one, scratch);
          return r ? std::string() : r.error().message;
        },
        "");
  }
}

core::Expected<void> apply_serve_flags(const CLI::App& cmd, ServeConfig& config) {
  for (const SettingInfo& s : serve_settings()) {
    if (s.scope == SettingScope::kCommandLine) continue;
    const CLI::Option* opt = cmd.get_option_no_throw("--" + std::string(s.name));
    if (opt == nullptr || opt->count() == 0) continue;
    if (auto r = apply_serve_setting_text(s, opt->results(), config); !r)
      return core::fail(core::Errc::kInvalidArgument, "--" + std::string(s.name) + ": " + r.error().message);
  }
  return {};
}

}  // namespace bonsai::server
