// ModelConfig: the hyper-parameters of a Qwen3- or llama-architecture model,
// read from GGUF metadata with llama.cpp's key names (`<arch>.block_count`,
// `<arch>.attention.head_count_kv`, `<arch>.rope.scaling.type`, ...; see
// llama.cpp src/llama-arch.cpp LLM_KV_NAMES and src/llama-model.cpp
// load_hparams).
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace bonsai::gguf {
class File;
}

namespace bonsai::model {

// The architectures the forward pass implements.
//   kQwen3: QK-norm (per-head RMSNorm of Q and K), NeoX RoPE (llama.cpp
//           LLAMA_ROPE_TYPE_NEOX for qwen3).
//   kLlama: no QK-norm, normal RoPE on interleaved pairs (LLAMA_ROPE_TYPE_NORM).
//   kQwen35: Qwen3.5 hybrid (llama.cpp src/models/qwen35.cpp): Gated DeltaNet
//           layers, and gated full-attention layers (per-head sigmoid output
//           gate, QK-norm, NeoX RoPE on the first n_rot dims) where
//           (layer + 1) % full_attn_interval == 0. The layer math is
//           ../shared/fixtures/README.md "Qwen3.5 (qwen35) fixtures".
enum class Arch : uint8_t { kQwen3, kLlama, kQwen35 };

// How RoPE pairs up the rotated dimensions of one head.
//   kNorm: pairs (x[2i], x[2i+1])              (ggml rope mode 0)
//   kNeox: pairs (x[i], x[i + n_rot/2])        (ggml GGML_ROPE_TYPE_NEOX)
enum class RopeType : uint8_t { kNorm, kNeox };

// `<arch>.rope.scaling.type`: none, linear, yarn (llama.cpp LLAMA_ROPE_SCALING_TYPE_*).
enum class RopeScaling : uint8_t { kNone, kLinear, kYarn };

// All sizes are element counts. Invariants (checked by from_gguf):
// every count > 0, n_head % n_head_kv == 0, n_rot even and <= head_dim_k.
struct ModelConfig {
  Arch arch = Arch::kQwen3;
  std::string arch_name;  // general.architecture, e.g. "qwen3"
  RopeType rope_type = RopeType::kNeox;
  bool qk_norm = true;  // qwen3: attn_q_norm / attn_k_norm per head

  int64_t n_vocab = 0;              // rows of token_embd.weight (never assumed)
  int64_t n_ctx_train = 0;          // <arch>.context_length
  int64_t n_embd = 0;               // <arch>.embedding_length
  int64_t n_layer = 0;              // <arch>.block_count
  int64_t n_ff = 0;                 // <arch>.feed_forward_length
  int64_t n_head = 0;               // <arch>.attention.head_count
  int64_t n_head_kv = 0;            // <arch>.attention.head_count_kv (default n_head)
  int64_t head_dim_k = 0;           // <arch>.attention.key_length (default n_embd / n_head)
  int64_t head_dim_v = 0;           // <arch>.attention.value_length (default n_embd / n_head)
  int64_t n_rot = 0;                // <arch>.rope.dimension_count (default head_dim_k)
  float rope_freq_base = 10000.0f;  // <arch>.rope.freq_base
  float rms_eps = 1e-6f;            // <arch>.attention.layer_norm_rms_epsilon

  // RoPE scaling (llama.cpp applies it at every position, not only past the
  // original context). freq_scale = 1 / factor.
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scaling_factor = 1.0f;  // <arch>.rope.scaling.factor
  int64_t rope_orig_ctx = 0;         // <arch>.rope.scaling.original_context_length
  // YaRN parameters as llama.cpp's defaults (llama_context_params): ext_factor
  // 1 when the type is yarn (else 0), attn_factor 1, beta_fast 32, beta_slow 1.
  float yarn_ext_factor = 0.0f;
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;

  bool tied_output = true;  // no output.weight: logits use token_embd.weight

