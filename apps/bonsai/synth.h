// Synthetic GGUF models (`bonsai synth`): deterministic random weights in
// the Bonsai formats with the real Bonsai shapes, every tensor and key a real
// file has, and a small byte-level BPE tokenizer of its own
// (tokenizer.ggml.model "gpt2") with the Qwen special tokens.
//  - Qwen3 (`qwen3`, Bonsai 1.7B/4B/8B): modelled on
//    ../shared/tools/make_qwen3_gguf.py (same tensor list and keys); pre
//    "qwen2", specials at their real ids relative to the end of the vocabulary.
//  - Qwen3.5 (`qwen35`, PrismML's 27B family: Gated DeltaNet + gated full
//    attention): the format of ../shared/fixtures/README.md "Qwen3.5
//    (`qwen35`) fixtures" as ../shared/tools/make_qwen35_gguf.py writes it
//    (same keys, tensor order, types, `prism.hadamard.*` fold keys); pre
//    "qwen35", specials at the fixture's ids.
// The code is our own.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace bonsai::synth {

// The architecture a file declares (general.architecture).
enum class Arch : uint8_t { kQwen3, kQwen35 };
// "qwen3" | "qwen35"; nullopt otherwise.
std::optional<Arch> parse_arch(std::string_view name);
std::string_view arch_name(Arch a);

// Model hyper-parameters of a preset (llama.cpp key names; qwen3 shapes from
// issue 2, qwen35 from the fixtures README and make_qwen35_gguf.py's 27B recipe).
struct Preset {
  std::string name;  // qwen3: "tiny", "1.7b", "4b", "8b"; qwen35: "tiny", "27b"
  Arch arch = Arch::kQwen3;
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

  // qwen35 only (0 for qwen3). Keys are `qwen35.<key>`.
  uint32_t n_rot = 0;                      // rope.dimension_count: rotated dims per head (partial rotary)
  std::array<int32_t, 4> rope_sections{};  // rope.dimension_sections (M-RoPE; text uses one position)
  uint32_t full_attn_interval = 0;         // full_attention_interval: layer i is full attention
                                           // when (i + 1) % interval == 0, else Gated DeltaNet
  uint32_t ssm_state = 0;                  // ssm.state_size: GDN head dim of k and v
  uint32_t ssm_groups = 0;                 // ssm.group_count: GDN k (and q) heads
  uint32_t ssm_v_heads = 0;                // ssm.time_step_rank: GDN v heads (multiple of ssm_groups)
  uint32_t ssm_conv = 0;                   // ssm.conv_kernel: causal conv taps
  uint32_t hadamard_block = 0;             // prism.hadamard.block_size written by --hadamard
  // Id of the first special token (<|endoftext|>); the 26 specials follow it
  // and [PADn] tokens fill the rest. 0: the specials are the last 26 ids (qwen3).
  uint32_t first_special = 0;
};

// The presets by name. qwen3: tiny | 1.7b | 4b | 8b; qwen35: tiny (the
// fixtures' shape) | 27b (the real 27B shape, vocabulary 248320).
// Errors: kInvalidArgument listing the names of that architecture.
core::Expected<Preset> preset(std::string_view name, Arch arch = Arch::kQwen3);

// Weight type of every matrix (token_embd and output included); norms are
// F32 (qwen35: also ssm_conv1d, ssm_dt.bias, ssm_a; ssm_alpha/ssm_beta BF16).
// qwen3 files take q1_0, q2_0 (g64) and f16. qwen35 files take all five: the
// matrices are drawn as ternary weights with one fp16 scale per 128 along a
// row (binary for q1_0), so q2_0 (both 64-halves of a 128 group share the
// scale), pq2_0 (type 142), ptq1_0 (type 143) and f16 files of one seed hold
// the same model.
enum class WeightType : uint8_t { kQ1_0, kQ2_0, kF16, kPQ2_0, kPTQ1_0 };
// "q1_0" | "q2_0" | "f16" | "pq2_0" | "ptq1_0"; nullopt otherwise.
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
  // qwen35 with a ternary type only: write the Bonsai 2 `prism.hadamard.*`
  // keys (block preset.hadamard_block, one explicit sign vector per distinct
  // input width, every foldable matrix listed, inverse [token_embd.weight],
  // gdn_v_grouped true). The weights are random, so they are "folded" only
  // in name: the file is valid for model::read_hadamard_fold.
  bool hadamard = false;
};

// The tokenizer synth writes: tokens, token types (llama.cpp's values: 1
// normal, 3 control, 4 user-defined, 5 unused), merges ("a b" in GPT-2's
// byte-to-unicode alphabet), special ids. Depends only on n_vocab and
// first_special: the 256 byte tokens, learned merge tokens, [PADn] up to
// first_special, Qwen's 26 added tokens in their original order, [PADn] to
// n_vocab. first_special 0 means n_vocab - 26 (the specials last, as Qwen3).
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  uint32_t eos_id = 0;  // <|im_end|>
  uint32_t bos_id = 0;  // <|endoftext|> (also padding), as in Qwen3 files
};
// Errors: kInvalidArgument when n_vocab is too small for the bytes, merges and
// specials, or first_special leaves no room for them.
core::Expected<Vocab> build_vocab(uint32_t n_vocab, uint32_t first_special = 0);

// The ChatML template stored as tokenizer.chat_template (both architectures:
// Qwen3.5's own template is not part of synth).
std::string_view chat_template();

// A Writer holding every key and tensor of the model; tensor data is
// generated when the writer writes (streaming: one tensor in memory at a
// time). Deterministic: the bytes depend only on (preset, type, seed,
// hadamard). Errors: kInvalidArgument for shapes the chosen type cannot hold,
// a type or --hadamard the architecture does not take.
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
