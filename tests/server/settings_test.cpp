// The one table of `bonsai serve` settings (server/config.h): each row's
// flag and TOML key give the same config, --help and the "unknown key"
// message list every row, the model rows are the ModelSpec parser's fields,
// and the README's table is the generated one (issue 33 item 5).
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model_spec_fields.h"
#include "server/config.h"

namespace bonsai::server {
namespace {

// `bonsai serve ARGS` parsed by the table's CLI11 options, applied over a
// default config. CLI11's usage errors (a refused value) come back as
// kInvalidArgument with CLI11's message.
core::Expected<ServeConfig> parse_flags(std::vector<std::string> args) {
  CLI::App app{"serve"};
  add_serve_flags(app);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return core::fail(core::Errc::kInvalidArgument, e.what());
  }
  ServeConfig c;
  if (auto r = apply_serve_flags(app, c); !r) return std::unexpected(r.error());
  return c;
}

// The row's example as a TOML value.
std::string toml_literal(const SettingInfo& s) {
  switch (s.kind) {
    case SettingKind::kSwitch:
    case SettingKind::kInt:
    case SettingKind::kNumber:
      return std::string(s.example);
    case SettingKind::kString:
      return "\"" + std::string(s.example) + "\"";
    case SettingKind::kList:
      return "[\"" + std::string(s.example) + "\"]";
  }
  return {};
}

std::vector<std::string> flag_args(const SettingInfo& s, std::string_view spelling) {
  if (s.kind == SettingKind::kSwitch) return {std::string(spelling)};
  return {std::string(spelling), std::string(s.example)};
}

TEST(Settings, EveryRowRoundTripsThroughToml) {
  ASSERT_GE(serve_settings().size(), 30u);
  for (const SettingInfo& s : serve_settings()) {
    SCOPED_TRACE(std::string(s.name));
    if (s.scope == SettingScope::kCommandLine) continue;
    const auto from_flag = parse_flags(flag_args(s, "--" + std::string(s.name)));
    ASSERT_TRUE(from_flag.has_value()) << from_flag.error().message;
    ServeConfig from_toml;
    const std::string line = std::string(s.name) + " = " + toml_literal(s) + "\n";
    const auto r = apply_serve_toml(line, "t.toml", from_toml);
    ASSERT_TRUE(r.has_value()) << line << r.error().message;
    EXPECT_EQ(*from_flag, from_toml) << line;
    // The example is not the default: the row did set something.
    EXPECT_NE(from_toml, ServeConfig{}) << line;
    // '_' for '-' in the key, and the one-letter alias, mean the same.
    std::string underscored = line;
    std::replace(underscored.begin(), underscored.begin() + static_cast<std::ptrdiff_t>(s.name.size()), '-', '_');
    ServeConfig from_underscored;
    ASSERT_TRUE(apply_serve_toml(underscored, "t.toml", from_underscored).has_value()) << underscored;
    EXPECT_EQ(from_underscored, from_toml);
    if (s.alias.size() == 2) {
      const auto from_alias = parse_flags(flag_args(s, s.alias));
      ASSERT_TRUE(from_alias.has_value()) << from_alias.error().message;
      EXPECT_EQ(*from_alias, from_toml);
    }
  }
}

// Some rows by value, so the round trip above cannot pass by both sides
// storing nothing or the same wrong thing.
TEST(Settings, FlagValuesLandInTheirFields) {
  const auto c = parse_flags({"-m",
                              "a=/m/a.gguf",
                              "-m",
                              "/m/b.gguf",
                              "--preload",
                              "b",
                              "--port",
                              "9090",
                              "-s",
                              "7",
                              "--max-body",
                              "100000",
                              "--queue-factor",
                              "2",
                              "--parallel",
                              "3",
                              "--header-timeout",
                              "2.5",
                              "--no-cache-prompt",
                              "--reasoning-format",
                              "none",
                              "-c",
                              "512"});
  ASSERT_TRUE(c.has_value()) << c.error().message;
  ASSERT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->models[0], (ModelArg{"a", "/m/a.gguf"}));
  EXPECT_EQ(c->models[1], (ModelArg{"b", "/m/b.gguf"}));
  EXPECT_EQ(c->preload, std::vector<std::string>{"b"});
  EXPECT_TRUE(c->preload_set);
  EXPECT_EQ(c->port, 9090);
  EXPECT_TRUE(c->seed_set);
  EXPECT_EQ(c->seed, 7u);
  EXPECT_EQ(c->max_body_bytes, 100000u);
  EXPECT_EQ(c->queue_factor, 2);
  EXPECT_EQ(c->parallel, 3);
  EXPECT_DOUBLE_EQ(c->header_timeout_s, 2.5);
  EXPECT_TRUE(c->no_cache_prompt);
  EXPECT_EQ(c->reasoning_format, "none");
  EXPECT_EQ(c->ctx_size, 512);
}