  // qwen35 only (0 elsewhere). Gated DeltaNet (GDN) layers: llama.cpp's
  // `<arch>.ssm.*` keys. A GDN layer's q and k have ssm_n_k_heads heads and
  // v ssm_n_v_heads heads, all of ssm_head_dim; v head h reads q/k head
  // h % ssm_n_k_heads (llama.cpp's "tiled" order).
  int64_t full_attn_interval = 0;  // <arch>.full_attention_interval (qwen35 default 4); 0: no GDN layers
  int64_t ssm_conv_kernel = 0;     // <arch>.ssm.conv_kernel: causal depthwise conv width
  int64_t ssm_head_dim = 0;        // <arch>.ssm.state_size: head dim of GDN q, k and v
  int64_t ssm_n_k_heads = 0;       // <arch>.ssm.group_count
  int64_t ssm_n_v_heads = 0;       // <arch>.ssm.time_step_rank
  // Full attention's q rows carry a per-head output gate (qwen35: attn_q is
  // [q(head_dim), gate(head_dim)] per head, 2 * q_dim rows).
  bool attn_output_gate = false;

  int64_t q_dim() const { return n_head * head_dim_k; }         // rows of attn_q
  int64_t k_dim() const { return n_head_kv * head_dim_k; }      // rows of attn_k
  int64_t v_dim() const { return n_head_kv * head_dim_v; }      // rows of attn_v
  int64_t attn_out_dim() const { return n_head * head_dim_v; }  // cols of attn_output

  // Whether layer l is a Gated DeltaNet (recurrent) layer rather than attention.
  bool is_recurrent(int64_t l) const { return full_attn_interval > 0 && (l + 1) % full_attn_interval != 0; }
  // Layers with a KV cache (attention layers): n_layer without GDN layers.
  int64_t n_kv_layer() const { return full_attn_interval > 0 ? n_layer / full_attn_interval : n_layer; }
  int64_t n_recurrent_layer() const { return n_layer - n_kv_layer(); }
  // Index of attention layer l among the attention layers (its KV cache
  // layer), or of GDN layer l among the GDN layers (its recurrent state).
  int64_t kv_layer(int64_t l) const { return full_attn_interval > 0 ? (l + 1) / full_attn_interval - 1 : l; }
  int64_t recurrent_layer(int64_t l) const { return full_attn_interval > 0 ? l - (l + 1) / full_attn_interval : 0; }
  // GDN widths: q and k each ssm_n_k_heads x ssm_head_dim, v (and the gated
  // output) ssm_n_v_heads x ssm_head_dim; conv channels = q + k + v.
  int64_t ssm_k_dim() const { return ssm_n_k_heads * ssm_head_dim; }
  int64_t ssm_v_dim() const { return ssm_n_v_heads * ssm_head_dim; }
  int64_t ssm_conv_dim() const { return 2 * ssm_k_dim() + ssm_v_dim(); }
  // Floats of one sequence's recurrent state per GDN layer: the conv tail
  // [(conv_kernel - 1)][conv_dim] then one state matrix per v head
  // [ssm_n_v_heads][head_dim (v)][head_dim (k)].
  int64_t recurrent_floats_per_layer() const {
    return (ssm_conv_kernel - 1) * ssm_conv_dim() + ssm_n_v_heads * ssm_head_dim * ssm_head_dim;
  }

  // Reads the config from `file`'s metadata (and n_vocab / tied_output from
  // its tensor table). general.architecture must be "qwen3", "llama" or
  // "qwen35".
  // Errors: kNotFound naming a missing required key (or token_embd.weight),
  // kUnsupported for another architecture or rope scaling type, kFormat for a
  // key of the wrong type or inconsistent values (e.g. "qwen3.attention.
  // head_count 6 is not a multiple of head_count_kv 4", a rope scaling
  // factor whose reciprocal overflows, more tokenizer tokens than
  // token_embd.weight rows), each message starting with the file path.
  static core::Expected<ModelConfig> from_gguf(const gguf::File& file);
};

}  // namespace bonsai::model
