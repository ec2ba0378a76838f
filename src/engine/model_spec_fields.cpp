// The one parser of ModelSpec's load options. See model_spec_fields.h.
#include "engine/model_spec_fields.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/ggml_types.h"  // parse_q2_layout
#include "model/kv_cache.h"   // parse_kv_type

namespace bonsai::engine {
namespace {

using enum FieldType;

// Ranges: where the three sources disagreed, the strictest one (issue 31).
constexpr ModelFieldInfo kFields[] = {
    {ModelField::kPoolSize, "pool_size", "pool-size", "", false, kInt, 0, kMaxModelPoolSize},
    {ModelField::kCtxSize, "ctx_size", "ctx-size", "-c", false, kInt, 0, kMaxModelCtxSize},
    {ModelField::kParallel, "parallel", "parallel", "-np", false, kInt, 1, kMaxModelParallel},
    {ModelField::kQ2Layout, "q2_layout", "q2-layout", "", false, kString, 0, 0},
    {ModelField::kRepack, "repack", "no-repack", "", true, kBool, 0, 0},
    {ModelField::kCacheTypeK, "cache_type_k", "cache-type-k", "-ctk", false, kString, 0, 0},
    {ModelField::kCacheTypeV, "cache_type_v", "cache-type-v", "-ctv", false, kString, 0, 0},
    {ModelField::kQueueFactor, "queue_factor", "queue-factor", "", false, kInt, 1, 1 << 20},
    {ModelField::kKvBudgetTokens, "kv_budget_tokens", "kv-budget-tokens", "", false, kInt, 0,
     static_cast<double>(int64_t{1} << 40)},
    {ModelField::kBatchSize, "batch_size", "batch-size", "-b", false, kInt, 0, 1 << 20},
    {ModelField::kStepBudgetMs, "step_budget_ms", "step-budget-ms", "", false, kNumber, 0, 600000},
    {ModelField::kPromptCache, "prompt_cache", "no-cache-prompt", "", true, kBool, 0, 0},
    {ModelField::kJinja, "jinja", "no-jinja", "", true, kBool, 0, 0},
    {ModelField::kChatTemplate, "chat_template", "chat-template", "", false, kString, 0, 0},
    {ModelField::kChatTemplateFile, "chat_template_file", "chat-template-file", "", false, kString, 0, 0},
    {ModelField::kSpecType, "spec_type", "spec-type", "", false, kString, 0, 0},
    {ModelField::kModelDraft, "model_draft", "model-draft", "-md", false, kString, 0, 0},
    {ModelField::kDraftMax, "draft_max", "draft-max", "", false, kInt, 0, kMaxDraft},
    {ModelField::kDraftMin, "draft_min", "draft-min", "", false, kInt, 0, kMaxDraft},
    {ModelField::kDraftPMin, "draft_p_min", "draft-p-min", "", false, kNumber, 0, 1},
};

std::string range_text(const ModelFieldInfo& f) {
  auto num = [](double v) { return v == std::floor(v) ? std::to_string(static_cast<int64_t>(v)) : std::to_string(v); };
  return std::string(f.type == kInt ? "expected an integer" : "expected a number") + " in [" + num(f.min) + ", " +
         num(f.max) + "]";
}

std::unexpected<FieldError> refuse(FieldErrorKind kind, std::string message) {
  return std::unexpected(FieldError{kind, std::move(message)});
}

// An integer or number field's value, checked against its range.
std::expected<double, FieldError> checked_number(const ModelFieldInfo& f, const FieldValue& value) {
  double v = 0;
  if (const auto* i = std::get_if<int64_t>(&value))
    v = static_cast<double>(*i);
  else if (const auto* d = std::get_if<double>(&value); d && f.type == kNumber)
    v = *d;
  else
    return refuse(FieldErrorKind::kBadValue, range_text(f));
  if (!(v >= f.min) || !(v <= f.max)) return refuse(FieldErrorKind::kBadValue, range_text(f));
  return v;
}

// Sets a string field (a name it parses).
std::expected<void, FieldError> set_name(ModelSpec& spec, const ModelFieldInfo& f, const std::string& name) {
  // A template name or text, and a file path: read and checked when the model loads
  // (chat_template_options), where a bad one is an error naming the file or the construct.
  if (f.field == ModelField::kChatTemplate) {
    spec.chat_template = name;
    return {};
  }
  if (f.field == ModelField::kChatTemplateFile) {
    spec.chat_template_file = name;
    return {};
  }
  if (f.field == ModelField::kSpecType) {
    const auto type = parse_spec_type(name);
    if (!type)
      return refuse(FieldErrorKind::kBadValue,
                    "unknown speculation type '" + name + "' (expected none, ngram or draft)");
    spec.spec.type = *type;
    return {};
  }
  if (f.field == ModelField::kModelDraft) {  // read (and its tokenizer checked) when the model loads
    spec.model_draft = name;
    return {};
  }
  if (f.field == ModelField::kQ2Layout) {
    const auto layout = core::parse_q2_layout(name);
    if (!layout)
      return refuse(FieldErrorKind::kBadValue,
                    "unknown Q2_0 layout '" + name + "' (expected g64, g128-d-first or g128-qs-first)");
    spec.q2_layout = layout;
    return {};
  }
  const auto type = model::parse_kv_type(name);
  if (!type) return refuse(FieldErrorKind::kBadValue, type.error().message);
  (f.field == ModelField::kCacheTypeK ? spec.kv_type_k : spec.kv_type_v) = *type;
  return {};
}

// Sets a checked integer or number field.
void set_number(ModelSpec& spec, ModelField field, double v) {
  // Every kInt field but kv_budget_tokens is an int whose range (kFields)
  // fits one; converted only in those cases (a double past INT_MAX must not
  // reach an int conversion).
  const auto i = [v] { return static_cast<int>(v); };
  switch (field) {
    case ModelField::kPoolSize:
      spec.pool_size = i();
      break;
    case ModelField::kCtxSize:
      spec.ctx_size = i();
      break;
    case ModelField::kParallel:
      spec.parallel = i();
      break;
    case ModelField::kQueueFactor:
      spec.queue_factor = i();
      break;
    case ModelField::kKvBudgetTokens:
      spec.kv_budget_tokens = static_cast<int64_t>(v);
      break;
    case ModelField::kBatchSize:
      spec.batch_size = i();
      break;
    case ModelField::kStepBudgetMs:
      spec.step_budget_ms = v;
      break;
    case ModelField::kDraftMax:
      spec.spec.draft_max = i();
      break;
    case ModelField::kDraftMin:
      spec.spec.draft_min = i();
      break;
    case ModelField::kDraftPMin:
      spec.spec.draft_p_min = static_cast<float>(v);
      break;
    default:
      break;
  }
}

}  // namespace

std::span<const ModelFieldInfo> model_fields() { return kFields; }

const ModelFieldInfo* find_model_field(std::string_view key) {
  std::string k(key);
  for (char& c : k)
    if (c == '_') c = '-';
  for (const auto& f : kFields) {
    if (key == f.name || k == f.toml_key || (k.starts_with("--") && k.substr(2) == f.toml_key) ||
        (!f.flag_alias.empty() && key == f.flag_alias))
      return &f;
  }
  return nullptr;
}

std::expected<void, FieldError> set_model_field(ModelSpec& spec, std::string_view key, const FieldValue& value) {
  const ModelFieldInfo* f = find_model_field(key);
  if (f == nullptr) return refuse(FieldErrorKind::kUnknownField, "not a model option");
  switch (f->type) {
    case kInt:
    case kNumber: {
      const auto v = checked_number(*f, value);
      if (!v) return std::unexpected(v.error());
      set_number(spec, f->field, *v);
      return {};
    }
    case kBool: {
      const auto* b = std::get_if<bool>(&value);
      if (b == nullptr) return refuse(FieldErrorKind::kWrongType, "expected a boolean");
      // A negated spelling (no-repack) is any but the canonical name.
      const bool on = f->negated && key != f->name ? !*b : *b;
      (f->field == ModelField::kRepack  ? spec.repack
       : f->field == ModelField::kJinja ? spec.jinja
                                        : spec.prompt_cache) = on;
      return {};
    }
    case kString: {
      const auto* s = std::get_if<std::string>(&value);
      if (s == nullptr) return refuse(FieldErrorKind::kWrongType, "expected a string");
      return set_name(spec, *f, *s);
    }
  }
  return {};
}

FieldValue parse_model_field_text(const ModelFieldInfo& info, std::string_view text) {
  switch (info.type) {
    case kInt: {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec == std::errc() && end == text.data() + text.size() && !text.empty()) return v;
      return std::monostate{};
    }
    case kNumber: {
      const std::string s(text);
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return v;
      return std::monostate{};
    }
    case kBool:
      if (text == "true") return true;
      if (text == "false") return false;
      return std::monostate{};
    case kString:
      return std::string(text);
  }
  return std::monostate{};
}

std::expected<void, FieldError> set_model_field_text(ModelSpec& spec, std::string_view key, std::string_view text) {
  const ModelFieldInfo* f = find_model_field(key);
  if (f == nullptr) return refuse(FieldErrorKind::kUnknownField, "not a model option");
  return set_model_field(spec, key, parse_model_field_text(*f, text));
}

}  // namespace bonsai::engine
