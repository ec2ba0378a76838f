// The one parser of ModelSpec's load options (model_pool.h). Three sources
// set them: `bonsai serve`'s flags (apps/bonsai/cmd_serve.cpp), the serve
// TOML config (server/config.cpp) and the admin load route's JSON body
// (server/routes_admin.cpp). Each turns its native value into a FieldValue
// and calls set_model_field, which checks the type and range and applies it;
// the error message it returns is the same for every source, which adds its
// own framing (`--parallel: ...`, `serve.toml: key 'parallel': ...`,
// `Invalid 'parallel': ....`).
//
// Spellings: the canonical name is ModelSpec's member and the admin JSON
// field (`ctx_size`), the config key replaces '_' by '-' (`ctx-size`) and the
// flag is `--` + the config key (`--ctx-size`, alias `-c`). Two booleans are
// spelled negated outside JSON: config `no-repack` / flag `--no-repack` for
// `repack`, and `no-cache-prompt` / `--no-cache-prompt` for `prompt_cache`.
#pragma once

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "engine/model_pool.h"  // ModelSpec

namespace bonsai::engine {

// Largest pool_size: each replica holds its own workspace, so 1'000'000 of
// them would exhaust memory before any budget could help.
inline constexpr int kMaxModelPoolSize = 256;
// Largest parallel (live sequences per model): each sequence slot holds an
// [n_vocab] logits row and sampler state, which the KV budget does not count.
inline constexpr int kMaxModelParallel = 256;
// Largest ctx_size in tokens (a model's own limit is checked at load).
inline constexpr int kMaxModelCtxSize = 1'000'000;

// The ModelSpec fields the sources can set (model_pool.h says what each does).
enum class ModelField : uint8_t {
  kPoolSize,
  kCtxSize,
  kParallel,
  kQ2Layout,
  kRepack,
  kCacheTypeK,
  kCacheTypeV,
  kQueueFactor,
  kKvBudgetTokens,
  kBatchSize,
  kStepBudgetMs,
  kPromptCache,
  kJinja,
  kChatTemplate,
  kChatTemplateFile,
  kSpecType,    // SpecOptions::type: none | ngram | draft
  kModelDraft,  // ModelSpec::model_draft (-md FILE)
  kDraftMax,    // SpecOptions::draft_max
  kDraftMin,    // SpecOptions::draft_min
  kDraftPMin,   // SpecOptions::draft_p_min
};

// A field's value type: kInt takes an integer only, kNumber an integer or a
// floating-point number, kBool a boolean, kString a string (a name the field
// parses: a Q2_0 layout or a KV cache type; any text for chat_template /
// chat_template_file).
enum class FieldType : uint8_t { kInt, kNumber, kBool, kString };

// One row of the field table.
struct ModelFieldInfo {
  ModelField field;
  std::string_view name;        // canonical: ModelSpec member, admin JSON field (POST /admin/models/load)
  std::string_view toml_key;    // serve config key; its flag is "--" + toml_key
  std::string_view flag_alias;  // short flag ("-c"), or empty
  bool negated;                 // toml_key / flag mean the opposite of `name` (no-repack)
  FieldType type;
  double min, max;  // kInt / kNumber: the accepted range, both ends included
};

// A value as a source read it: std::monostate is a value of another type (a
// JSON array, a TOML table, text that is not a number).
using FieldValue = std::variant<std::monostate, int64_t, double, bool, std::string>;

// Why set_model_field refused a value. kWrongType only for kBool / kString
// fields: an integer field's message already says "expected an integer in
// [lo, hi]", so a value of another type is kBadValue there (the admin route
// has always answered invalid_value for it).
enum class FieldErrorKind : uint8_t { kUnknownField, kWrongType, kBadValue };
struct FieldError {
  FieldErrorKind kind = FieldErrorKind::kBadValue;
  std::string message;  // the core text, without the source's framing: "expected an integer in [1, 256]"
};

// Every field, in the order the admin route checks them. Static storage.
std::span<const ModelFieldInfo> model_fields();

// The row whose canonical name, config key (with '-' or '_'), flag
// ("--ctx-size") or alias ("-c") is `key`; nullptr for none. Static storage.
const ModelFieldInfo* find_model_field(std::string_view key);

// Checks `value` for the field spelled `key` (any spelling, as above; a
// negated spelling inverts a boolean) and sets it on `spec`. On an error
// `spec` is unchanged.
std::expected<void, FieldError> set_model_field(ModelSpec& spec, std::string_view key, const FieldValue& value);

// The value of command-line text `text` for field `info`: an integer, a
// number, true/false, or the text itself; std::monostate when it is none of
// what the field takes.
FieldValue parse_model_field_text(const ModelFieldInfo& info, std::string_view text);

// parse_model_field_text, then set_model_field: what a flag's value does.
std::expected<void, FieldError> set_model_field_text(ModelSpec& spec, std::string_view key, std::string_view text);

}  // namespace bonsai::engine