// A bad flag value is refused by the row's parser with the flag's name, and
// the same value in TOML by the same reason with the file and key.
TEST(Settings, BadValuesGetTheSameReasonFromFlagAndKey) {
  struct Case {
    std::string name, text, toml, reason;
  };
  for (const Case& c : std::vector<Case>{
           {"port", "70000", "70000", "expected an integer in [0, 65535]"},
           {"max-body", "0", "0", "expected an integer in [1, 1099511627776]"},
           {"timeout", "0", "0", "expected a number in [0.001, inf]"},
           {"drain-timeout", "-1", "-1", "expected a number in [0, 86400]"},
           {"reasoning-format", "raw", "\"raw\"", "expected \"deepseek\" or \"none\""},
           {"api-key", " ", "\" \"", "the API key is blank"},
           {"seed", "-1", "-1", "expected an integer in [0, 9223372036854775807]"},
           {"parallel", "0", "0", "expected an integer in [1, 256]"},
           {"model", "=x.gguf", "\"=x.gguf\"", "-m '=x.gguf': empty model id before '='"},
       }) {
    SCOPED_TRACE(c.name);
    const auto flag = parse_flags({"--" + c.name, c.text});
    ASSERT_FALSE(flag.has_value());
    EXPECT_NE(flag.error().message.find("--" + c.name + ": " + c.reason), std::string::npos) << flag.error().message;
    ServeConfig t;
    const auto key = apply_serve_toml(c.name + " = " + c.toml + "\n", "t.toml", t);
    ASSERT_FALSE(key.has_value());
    EXPECT_NE(key.error().message.find("t.toml: key '" + c.name + "': " + c.reason), std::string::npos)
        << key.error().message;
  }
  // A scalar flag given twice is a usage error (as CLI11 had it before).
  EXPECT_FALSE(parse_flags({"--port", "1", "--port", "2"}).has_value());
}

// Unknown keys are refused with the list of every key; `config` is a flag only.
TEST(Settings, UnknownKeysListEveryKnownKey) {
  ServeConfig c;
  const auto r = apply_serve_toml("pool_sise = 2\n", "s.toml", c);
  ASSERT_FALSE(r.has_value());
  const std::string& msg = r.error().message;
  EXPECT_TRUE(msg.starts_with("s.toml: key 'pool_sise': unknown key (known: model, ")) << msg;
  for (const SettingInfo& s : serve_settings()) {
    if (s.scope == SettingScope::kCommandLine) continue;
    EXPECT_NE(msg.find(" " + std::string(s.name) + ","), std::string::npos) << s.name << " missing from " << msg;
  }
  EXPECT_NE(msg.find("kv-budget-tokens"), std::string::npos);
  const auto config = apply_serve_toml("config = \"other.toml\"\n", "s.toml", c);
  ASSERT_FALSE(config.has_value());
  EXPECT_EQ(config.error().message,
            "s.toml: key 'config': a command-line flag only (a config file cannot name another)");
  // [router] preload is the preload setting; the top-level key too.
  ServeConfig p;
  ASSERT_TRUE(apply_serve_toml("[router]\npreload = [\"a\"]\n", "s.toml", p).has_value());
  ServeConfig q;
  ASSERT_TRUE(apply_serve_toml("preload = [\"a\"]\n", "s.toml", q).has_value());
  EXPECT_EQ(p, q);
  EXPECT_EQ(q.preload, std::vector<std::string>{"a"});
}

// The model rows are exactly the ModelSpec parser's fields, spelled as it
// spells them, of the type it takes.
TEST(Settings, ModelRowsAreTheModelSpecFields) {
  size_t model_rows = 0;
  for (const SettingInfo& s : serve_settings()) {
    if (s.scope != SettingScope::kModel) continue;
    ++model_rows;
    const engine::ModelFieldInfo* f = engine::find_model_field(s.name);
    ASSERT_NE(f, nullptr) << s.name;
    EXPECT_EQ(f->toml_key, s.name);
    EXPECT_EQ(f->flag_alias, s.alias) << s.name;
    const SettingKind want = f->type == engine::FieldType::kInt      ? SettingKind::kInt
                             : f->type == engine::FieldType::kNumber ? SettingKind::kNumber
                             : f->type == engine::FieldType::kBool   ? SettingKind::kSwitch
                                                                     : SettingKind::kString;
    EXPECT_EQ(s.kind, want) << s.name;
  }
  EXPECT_EQ(model_rows, engine::model_fields().size());
}

// `serve --help` lists every row: its flag, its alias, its default.
TEST(Settings, HelpListsEveryRow) {
  CLI::App app{"serve"};
  add_serve_flags(app);
  const std::string help = app.help();
  for (const SettingInfo& s : serve_settings()) {
    EXPECT_NE(help.find("--" + std::string(s.name)), std::string::npos) << s.name;
    if (!s.alias.empty()) {
      EXPECT_NE(help.find(std::string(s.alias)), std::string::npos) << s.alias;
    }
    EXPECT_NE(help.find("(default: " + std::string(s.default_text).substr(0, 10)), std::string::npos) << s.name;
  }
}

// The README's settings table is serve_settings_markdown(), byte for byte:
// a row added, removed or reworded in the table and not in the README (or
// the other way round) fails here. scripts/settings_table.sh rewrites it.
TEST(Settings, ReadmeTableIsTheGeneratedOne) {
  std::ifstream in(std::string(BONSAI_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in) << BONSAI_SOURCE_DIR << "/README.md";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string readme = ss.str();
  const std::string begin = "<!-- serve-settings:begin -->\n", end = "<!-- serve-settings:end -->";
  const size_t b = readme.find(begin);
  const size_t e = readme.find(end);
  ASSERT_NE(b, std::string::npos) << "README.md has no " << begin;
  ASSERT_NE(e, std::string::npos) << "README.md has no " << end;
  ASSERT_LT(b, e);
  const std::string table = readme.substr(b + begin.size(), e - b - begin.size());
  const std::string want = serve_settings_markdown();
  EXPECT_EQ(table, want) << "README.md's settings table differs from `bonsai serve --help-markdown`: run "
                            "scripts/settings_table.sh";
  // One row per setting (+ the header and the rule).
  EXPECT_EQ(static_cast<size_t>(std::count(want.begin(), want.end(), '\n')), serve_settings().size() + 2);
}

}  // namespace
}  // namespace bonsai::server
