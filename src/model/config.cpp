#include "model/config.h"

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "gguf/gguf.h"  // File
#include "model/model_internal.h"

namespace bonsai::model {

namespace {

// Reads keys and remembers every problem (so `validate` lists them all).
class KeyReader {
 public:
  KeyReader(const gguf::File& f, std::string arch, std::vector<core::Error>& errors)
      : f_(f), arch_(std::move(arch)), errors_(errors) {}

  std::string key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }

  // A required unsigned count, > 0.
  std::optional<int64_t> count(std::string_view suffix) {
    const std::string k = key(suffix);
    auto v = f_.get<uint64_t>(k);
    if (!v) {
      errors_.push_back(v.error());
      return std::nullopt;
    }
    if (*v == 0 || *v > (uint64_t{1} << 31)) {
      errors_.push_back({core::Errc::kFormat,
                         f_.path() + ": key '" + k + "' = " + std::to_string(*v) + " is out of range (1..2^31)"});
      return std::nullopt;
    }
    return static_cast<int64_t>(*v);
  }
  // An optional count: `def` when absent; problems are recorded when present but bad.
  std::optional<int64_t> count_or(std::string_view suffix, int64_t def) {
    if (!f_.has(key(suffix))) return def;
    return count(suffix);
  }
  std::optional<float> real(std::string_view suffix) {
    const std::string k = key(suffix);
    auto v = f_.get<float>(k);
    if (!v) {
      errors_.push_back(v.error());
      return std::nullopt;
    }
    if (!std::isfinite(*v)) {
      errors_.push_back({core::Errc::kFormat, f_.path() + ": key '" + k + "' is not finite"});
      return std::nullopt;
    }
    return *v;
  }
  std::optional<float> real_or(std::string_view suffix, float def) {
    if (!f_.has(key(suffix))) return def;
    return real(suffix);
  }
  void problem(core::Errc code, std::string msg) { errors_.push_back({code, f_.path() + ": " + msg}); }

