// The one ModelSpec option parser (engine/model_spec_fields.h) as its three
// sources use it: the admin load body (apply_admin_model_fields), the serve
// TOML config (apply_serve_toml + serve_model_spec) and `bonsai serve`'s
// flags (set_model_field_text, what their CLI11 checks call). A bad value
// gets the same core message from each, framed by the source; good values
// give equal ModelSpecs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model_spec_fields.h"
#include "server/config.h"
#include "server/routes_admin.h"  // apply_admin_model_fields

namespace bonsai::server {
namespace {

using json = nlohmann::json;

// One bad value as each source spells it.
struct BadCase {
  std::string field;      // admin JSON field
  json json_value;        // its value in the body
  std::string toml_line;  // the config line
  std::string flag;       // the flag
  std::string flag_text;  // its value on the command line
  std::string core;       // the parser's message, the same for all three
};

std::vector<BadCase> bad_cases() {
  const std::string q2 = "unknown Q2_0 layout 'bogus' (expected g64, g128-d-first or g128-qs-first)";
  const std::string kv = "cache type 'bogus' is not supported (f16, f32, q8_0)";
  return {
      {"parallel", 0, "parallel = 0", "--parallel", "0", "expected an integer in [1, 256]"},
      {"parallel", 257, "parallel = 257", "--parallel", "257", "expected an integer in [1, 256]"},
      {"ctx_size", -5, "ctx-size = -5", "--ctx-size", "-5", "expected an integer in [0, 1000000]"},
      {"ctx_size", 2'000'000, "ctx_size = 2000000", "-c", "2000000", "expected an integer in [0, 1000000]"},
      {"pool_size", 1000, "pool-size = 1000", "--pool-size", "1000", "expected an integer in [0, 256]"},
      {"pool_size", 1.5, "pool-size = 1.5", "--pool-size", "1.5", "expected an integer in [0, 256]"},
      {"q2_layout", "bogus", "q2-layout = \"bogus\"", "--q2-layout", "bogus", q2},
      {"cache_type_k", "bogus", "cache-type-k = \"bogus\"", "--cache-type-k", "bogus", kv},
      {"cache_type_v", "bogus", "cache_type_v = \"bogus\"", "-ctv", "bogus", kv},
  };
}

TEST(ModelFields, SameBadValueSameMessageFromJsonTomlAndFlags) {
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.field + " = " + c.json_value.dump());
    // Admin JSON: 400 "Invalid '<field>': <core>." naming the field.
    engine::ModelSpec spec;
    const auto e = apply_admin_model_fields(json{{c.field, c.json_value}}, spec);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, c.field);
    EXPECT_EQ(e->code, "invalid_value");
    EXPECT_EQ(e->message, "Invalid '" + c.field + "': " + c.core + ".");
    // TOML: "<file>: key '<key>': <core>" while reading, or, for a name
    // (checked later so that serve exits as for the flag), "<key>: <core>"
    // from validate_serve_config.
    ServeConfig cfg;
    cfg.models = {{"a", "/a.gguf"}};
    auto r = apply_serve_toml(c.toml_line + "\n", "t.toml", cfg);
    if (r) r = validate_serve_config(cfg);
    ASSERT_FALSE(r.has_value());
    const std::string& msg = r.error().message;
    EXPECT_TRUE(msg.ends_with(": " + c.core)) << msg;
    EXPECT_TRUE(msg.starts_with("t.toml: key '") ||
                msg.starts_with(std::string(engine::find_model_field(c.field)->toml_key) + ": "))
        << msg;
    // Flags: CLI11 reports "<flag>: <core>" as a usage error.
    engine::ModelSpec flag_spec;
    const auto f = engine::set_model_field_text(flag_spec, c.flag, c.flag_text);
    ASSERT_FALSE(f.has_value());
    EXPECT_EQ(f.error().message, c.core);
  }
}

TEST(ModelFields, WrongTypeIsInvalidTypeForNamesAndBooleans) {
  for (const auto& [field, value, want] : std::vector<std::tuple<std::string, json, std::string>>{
           {"q2_layout", 64, "Invalid type for 'q2_layout': expected a string."},
           {"cache_type_k", json::array(), "Invalid type for 'cache_type_k': expected a string."},
           {"repack", "no", "Invalid type for 'repack': expected a boolean."}}) {
    engine::ModelSpec spec;
    const auto e = apply_admin_model_fields(json{{field, value}}, spec);
    ASSERT_TRUE(e.has_value()) << field;
    EXPECT_EQ(e->code, "invalid_type");
    EXPECT_EQ(e->message, want);
  }
  ServeConfig cfg;
  auto r = apply_serve_toml("no-repack = \"yes\"\n", "t.toml", cfg);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message, "t.toml: key 'no-repack': expected a boolean");
}

