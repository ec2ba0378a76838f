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
enum class Arch : uint8_t { kQwen3, kLlama };

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

  int64_t q_dim() const { return n_head * head_dim_k; }         // rows of attn_q
  int64_t k_dim() const { return n_head_kv * head_dim_k; }      // rows of attn_k
  int64_t v_dim() const { return n_head_kv * head_dim_v; }      // rows of attn_v
  int64_t attn_out_dim() const { return n_head * head_dim_v; }  // cols of attn_output

  // Reads the config from `file`'s metadata (and n_vocab / tied_output from
  // its tensor table). general.architecture must be "qwen3" or "llama".
  // Errors: kNotFound naming a missing required key (or token_embd.weight),
  // kUnsupported for another architecture or rope scaling type, kFormat for a
  // key of the wrong type or inconsistent values (e.g. "qwen3.attention.
  // head_count 6 is not a multiple of head_count_kv 4", a rope scaling
  // factor whose reciprocal overflows, more tokenizer tokens than
  // token_embd.weight rows), each message starting with the file path.
  static core::Expected<ModelConfig> from_gguf(const gguf::File& file);
};

}  // namespace bonsai::model