 private:
  const gguf::File& f_;
  std::string arch_;
  std::vector<core::Error>& errors_;
};

// general.architecture and what it fixes (RoPE style, QK norm); false after
// recording why the file cannot be read further.
bool read_arch(const gguf::File& f, ModelConfig& c, std::vector<core::Error>& errors) {
  auto got = f.get<std::string>("general.architecture");
  if (!got) {
    errors.push_back(std::move(got).error());
    return false;
  }
  c.arch_name = std::move(*got);
  const std::string& arch = c.arch_name;
  if (arch == "qwen3") {
    c.arch = Arch::kQwen3;
    c.rope_type = RopeType::kNeox;
    c.qk_norm = true;
  } else if (arch == "llama") {
    c.arch = Arch::kLlama;
    c.rope_type = RopeType::kNorm;
    c.qk_norm = false;
  } else if (arch == "qwen35") {
    c.arch = Arch::kQwen35;
    c.rope_type = RopeType::kNeox;  // llama.cpp: LLAMA_ROPE_TYPE_IMROPE; every text position section is the same
    c.qk_norm = true;
    c.attn_output_gate = true;
  } else {
    errors.push_back({core::Errc::kUnsupported, f.path() + ": general.architecture '" + arch +
                                                    "' is not supported (expected 'qwen3', 'qwen35' or 'llama')"});
    return false;
  }
  return true;
}

// The layer shape: layers, context, widths, heads and head dimensions, RMS eps.
void read_shape(const gguf::File& f, KeyReader& r, ModelConfig& c) {
  const auto n_layer = r.count("block_count");
  const auto n_ctx = r.count("context_length");
  const auto n_embd = r.count("embedding_length");
  const auto n_ff = r.count("feed_forward_length");
  const auto n_head = r.count("attention.head_count");
  const auto eps = r.real("attention.layer_norm_rms_epsilon");
  c.n_layer = n_layer.value_or(0);
  c.n_ctx_train = n_ctx.value_or(0);
  c.n_embd = n_embd.value_or(0);
  c.n_ff = n_ff.value_or(0);
  c.n_head = n_head.value_or(0);
  c.rms_eps = eps.value_or(1e-6f);
  if (eps && !(*eps > 0.0f)) {
    r.problem(core::Errc::kFormat, "key '" + r.key("attention.layer_norm_rms_epsilon") + "' must be > 0");
  }

  const auto n_head_kv = r.count_or("attention.head_count_kv", c.n_head);
  c.n_head_kv = n_head_kv.value_or(0);
  if (n_head && n_head_kv && c.n_head % c.n_head_kv != 0) {
    r.problem(core::Errc::kFormat, "key '" + r.key("attention.head_count") + "' = " + std::to_string(c.n_head) +
                                       " is not a multiple of '" + r.key("attention.head_count_kv") +
                                       "' = " + std::to_string(c.n_head_kv));
  }
  // head_dim defaults to n_embd / n_head (llama.cpp: n_embd_head_k).
  int64_t def_head_dim = 0;
  if (n_embd && n_head) {
    if (c.n_embd % c.n_head == 0) def_head_dim = c.n_embd / c.n_head;
  }
  const bool has_kl = f.has(r.key("attention.key_length"));
  const bool has_vl = f.has(r.key("attention.value_length"));
  if ((!has_kl || !has_vl) && n_embd && n_head && def_head_dim == 0) {
    r.problem(core::Errc::kFormat, "key '" + r.key("attention.key_length") + "'/'value_length' missing and '" +
                                       r.key("embedding_length") + "' = " + std::to_string(c.n_embd) +
                                       " is not a multiple of head_count " + std::to_string(c.n_head));
  }
  const auto hd_k = has_kl ? r.count("attention.key_length") : std::optional<int64_t>(def_head_dim);
  const auto hd_v = has_vl ? r.count("attention.value_length") : std::optional<int64_t>(def_head_dim);
  c.head_dim_k = hd_k.value_or(0);
  c.head_dim_v = hd_v.value_or(0);
}

// RoPE: rotated dimensions and the frequency base.
void read_rope(KeyReader& r, ModelConfig& c) {
  const auto n_rot = r.count_or("rope.dimension_count", c.head_dim_k);
  c.n_rot = n_rot.value_or(0);
  if (n_rot && c.head_dim_k > 0 && (c.n_rot > c.head_dim_k || c.n_rot % 2 != 0)) {
    r.problem(core::Errc::kFormat, "key '" + r.key("rope.dimension_count") + "' = " + std::to_string(c.n_rot) +
                                       " must be even and <= key_length " + std::to_string(c.head_dim_k));
  }
  const auto base = r.real_or("rope.freq_base", 10000.0f);
  c.rope_freq_base = base.value_or(10000.0f);
  if (base && !(*base > 0.0f)) {
    r.problem(core::Errc::kFormat, "key '" + r.key("rope.freq_base") + "' must be > 0");
  }
}

// RoPE scaling (llama.cpp load_hparams: rope.scaling.type, rope.scaling.factor
// or the older rope.scale_linear, rope.scaling.original_context_length) and
// the YaRN parameters.
void read_rope_scaling(const gguf::File& f, KeyReader& r, ModelConfig& c, std::vector<core::Error>& errors) {
  std::string scaling = "none";
  if (f.has(r.key("rope.scaling.type"))) {
    auto s = f.get<std::string>(r.key("rope.scaling.type"));
    if (!s) {
      errors.push_back(s.error());
    } else {
      scaling = *s;
    }
  }
  float factor = 0.0f;
  std::string factor_key = r.key("rope.scaling.factor");
  if (f.has(factor_key)) {
    factor = r.real("rope.scaling.factor").value_or(0.0f);
  } else if (f.has(r.key("rope.scale_linear"))) {
    factor_key = r.key("rope.scale_linear");
    factor = r.real("rope.scale_linear").value_or(0.0f);
  }
  // RoPE uses freq_scale = 1 / factor: a subnormal factor makes it infinite
  // and every rotated position NaN, so only 0 ("none") or a normal positive
  // float is a usable factor.
  if (factor < 0.0f || (factor > 0.0f && !std::isnormal(factor))) {
    std::ostringstream v;
    v << factor;
    r.problem(core::Errc::kFormat, "key '" + factor_key + "' = " + v.str() +
                                       " must be 0 or a positive normal float (1/factor is the "
                                       "RoPE frequency scale)");
    factor = 0.0f;
  }
  c.rope_scaling_factor = factor == 0.0f ? 1.0f : factor;  // llama.cpp: 0 means 1
  if (scaling == "none" || scaling.empty()) {
    // A factor without a type means linear in llama.cpp only via rope.scale_linear.
    c.rope_scaling = c.rope_scaling_factor != 1.0f ? RopeScaling::kLinear : RopeScaling::kNone;
  } else if (scaling == "linear") {
    c.rope_scaling = RopeScaling::kLinear;
  } else if (scaling == "yarn") {
    c.rope_scaling = RopeScaling::kYarn;
  } else {
    r.problem(core::Errc::kUnsupported,
              "key '" + r.key("rope.scaling.type") + "' = '" + scaling + "' is not supported (none, linear, yarn)");
  }
  c.rope_orig_ctx = r.count_or("rope.scaling.original_context_length", c.n_ctx_train).value_or(0);
  c.yarn_ext_factor = c.rope_scaling == RopeScaling::kYarn ? 1.0f : 0.0f;
  c.yarn_ext_factor = r.real_or("rope.scaling.yarn_ext_factor", c.yarn_ext_factor).value_or(0.0f);
  // llama.cpp folds `rope.scaling.attn_factor` (hparams.rope_attn_factor) into
  // the YaRN attn_factor; `rope.scaling.yarn_attn_factor` overrides it.
  c.yarn_attn_factor = r.real_or("rope.scaling.attn_factor", 1.0f).value_or(1.0f);
  c.yarn_attn_factor = r.real_or("rope.scaling.yarn_attn_factor", c.yarn_attn_factor).value_or(1.0f);
  c.yarn_beta_fast = r.real_or("rope.scaling.yarn_beta_fast", 32.0f).value_or(32.0f);
  c.yarn_beta_slow = r.real_or("rope.scaling.yarn_beta_slow", 1.0f).value_or(1.0f);
}

// qwen35's Gated DeltaNet shape (llama.cpp load_hparams for LLM_ARCH_QWEN35:
// ssm.conv_kernel, ssm.state_size, ssm.group_count, ssm.time_step_rank,
// ssm.inner_size, full_attention_interval). The bounds keep a hostile file
// from asking for an absurd recurrent state: the real 27B has conv kernel 4
// and state size 128.
void read_ssm(KeyReader& r, ModelConfig& c) {
  c.full_attn_interval = r.count_or("full_attention_interval", 4).value_or(0);
  c.ssm_conv_kernel = r.count("ssm.conv_kernel").value_or(0);
  c.ssm_head_dim = r.count("ssm.state_size").value_or(0);
  c.ssm_n_k_heads = r.count("ssm.group_count").value_or(0);
  c.ssm_n_v_heads = r.count("ssm.time_step_rank").value_or(0);
  const auto inner = r.count("ssm.inner_size");
  if (c.n_layer > 0 && c.full_attn_interval > c.n_layer) {
    r.problem(core::Errc::kFormat, "key '" + r.key("full_attention_interval") +
                                       "' = " + std::to_string(c.full_attn_interval) +
                                       " leaves no attention layer in " + std::to_string(c.n_layer) + " layers");
  }
  if (c.ssm_conv_kernel > 64 || c.ssm_conv_kernel < 2) {
    r.problem(core::Errc::kFormat,
              "key '" + r.key("ssm.conv_kernel") + "' = " + std::to_string(c.ssm_conv_kernel) + " is outside 2..64");
  }
  if (c.ssm_head_dim > 1024) {
    r.problem(core::Errc::kFormat, "key '" + r.key("ssm.state_size") + "' = " + std::to_string(c.ssm_head_dim) +
                                       " is over 1024 (the recurrent state is heads x state_size^2 floats)");
  }
  if (c.ssm_n_k_heads > 0 && c.ssm_n_v_heads % c.ssm_n_k_heads != 0) {
    r.problem(core::Errc::kFormat, "key '" + r.key("ssm.time_step_rank") + "' = " + std::to_string(c.ssm_n_v_heads) +
                                       " is not a multiple of '" + r.key("ssm.group_count") +
                                       "' = " + std::to_string(c.ssm_n_k_heads));
  }
  if (inner && c.ssm_head_dim > 0 && *inner != c.ssm_v_dim()) {
    r.problem(core::Errc::kFormat, "key '" + r.key("ssm.inner_size") + "' = " + std::to_string(*inner) +
                                       " is not time_step_rank x state_size = " + std::to_string(c.ssm_v_dim()));
  }
  // The gated full attention: q rows hold [q, gate] per head.
  if (c.head_dim_k != c.head_dim_v && c.head_dim_k > 0) {
    r.problem(core::Errc::kFormat, "keys '" + r.key("attention.key_length") + "' and 'value_length' differ (" +
                                       std::to_string(c.head_dim_k) + " vs " + std::to_string(c.head_dim_v) +
                                       "); qwen35's gated attention needs them equal");
  }
}

// Vocabulary size and tied output from the tensor table, checked against the
// tokenizer's token count.
void read_vocab_size(const gguf::File& f, KeyReader& r, ModelConfig& c, std::vector<core::Error>& errors) {
  if (const auto* te = f.find_tensor("token_embd.weight")) {
    c.n_vocab = te->ne[1];
    if (c.n_vocab <= 0 || te->n_dims != 2) {
      r.problem(core::Errc::kFormat, "tensor 'token_embd.weight' must be 2-D with >= 1 row");
    }
  } else {
    errors.push_back({core::Errc::kNotFound, f.path() + ": missing tensor 'token_embd.weight'"});
  }
  c.tied_output = f.find_tensor("output.weight") == nullptr;

  // Every id the tokenizer can produce must have an embedding row (llama.cpp
  // requires token_embd to have exactly one row per token; more rows than
  // tokens is harmless padding, fewer makes prompts fail mid-run).
  if (const gguf::Value* tv = f.find("tokenizer.ggml.tokens"); tv != nullptr && c.n_vocab > 0) {
    if (const auto* a = std::get_if<gguf::Array>(&tv->v);
        a != nullptr && a->items.size() > static_cast<uint64_t>(c.n_vocab)) {
      r.problem(core::Errc::kFormat, "tokenizer.ggml.tokens has " + std::to_string(a->items.size()) +
                                         " entries but tensor 'token_embd.weight' has only " +
                                         std::to_string(c.n_vocab) +
                                         " rows (tokens past the last row would have no embedding)");
    }
  }
}

}  // namespace

ModelConfig parse_config(const gguf::File& f, std::vector<core::Error>& errors) {
  ModelConfig c;
  if (!read_arch(f, c, errors)) return c;
  KeyReader r(f, c.arch_name, errors);
  read_shape(f, r, c);
  read_rope(r, c);
  read_rope_scaling(f, r, c, errors);
  if (c.arch == Arch::kQwen35) read_ssm(r, c);
  read_vocab_size(f, r, c, errors);
  return c;
}

core::Expected<ModelConfig> ModelConfig::from_gguf(const gguf::File& file) {
  std::vector<core::Error> errors;
  ModelConfig c = parse_config(file, errors);
  if (!errors.empty()) return std::unexpected(join_errors(errors));
  return c;
}

core::Error join_errors(const std::vector<core::Error>& errors) {
  core::Error e{errors.front().code, errors.front().message};
  for (size_t i = 1; i < errors.size(); ++i) e.message += "; " + errors[i].message;
  return e;
}

}  // namespace bonsai::model