// Fields compared by the tests below (ModelSpec has no operator==).
void expect_same_spec(const engine::ModelSpec& a, const engine::ModelSpec& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.pool_size, b.pool_size);
  EXPECT_EQ(a.ctx_size, b.ctx_size);
  EXPECT_EQ(a.parallel, b.parallel);
  EXPECT_EQ(a.q2_layout, b.q2_layout);
  EXPECT_EQ(a.repack, b.repack);
  EXPECT_EQ(a.kv_type_k, b.kv_type_k);
  EXPECT_EQ(a.kv_type_v, b.kv_type_v);
  EXPECT_EQ(a.queue_factor, b.queue_factor);
  EXPECT_EQ(a.kv_budget_tokens, b.kv_budget_tokens);
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_DOUBLE_EQ(a.step_budget_ms, b.step_budget_ms);
  EXPECT_EQ(a.prompt_cache, b.prompt_cache);
}

TEST(ModelFields, GoodValuesGiveEqualSpecsFromJsonTomlAndFlags) {
  // The server's default spec (serve_model_spec of an empty config) is what
  // an admin load of a new file and every flag start from.
  const auto base = serve_model_spec(ServeConfig{});
  ASSERT_TRUE(base.has_value()) << base.error().message;
  EXPECT_EQ(base->parallel, kDefaultParallel);
  EXPECT_EQ(base->queue_factor, 4);

  const json body{{"pool_size", 2},  {"ctx_size", 512},        {"parallel", 3},        {"q2_layout", "g128-d-first"},
                  {"repack", false}, {"cache_type_k", "q8_0"}, {"cache_type_v", "f32"}};
  engine::ModelSpec from_json = *base;
  ASSERT_FALSE(apply_admin_model_fields(body, from_json).has_value());

  ServeConfig cfg;
  auto r = apply_serve_toml(R"(
pool-size = 2
ctx_size = 512
parallel = 3
q2-layout = "g128-d-first"
no-repack = true
cache-type-k = "q8_0"
cache_type_v = "f32"
)",
                            "t.toml", cfg);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto from_toml = serve_model_spec(cfg);
  ASSERT_TRUE(from_toml.has_value()) << from_toml.error().message;

  engine::ModelSpec from_flags = *base;
  for (const auto& [flag, text] : std::vector<std::pair<std::string, std::string>>{{"--pool-size", "2"},
                                                                                   {"-c", "512"},
                                                                                   {"-np", "3"},
                                                                                   {"--q2-layout", "g128-d-first"},
                                                                                   {"--no-repack", "true"},
                                                                                   {"-ctk", "q8_0"},
                                                                                   {"--cache-type-v", "f32"}}) {
    auto f = engine::set_model_field_text(from_flags, flag, text);
    ASSERT_TRUE(f.has_value()) << flag << ": " << f.error().message;
  }
  EXPECT_EQ(from_json.pool_size, 2);
  EXPECT_EQ(from_json.ctx_size, 512);
  EXPECT_EQ(from_json.parallel, 3);
  EXPECT_EQ(from_json.q2_layout, core::Q2Layout::kG128DFirst);
  EXPECT_FALSE(from_json.repack);
  EXPECT_EQ(from_json.kv_type_k, model::KvType::kQ8_0);
  EXPECT_EQ(from_json.kv_type_v, model::KvType::kF32);
  expect_same_spec(from_json, *from_toml, "json vs toml");
  expect_same_spec(from_json, from_flags, "json vs flags");

  // The serving keys: config, flags and the admin body agree.
  ServeConfig more;
  ASSERT_TRUE(apply_serve_toml(
      "queue-factor = 2\nkv-budget-tokens = 4096\nbatch-size = 64\nstep-budget-ms = 12.5\nno-cache-prompt = true\n",
      "t.toml", more));
  const auto more_toml = serve_model_spec(more);
  ASSERT_TRUE(more_toml.has_value());
  engine::ModelSpec more_flags = *base;
  for (const auto& [flag, text] : std::vector<std::pair<std::string, std::string>>{{"--queue-factor", "2"},
                                                                                   {"--kv-budget-tokens", "4096"},
                                                                                   {"-b", "64"},
                                                                                   {"--step-budget-ms", "12.5"},
                                                                                   {"--no-cache-prompt", "true"}})
    ASSERT_TRUE(engine::set_model_field_text(more_flags, flag, text).has_value()) << flag;
  EXPECT_EQ(more_toml->queue_factor, 2);
  EXPECT_EQ(more_toml->kv_budget_tokens, 4096);
  EXPECT_DOUBLE_EQ(more_toml->step_budget_ms, 12.5);
  EXPECT_FALSE(more_toml->prompt_cache);
  expect_same_spec(*more_toml, more_flags, "toml vs flags (server-only keys)");
  // The admin body takes them too, by their canonical names, with the same ranges.
  engine::ModelSpec more_json = *base;
  ASSERT_FALSE(apply_admin_model_fields(json{{"queue_factor", 2},
                                             {"kv_budget_tokens", 4096},
                                             {"batch_size", 64},
                                             {"step_budget_ms", 12.5},
                                             {"prompt_cache", false}},
                                        more_json)
                   .has_value());
  expect_same_spec(*more_toml, more_json, "toml vs admin JSON (all fields)");
  const auto bad = apply_admin_model_fields(json{{"batch_size", -1}}, more_json);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->code, "invalid_value");
  EXPECT_EQ(bad->param, "batch_size");
}

