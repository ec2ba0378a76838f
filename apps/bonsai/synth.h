// Synthetic Qwen3-architecture GGUF models (`bonsai synth`): deterministic
// random weights in the Bonsai formats with the real Bonsai shapes, every
// tensor and qwen3.* key a real file has, and a small byte-level BPE
// tokenizer of its own (tokenizer.ggml.model "gpt2", pre "qwen2") with the
// Qwen special tokens at their real ids relative to the end of the vocabulary.
// Modelled on ../shared/tools/make_qwen3_gguf.py (same tensor list and keys);
// the code is our own.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace bonsai::synth {

// Model hyper-parameters of a preset (Qwen3 names; see issue 2 for the shapes).
struct Preset {
  std::string name;        // "tiny", "1.7b", "4b", "8b"
  uint32_t n_embd = 0;     // qwen3.embedding_length
  uint32_t n_layer = 0;    // qwen3.block_count
  uint32_t n_head = 0;     // qwen3.attention.head_count
  uint32_t n_head_kv = 0;  // qwen3.attention.head_count_kv
  uint32_t head_dim = 0;   // qwen3.attention.key_length = value_length
  uint32_t n_ff = 0;       // qwen3.feed_forward_length
  uint32_t n_vocab = 0;    // tokens and token_embd rows
  uint32_t n_ctx = 0;      // qwen3.context_length
  bool tied = true;        // no output.weight: the lm head is token_embd
  float rope_base = 1e6f;  // qwen3.rope.freq_base
  float rms_eps = 1e-6f;   // qwen3.attention.layer_norm_rms_epsilon
  // YaRN (qwen3.rope.scaling.type "yarn"): factor 0 = no scaling keys.
  float yarn_factor = 0.0f;
  uint32_t yarn_original_ctx = 0;
};

// The presets by name: tiny | 1.7b | 4b | 8b. Errors: kInvalidArgument listing the names.
core::Expected<Preset> preset(std::string_view name);

// Weight type of every matrix (token_embd and output included); norms are F32.
enum class WeightType : uint8_t { kQ1_0, kQ2_0, kF16 };
// "q1_0" | "q2_0" | "f16"; nullopt otherwise.
std::optional<WeightType> parse_weight_type(std::string_view name);
std::string_view weight_type_name(WeightType t);

struct Options {
  Preset preset;
  WeightType type = WeightType::kQ1_0;
  uint64_t seed = 1;
  // Called after each tensor's data is generated (on the writing thread),
  // with the tensor bytes generated so far and the total of all tensors;
  // for a progress display. Empty: not called.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> on_progress;
};

// The tokenizer synth writes: tokens, token types (llama.cpp's values: 1
// normal, 3 control, 4 user-defined, 5 unused), merges ("a b" in GPT-2's
// byte-to-unicode alphabet), special ids. Depends only on n_vocab.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  uint32_t eos_id = 0;  // <|im_end|>
  uint32_t bos_id = 0;  // <|endoftext|> (also padding), as in Qwen3 files
};
// Errors: kInvalidArgument when n_vocab is too small for the bytes, merges and specials.
core::Expected<Vocab> build_vocab(uint32_t n_vocab);

// The ChatML template stored as tokenizer.chat_template.
std::string_view chat_template();

// A Writer holding every key and tensor of the model; tensor data is
// generated when the writer writes (streaming: one tensor in memory at a
// time). Deterministic: the bytes depend only on (preset, type, seed).
// Errors: kInvalidArgument for shapes the chosen type cannot hold.
core::Expected<gguf::Writer> build(const Options& options);

// build() + write to `path`. Errors: as build, kIo naming the path.
core::Expected<void> write_model(const std::string& path, const Options& options);

// The model `run`, `chat` and `serve` use when no -m is given: the tiny Q1_0
// preset (seed 1), written once to $BONSAI_CACHE_DIR, else
// $XDG_CACHE_HOME/bonsai, else ~/.cache/bonsai (atomically: temp file +
// rename, so concurrent callers are safe) and reused while it parses.
// Returns its path. Errors: kIo naming the directory/file.
core::Expected<std::string> ensure_default_model();

}  // namespace bonsai::synth