// An admin load body key that is neither "id", "path" nor a field's canonical
// name is refused (a dashed or misspelled key was silently ignored).
TEST(ModelFields, AdminBodyRefusesUnknownKeys) {
  for (const char* key : {"ctx-size", "parallell", "-c", "threads"}) {
    engine::ModelSpec spec;
    const auto e = apply_admin_model_fields(json{{"id", "a"}, {"path", "/a.gguf"}, {key, 5}}, spec);
    ASSERT_TRUE(e.has_value()) << key;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->code, "unknown_parameter");
    EXPECT_EQ(e->param, key);
    EXPECT_EQ(e->message, std::string("Unrecognized request argument supplied: '") + key + "'.");
  }
  engine::ModelSpec spec;
  EXPECT_FALSE(apply_admin_model_fields(json{{"id", "a"}, {"path", "/a.gguf"}, {"ctx_size", 64}}, spec).has_value());
  EXPECT_EQ(spec.ctx_size, 64);
}

// kv_budget_tokens runs to 2^40: values past INT_MAX are stored whole (no
// conversion through int on the way).
TEST(ModelFields, LargeKvBudgetTokens) {
  engine::ModelSpec spec;
  ASSERT_TRUE(engine::set_model_field(spec, "kv_budget_tokens", int64_t{3000000000}).has_value());
  EXPECT_EQ(spec.kv_budget_tokens, int64_t{3000000000});
  ASSERT_TRUE(engine::set_model_field_text(spec, "--kv-budget-tokens", "1099511627776").has_value());
  EXPECT_EQ(spec.kv_budget_tokens, int64_t{1} << 40);
}

// Every spelling finds its row; unknown ones do not.
TEST(ModelFields, TableSpellings) {
  for (const engine::ModelFieldInfo& f : engine::model_fields()) {
    EXPECT_EQ(engine::find_model_field(f.name), &f) << f.name;
    EXPECT_EQ(engine::find_model_field(f.toml_key), &f) << f.toml_key;
    EXPECT_EQ(engine::find_model_field("--" + std::string(f.toml_key)), &f) << f.toml_key;
    if (!f.flag_alias.empty()) {
      EXPECT_EQ(engine::find_model_field(f.flag_alias), &f) << f.flag_alias;
    }
  }
  EXPECT_EQ(engine::find_model_field("port"), nullptr);
  EXPECT_EQ(engine::find_model_field("pool_sise"), nullptr);
  engine::ModelSpec spec;
  EXPECT_EQ(engine::set_model_field(spec, "port", int64_t{1}).error().kind, engine::FieldErrorKind::kUnknownField);
  // Negated spellings invert; the canonical one does not.
  ASSERT_TRUE(engine::set_model_field(spec, "no-repack", true));
  EXPECT_FALSE(spec.repack);
  ASSERT_TRUE(engine::set_model_field(spec, "repack", true));
  EXPECT_TRUE(spec.repack);
  ASSERT_TRUE(engine::set_model_field(spec, "no_cache_prompt", true));
  EXPECT_FALSE(spec.prompt_cache);
  // A refused value leaves the spec alone.
  spec.ctx_size = 64;
  EXPECT_FALSE(engine::set_model_field(spec, "ctx_size", int64_t{-1}));
  EXPECT_EQ(spec.ctx_size, 64);
}

}  // namespace
}  // namespace bonsai::server
