// Synthetic Qwen3 / Qwen3.5 GGUF writer (see synth.h). Weights: every tensor
// has its own xoshiro256** stream seeded from (seed, tensor name), so a
// tensor's bytes do not depend on the order of tensors. Each matrix row has
// its own stream (tensor seed, row index), so rows are generated in parallel
// and the bytes do not depend on the thread count. Entry rms is
// gain/sqrt(row length) so each projection maps rms-1 inputs to rms-`gain`
// outputs (activations stay O(1) after every RMSNorm); the lm head gets
// log-normal per-row gains so some tokens are consistently louder and the
// argmax is clear.
//  - qwen3 matrices are approximately normal values (Irwin–Hall, 4 uniforms)
//    quantized with the kernels' reference quantizers (Q1_0 / Q2_0) or
//    rounded to fp16.
//  - qwen35 matrices are drawn directly in the Bonsai form, as
//    make_qwen35_gguf.py does: per 128 weights of a row one fp16 scale and
//    ternary digits (binary signs for Q1_0), then packed into the file's
//    layout, so every ternary type of one seed is the same model.
#include "apps/bonsai/synth.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/formats.h"  // encode_ptq1_0
#include "kernels/kernels.h"

namespace bonsai::synth {
namespace {

// ---- RNG: splitmix64 seeding, xoshiro256** (Blackman & Vigna, prng.di.unimi.it) ----

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& x : s_) x = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 24 bits.
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  // Approximately standard normal: sum of 4 uniforms (variance 4/12), centred and scaled.
  float normal() {
    const uint64_t r = next();
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
    return (sum - 2.0f) * 1.7320508f;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// FNV-1a of a tensor name, mixed with the seed: the tensor's stream seed.
uint64_t tensor_seed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  uint64_t s = seed ^ h;
  return splitmix64(s);
}

// ---- tokenizer -------------------------------------------------------------------------

// GPT-2's byte-to-unicode map (the alphabet of byte-level BPE vocabularies):
// printable Latin-1 bytes map to themselves, the rest to U+0100 + n in byte order.
// Returns the 256 byte tokens in GPT-2/Qwen id order and a byte -> token string map.
struct ByteAlphabet {
  std::vector<std::string> tokens_in_id_order;
  std::string of_byte[256];
  uint8_t byte_of_id[256];  // inverse: the byte token id i stands for
};

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a = [] {
    ByteAlphabet out;
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    };
    for (int b = 0; b < 256; ++b) {
      if (printable(b)) {
        out.of_byte[b] = utf8(static_cast<uint32_t>(b));
        out.byte_of_id[out.tokens_in_id_order.size()] = static_cast<uint8_t>(b);
        out.tokens_in_id_order.push_back(out.of_byte[b]);
      }
    }
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      if (!printable(b)) {
        out.of_byte[b] = utf8(static_cast<uint32_t>(256 + n++));
        out.byte_of_id[out.tokens_in_id_order.size()] = static_cast<uint8_t>(b);
        out.tokens_in_id_order.push_back(out.of_byte[b]);
      }
    }
    return out;
  }();
  return a;
}

// Training text for the merges (our own prose; any English text would do).
constexpr std::string_view kCorpus =
    "The little bonsai tree stood on the window sill of the old house. Every morning the light "
    "came in "
    "through the glass and the tree turned its small green leaves toward the sun. The gardener who "
    "lived "
    "in the house was patient. She trimmed the branches with care and watered the soil when it was "
    "dry. "
    "Hello, world! This is a small language model that was written by a program. It does not know "
    "much, "
    "but it can count: one, two, three, four, five, six, seven, eight, nine, ten. It can also say "
    "the "
    "days of the week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday. "
    "What is the capital of France? The capital of France is Paris. What is the answer to the "
    "question? "
    "The answer is that there is no answer, only another question. The model reads the prompt and "
    "then it "
    "writes the next token, and the next, and the next, until it reaches the end of the text. "
    "In the beginning there were bits, and the bits were either zero or one. Then there were three "
    "values: minus one, zero and plus one. A ternary weight is one of these three values times a "
    "scale. "
    "A binary weight is plus or minus the scale. These models are small and fast, and they run on "
    "the "
    "computer that is on your desk. The server answers many requests at the same time. Each "
    "request "
    "has a prompt, a number of tokens to generate, a temperature and a seed. "
    "def main():\n    print(\"hello world\")\n    return 0\n\nfor i in range(10):\n    print(i * "
    "i)\n"
    "int main(int argc, char** argv) { return argc > 1 ? 0 : 1; }\n"
    "Once upon a time there was a girl named Lily who liked to read books about trees and rivers "
    "and the "
    "stars in the night sky. She wanted to be a scientist when she grew up, and she asked many "
    "questions. "
    "Why is the sky blue? Why do leaves fall in the autumn? How does the model know which word "
    "comes next? "
    "The user asked the assistant a question, and the assistant thought about it and then "
    "answered. ";

// Splits text into pre-tokens roughly as the qwen2 pre-tokenizer does: an
// optional leading space plus a run of letters, single digits, runs of other
// symbols, and whitespace runs.
std::vector<std::string> pre_tokens(std::string_view text) {
  std::vector<std::string> out;
  auto is_alpha = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; };
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() && !is_space(text[j + 1]) && !is_digit(text[j + 1])) ++j;
    if (is_alpha(text[j])) {
      while (j < text.size() && is_alpha(text[j])) ++j;
    } else if (is_digit(text[j])) {
      ++j;
    } else if (is_space(text[j])) {
      while (j < text.size() && is_space(text[j])) ++j;
    } else {
      while (j < text.size() && !is_alpha(text[j]) && !is_digit(text[j]) && !is_space(text[j])) ++j;
    }
    out.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

// Byte-pair-encoding training (Sennrich et al. 2016) on the corpus pre-tokens:
// repeatedly merge the most frequent adjacent pair (ties: smallest pair), until
// `max_merges` or no pair occurs twice. Returns the merges in rank order.
std::vector<std::pair<std::string, std::string>> train_merges(size_t max_merges) {
  const ByteAlphabet& ab = byte_alphabet();
  std::map<std::string, int> word_count;
  for (const std::string& w : pre_tokens(kCorpus)) word_count[w]++;
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, n] : word_count) {
    std::vector<std::string> sym;
    for (unsigned char c : w) sym.push_back(ab.of_byte[c]);
    words.emplace_back(std::move(sym), n);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < max_merges) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [sym, n] : words) {
      for (size_t k = 0; k + 1 < sym.size(); ++k) pairs[{sym[k], sym[k + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_n = 1;
    for (const auto& [p, n] : pairs) {
      if (n > best_n) {
        best = &p;
        best_n = n;
      }
    }
    if (best == nullptr) break;
    const auto merge = *best;
    merges.push_back(merge);
    for (auto& [sym, n] : words) {
      std::vector<std::string> next;
      for (size_t k = 0; k < sym.size(); ++k) {
        if (k + 1 < sym.size() && sym[k] == merge.first && sym[k + 1] == merge.second) {
          next.push_back(merge.first + merge.second);
          ++k;
        } else {
          next.push_back(sym[k]);
        }
      }
      sym = std::move(next);
    }
  }
  return merges;
}

// Qwen2/Qwen3's 26 added tokens, in id order (the last 26 ids of its 151669-token
// vocabulary); type 3 = control, 4 = user-defined (as llama.cpp's converter sets them).
struct Special {
  const char* text;
  int32_t type;
};
constexpr Special kSpecials[] = {
    {"<|endoftext|>", 3},
    {"<|im_start|>", 3},
    {"<|im_end|>", 3},
    {"<|object_ref_start|>", 3},
    {"<|object_ref_end|>", 3},
    {"<|box_start|>", 3},
    {"<|box_end|>", 3},
    {"<|quad_start|>", 3},
    {"<|quad_end|>", 3},
    {"<|vision_start|>", 3},
    {"<|vision_end|>", 3},
    {"<|vision_pad|>", 3},
    {"<|image_pad|>", 3},
    {"<|video_pad|>", 3},
    {"<tool_call>", 4},
    {"</tool_call>", 4},
    {"<|fim_prefix|>", 3},
    {"<|fim_middle|>", 3},
    {"<|fim_suffix|>", 3},
    {"<|fim_pad|>", 3},
    {"<|repo_name|>", 3},
    {"<|file_sep|>", 3},
    {"<tool_response>", 4},
    {"</tool_response>", 4},
    {"<think>", 4},
    {"</think>", 4},
};
constexpr uint32_t kNumSpecials = sizeof(kSpecials) / sizeof(kSpecials[0]);

constexpr std::string_view kChatTemplate =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}";

// ---- tensors -----------------------------------------------------------------------------

enum class Kind {
  kMatrix,  // qwen3: approximately normal floats, quantized to the file's type by the reference quantizers
  kLowBit,  // qwen35: drawn as ternary (binary for q1_0) weights with one fp16 scale per 128, then encoded
  kNorm,    // F32, uniform in [lo, hi] (norm weights; qwen35 ssm_dt.bias, ssm_a)
  kDense,   // dense_type (F32 or BF16), approximately normal with entry rms (ssm_conv1d, ssm_alpha/beta)
};

// Gain of lm-head rows of PAD/special tokens and of byte tokens that are not
// printable ASCII: like rarely-seen rows of a trained model they seldom win
// the argmax, so greedy text is readable tokens rather than broken UTF-8.
constexpr float kQuietGain = 0.25f;

// Which token ids get quiet lm-head rows (see kQuietGain).
std::vector<uint8_t> quiet_rows(const std::vector<int32_t>& types) {
  const ByteAlphabet& ab = byte_alphabet();
  std::vector<uint8_t> q(types.size(), 0);
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != 1) {
      q[i] = 1;
    } else if (i < 256) {
      const uint8_t b = ab.byte_of_id[i];
      q[i] = (b >= 0x80 || (b < 0x20 && b != '\n')) ? 1 : 0;
    }
  }
  return q;
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  Kind kind = Kind::kMatrix;
  float rms = 0.0f;            // matrices: entry rms
  float row_spread = 0.0f;     // matrices: log-normal sigma of per-row gain
  float lo = 0.0f, hi = 0.0f;  // norms: uniform range
  // lm head only: quiet[row] != 0 gives the row gain kQuietGain (shared, read-only).
  std::shared_ptr<const std::vector<uint8_t>> quiet;
  core::GgmlType dense_type = core::GgmlType::F32;  // kDense only
  bool foldable = false;  // qwen35: a matrix the Bonsai 2 fold may rotate (prism.hadamard.weight_names)
};

// `quiet`: per token id, 1 for quiet lm-head rows (see quiet_rows).
std::vector<TensorSpec> tensor_list(const Preset& p, std::shared_ptr<const std::vector<uint8_t>> quiet) {
  const int64_t E = p.n_embd, V = p.n_vocab, F = p.n_ff;
  const int64_t q_dim = static_cast<int64_t>(p.n_head) * p.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(p.n_head_kv) * p.head_dim;
  constexpr float kGain = 1.5f;     // each projection: rms-1 in -> rms-1.5 out
  constexpr float kOutGain = 4.0f;  // logits std ~ 4
  constexpr float kRowSpread = 0.35f;
  // Residual branches (attn_output, ffn_down) are 4x louder so the token's own
  // embedding is a small part of the residual stream: with a tied lm head it
  // would otherwise add |e_t|^2 to its own logit and greedy decoding would
  // repeat the current token (the residual stays O(1..5) rms).
  constexpr float kBranch = 4.0f;
  const float sE = 1.0f / std::sqrt(static_cast<float>(E));
  auto mat = [](std::string n, int64_t cols, int64_t rows, float rms, float spread = 0.0f) {
    return TensorSpec{
        .name = std::move(n), .ne = {cols, rows}, .kind = Kind::kMatrix, .rms = rms, .row_spread = spread};
  };
  auto norm = [](std::string n, int64_t len, float lo, float hi) {
    return TensorSpec{.name = std::move(n), .ne = {len}, .kind = Kind::kNorm, .lo = lo, .hi = hi};
  };
  std::vector<TensorSpec> t;
  t.push_back(p.tied ? mat("token_embd.weight", E, V, kOutGain * sE, kRowSpread)
                     : mat("token_embd.weight", E, V, 1.0f));
  if (p.tied) t.back().quiet = quiet;
  t.push_back(norm("output_norm.weight", E, 0.9f, 1.1f));
  if (!p.tied) {
    t.push_back(mat("output.weight", E, V, kOutGain * sE, kRowSpread));
    t.back().quiet = quiet;
  }
  for (uint32_t i = 0; i < p.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    t.push_back(norm(b + "attn_norm.weight", E, 0.9f, 1.1f));
    t.push_back(mat(b + "attn_q.weight", E, q_dim, kGain * sE));
    t.push_back(mat(b + "attn_k.weight", E, kv_dim, kGain * sE));
    t.push_back(mat(b + "attn_v.weight", E, kv_dim, kGain * sE));
    t.push_back(mat(b + "attn_output.weight", q_dim, E, kBranch * kGain / std::sqrt(static_cast<float>(q_dim))));
    t.push_back(norm(b + "attn_q_norm.weight", p.head_dim, 0.8f, 1.8f));
    t.push_back(norm(b + "attn_k_norm.weight", p.head_dim, 0.8f, 1.8f));
    t.push_back(norm(b + "ffn_norm.weight", E, 0.9f, 1.1f));
    t.push_back(mat(b + "ffn_gate.weight", E, F, kGain * sE));
    t.push_back(mat(b + "ffn_up.weight", E, F, kGain * sE));
    t.push_back(mat(b + "ffn_down.weight", F, E, kBranch * kGain / std::sqrt(static_cast<float>(F))));
  }
  return t;
}

// True when layer `il` of a qwen35 model is full attention (llama.cpp's
// rule: every full_attention_interval-th layer, counting from 1).
bool is_full_attention(const Preset& p, uint32_t il) { return (il + 1) % p.full_attn_interval == 0; }

// The qwen35 tensors in make_qwen35_gguf.py's order: token_embd, output_norm,
// output, then per layer attn_norm, the mixer (Gated DeltaNet or gated full
// attention), post_attention_norm and the SwiGLU FFN. Shapes in ne order
// ([row length, rows]); the fixtures README lists them. Entry rms: 2/sqrt(in)
// per projection (1x on the residual branches ssm_out, attn_output,
// ffn_down), 4/sqrt(E) for the lm head with log-normal row gains and quiet
// rows (`quiet`, see kQuietGain), 1 for the (untied) embedding.
std::vector<TensorSpec> qwen35_tensor_list(const Preset& p, std::shared_ptr<const std::vector<uint8_t>> quiet) {
  const int64_t E = p.n_embd, V = p.n_vocab, F = p.n_ff, D = p.head_dim;
  const int64_t q_dim = static_cast<int64_t>(p.n_head) * D;                     // attention output width
  const int64_t kv_dim = static_cast<int64_t>(p.n_head_kv) * D;                 // attn_k / attn_v rows
  const int64_t key_dim = static_cast<int64_t>(p.ssm_state) * p.ssm_groups;     // GDN q and k channels
  const int64_t value_dim = static_cast<int64_t>(p.ssm_state) * p.ssm_v_heads;  // GDN v channels = inner_size
  const int64_t conv_dim = 2 * key_dim + value_dim;                             // attn_qkv rows
  constexpr float kGain = 2.0f, kOutGain = 4.0f, kRowSpread = 0.35f;
  auto inv_sqrt = [](int64_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); };
  auto mat = [](std::string n, int64_t cols, int64_t rows, float rms) {
    return TensorSpec{.name = std::move(n), .ne = {cols, rows}, .kind = Kind::kLowBit, .rms = rms, .foldable = true};
  };
  auto uni = [](std::string n, int64_t len, float lo, float hi) {
    return TensorSpec{.name = std::move(n), .ne = {len}, .kind = Kind::kNorm, .lo = lo, .hi = hi};
  };
  auto dense = [](std::string n, int64_t cols, int64_t rows, float rms, core::GgmlType type) {
    return TensorSpec{.name = std::move(n), .ne = {cols, rows}, .kind = Kind::kDense, .rms = rms, .dense_type = type};
  };
  std::vector<TensorSpec> t;
  t.push_back(mat("token_embd.weight", E, V, 1.0f));
  t.back().foldable = false;  // inverse_weight_names, not weight_names
  t.push_back(uni("output_norm.weight", E, 0.9f, 1.1f));
  t.push_back(mat("output.weight", E, V, kOutGain * inv_sqrt(E)));
  t.back().row_spread = kRowSpread;
  t.back().quiet = std::move(quiet);
  for (uint32_t il = 0; il < p.n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    t.push_back(uni(b + "attn_norm.weight", E, 0.9f, 1.1f));
    if (!is_full_attention(p, il)) {
      t.push_back(mat(b + "attn_qkv.weight", E, conv_dim, kGain * inv_sqrt(E)));
      t.push_back(mat(b + "attn_gate.weight", E, value_dim, kGain * inv_sqrt(E)));
      t.push_back(dense(b + "ssm_conv1d.weight", p.ssm_conv, conv_dim, 0.5f, core::GgmlType::F32));
      t.push_back(uni(b + "ssm_dt.bias", p.ssm_v_heads, -0.5f, 0.5f));
      t.push_back(uni(b + "ssm_a", p.ssm_v_heads, -1.0f, -0.1f));  // stored negative: decay exp(a * softplus(.))
      t.push_back(dense(b + "ssm_beta.weight", E, p.ssm_v_heads, 1.5f * inv_sqrt(E), core::GgmlType::BF16));
      t.push_back(dense(b + "ssm_alpha.weight", E, p.ssm_v_heads, 1.5f * inv_sqrt(E), core::GgmlType::BF16));
      t.push_back(uni(b + "ssm_norm.weight", p.ssm_state, 0.9f, 1.1f));
      t.push_back(mat(b + "ssm_out.weight", value_dim, E, kGain * inv_sqrt(value_dim)));
    } else {
      // attn_q rows: per head its query (D rows) then its output gate (D rows).
      t.push_back(mat(b + "attn_q.weight", E, 2 * q_dim, kGain * inv_sqrt(E)));
      t.push_back(mat(b + "attn_k.weight", E, kv_dim, kGain * inv_sqrt(E)));
      t.push_back(mat(b + "attn_v.weight", E, kv_dim, kGain * inv_sqrt(E)));
      t.push_back(mat(b + "attn_output.weight", q_dim, E, kGain * inv_sqrt(q_dim)));
      t.push_back(uni(b + "attn_q_norm.weight", D, 0.8f, 1.8f));
      t.push_back(uni(b + "attn_k_norm.weight", D, 0.8f, 1.8f));
    }
    t.push_back(uni(b + "post_attention_norm.weight", E, 0.9f, 1.1f));
    t.push_back(mat(b + "ffn_gate.weight", E, F, kGain * inv_sqrt(E)));
    t.push_back(mat(b + "ffn_up.weight", E, F, kGain * inv_sqrt(E)));
    t.push_back(mat(b + "ffn_down.weight", F, E, kGain * inv_sqrt(F)));
  }
  return t;
}

core::GgmlType ggml_type(WeightType t) {
  switch (t) {
    case WeightType::kQ1_0:
      return core::GgmlType::Q1_0;
    case WeightType::kQ2_0:
      return core::GgmlType::Q2_0;
    case WeightType::kF16:
      return core::GgmlType::F16;
    case WeightType::kPQ2_0:
      return core::GgmlType::PQ2_0;
    case WeightType::kPTQ1_0:
      return core::GgmlType::PTQ1_0;
  }
  return core::GgmlType::F16;
}

// Writes the fp16 bits `d` little-endian at `dst`.
void put_fp16(uint8_t* dst, uint16_t d) {
  dst[0] = static_cast<uint8_t>(d & 0xff);
  dst[1] = static_cast<uint8_t>(d >> 8);
}

// Ternary digit (0, 1, 2 = -1, 0, +1) of a uniform random byte: 255 maps to
// 1 so the three values are within 1/256 of equally likely.
constexpr std::array<uint8_t, 256> kTritOfByte = [] {
  std::array<uint8_t, 256> t{};
  for (int r = 0; r < 256; ++r) t[static_cast<size_t>(r)] = static_cast<uint8_t>(r < 255 ? r % 3 : 1);
  return t;
}();

// Writes one 128-weight group of weights w[j] * d (w in {-1, 0, +1}, or
// {-1, +1} for Q1_0) in `type`'s layout at `dst`: Q1_0 one 18-byte block
// (bit j%8 of byte j/8 set = +d); Q2_0 two 18-byte g64 blocks sharing d
// (code w + 1 at bits 2*(j%4) of byte j/4); PQ2_0 one 34-byte block (the
// same codes over 128); PTQ1_0 one 28-byte block (kernels::encode_ptq1_0);
// F16 128 values. Layouts: ../shared/fixtures/README.md "Weight formats".
void encode_group(WeightType type, const int8_t* w, uint16_t d, uint8_t* dst) {
  auto put_codes = [](const int8_t* w, int n, uint8_t* qs) {
    for (int j = 0; j < n; j += 4) {
      qs[j / 4] = static_cast<uint8_t>((w[j] + 1) | (w[j + 1] + 1) << 2 | (w[j + 2] + 1) << 4 | (w[j + 3] + 1) << 6);
    }
  };
  switch (type) {
    case WeightType::kQ1_0:
      put_fp16(dst, d);
      for (int j = 0; j < 128; j += 8) {
        uint8_t byte = 0;
        for (int k = 0; k < 8; ++k) byte |= static_cast<uint8_t>((w[j + k] > 0 ? 1 : 0) << k);
        dst[2 + j / 8] = byte;
      }
      break;
    case WeightType::kQ2_0:
      put_fp16(dst, d);
      put_codes(w, 64, dst + 2);
      put_fp16(dst + 18, d);
      put_codes(w + 64, 64, dst + 20);
      break;
    case WeightType::kPQ2_0:
      put_fp16(dst, d);
      put_codes(w, 128, dst + 2);
      break;
    case WeightType::kPTQ1_0:
      kernels::encode_ptq1_0(w, d, dst);
      break;
    case WeightType::kF16: {
      const float df = core::fp16_to_fp32(d);
      for (int j = 0; j < 128; ++j) put_fp16(dst + 2 * j, core::fp32_to_fp16(df * static_cast<float>(w[j])));
      break;
    }
  }
}

// Fills a kLowBit matrix: per row (own stream, as in generate) a gain
// (log-normal spread, quiet rows), then per 128-group a scale d = base *
// gain * U(0.5, 1.5) rounded to fp16 and 128 ternary digits (8 per draw) or
// signs (64 per draw; Q1_0). base makes the entry rms spec.rms: E[d^2] =
// base^2 * 13/12, E[w^2] = 2/3 (ternary) or 1 (binary). The draws do not
// depend on the type except Q1_0's, so every ternary type holds one model.
void generate_low_bit(const TensorSpec& spec, WeightType type, uint64_t tseed, std::span<uint8_t> out) {
  const int64_t cols = spec.ne[0], rows = spec.ne[1], groups = cols / 128;
  const size_t row_bytes = out.size() / static_cast<size_t>(rows);
  const size_t group_bytes = row_bytes / static_cast<size_t>(groups);
  const bool binary = type == WeightType::kQ1_0;
  const float base = spec.rms / std::sqrt((13.0f / 12.0f) * (binary ? 1.0f : 2.0f / 3.0f));
  core::global_pool().parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        int8_t w[128];
        for (int64_t r = begin; r < end; ++r) {
          uint64_t rs = tseed ^ (static_cast<uint64_t>(r) * 0xd1b54a32d192ed03ull);
          Rng rng(splitmix64(rs));
          float gain = spec.row_spread > 0.0f ? std::exp(spec.row_spread * rng.normal()) : 1.0f;
          if (spec.quiet && (*spec.quiet)[static_cast<size_t>(r)] != 0) gain *= kQuietGain;
          uint8_t* dst = out.data() + static_cast<size_t>(r) * row_bytes;
          for (int64_t g = 0; g < groups; ++g) {
            const uint16_t d = core::fp32_to_fp16(base * gain * (0.5f + rng.uniform()));
            if (binary) {
              for (int k = 0; k < 2; ++k) {
                const uint64_t bits = rng.next();
                for (int j = 0; j < 64; ++j) w[64 * k + j] = ((bits >> j) & 1) != 0 ? 1 : -1;
              }
            } else {
              for (int k = 0; k < 16; ++k) {
                const uint64_t bytes = rng.next();
                for (int j = 0; j < 8; ++j) {
                  w[8 * k + j] = static_cast<int8_t>(kTritOfByte[(bytes >> (8 * j)) & 0xff] - 1);
                }
              }
            }
            encode_group(type, w, d, dst + static_cast<size_t>(g) * group_bytes);
          }
        }
      },
      16);
}

// Fills a kDense tensor (F32 or BF16; BF16 rounds to nearest even) with
// approximately normal values of entry rms spec.rms from one stream.
void generate_dense(const TensorSpec& spec, uint64_t tseed, std::span<uint8_t> out) {
  Rng rng(tseed);
  const bool bf16 = spec.dense_type == core::GgmlType::BF16;
  const size_t n = out.size() / (bf16 ? 2 : 4);
  for (size_t i = 0; i < n; ++i) {
    const float v = spec.rms * rng.normal();
    if (bf16) {
      put_fp16(out.data() + 2 * i, core::fp32_to_bf16(v));  // the same little-endian 16-bit store
    } else {
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  }
}

// Fills `out` (the tensor's bytes). kMatrix rows are independent: row r draws
// from its own stream seeded by (tensor seed, r), so rows are generated in
// parallel on the process pool and the bytes do not depend on the thread count.
void generate(const TensorSpec& spec, WeightType type, uint64_t seed, std::span<uint8_t> out) {
  const uint64_t tseed = tensor_seed(seed, spec.name);
  if (spec.kind == Kind::kNorm) {
    Rng rng(tseed);
    for (int64_t i = 0; i < spec.ne[0]; ++i) {
      const float v = spec.lo + (spec.hi - spec.lo) * rng.uniform();
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
    return;
  }
  if (spec.kind == Kind::kDense) return generate_dense(spec, tseed, out);
  if (spec.kind == Kind::kLowBit) return generate_low_bit(spec, type, tseed, out);
  const int64_t cols = spec.ne[0], rows = spec.ne[1];
  const size_t row_bytes = out.size() / static_cast<size_t>(rows);
  core::global_pool().parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = begin; r < end; ++r) {
          uint64_t rs = tseed ^ (static_cast<uint64_t>(r) * 0xd1b54a32d192ed03ull);
          Rng rng(splitmix64(rs));
          float gain = spec.row_spread > 0.0f ? std::exp(spec.row_spread * rng.normal()) : 1.0f;
          if (spec.quiet && (*spec.quiet)[static_cast<size_t>(r)] != 0) gain *= kQuietGain;
          const float s = spec.rms * gain;
          for (float& x : row) x = s * rng.normal();
          uint8_t* dst = out.data() + static_cast<size_t>(r) * row_bytes;
          switch (type) {
            case WeightType::kQ1_0:
              kernels::quantize_row_q1_0(row.data(), dst, cols);
              break;
            case WeightType::kQ2_0:
              kernels::quantize_row_q2_0(row.data(), dst, cols);
              break;
            case WeightType::kF16:
              for (int64_t c = 0; c < cols; ++c) {
                const uint16_t h = core::fp32_to_fp16(row[static_cast<size_t>(c)]);
                std::memcpy(dst + 2 * c, &h, 2);
              }
              break;
            case WeightType::kPQ2_0:
            case WeightType::kPTQ1_0:
              break;  // qwen35 only (kLowBit): build() refuses them for qwen3
          }
        }
      },
      16);
}

}  // namespace

std::optional<Arch> parse_arch(std::string_view name) {
  if (name == "qwen3") return Arch::kQwen3;
  if (name == "qwen35") return Arch::kQwen35;
  return std::nullopt;
}

std::string_view arch_name(Arch a) { return a == Arch::kQwen35 ? "qwen35" : "qwen3"; }

namespace {

// qwen35 presets. tiny: the fixtures' shape (../shared/fixtures/README.md
// "Shape"); 27b: PrismML's 27B (make_qwen35_gguf.py's recipe in
// ../shared/tools/README.md: Qwen3's vocabulary padded to 248320). Both:
// context 262144, rope base 1e7, full attention every 4th layer.
core::Expected<Preset> qwen35_preset(std::string_view name) {
  Preset p;
  p.name = std::string(name);
  p.arch = Arch::kQwen35;
  p.n_ctx = 262144, p.tied = false, p.rope_base = 1e7f, p.rms_eps = 1e-6f;
  p.full_attn_interval = 4, p.ssm_conv = 4;
  if (name == "tiny") {
    p.n_embd = 128, p.n_layer = 4, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 64, p.n_ff = 384;
    p.n_rot = 16, p.rope_sections = {3, 3, 2, 0};
    p.ssm_state = 32, p.ssm_groups = 4, p.ssm_v_heads = 8;
    p.n_vocab = 8128, p.first_special = 8094, p.hadamard_block = 64;
  } else if (name == "27b") {
    p.n_embd = 5120, p.n_layer = 64, p.n_head = 24, p.n_head_kv = 4, p.head_dim = 256, p.n_ff = 17408;
    p.n_rot = 64, p.rope_sections = {11, 11, 10, 0};
    p.ssm_state = 128, p.ssm_groups = 16, p.ssm_v_heads = 48;
    p.n_vocab = 248320, p.first_special = 151643, p.hadamard_block = 1024;
  } else {
    return core::fail(core::Errc::kInvalidArgument,
                      "unknown preset '" + std::string(name) + "' for --arch qwen35 (expected tiny or 27b)");
  }
  return p;
}

}  // namespace

core::Expected<Preset> preset(std::string_view name, Arch arch) {
  if (arch == Arch::kQwen35) return qwen35_preset(name);
  Preset p;
  p.name = std::string(name);
  if (name == "tiny") {
    p.n_embd = 256, p.n_layer = 2, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 64, p.n_ff = 768;
    p.n_vocab = 2048, p.n_ctx = 4096, p.tied = true;
  } else if (name == "1.7b") {
    p.n_embd = 2048, p.n_layer = 28, p.n_head = 16, p.n_head_kv = 8, p.head_dim = 128, p.n_ff = 6144;
    p.n_vocab = 151669, p.n_ctx = 32768, p.tied = true;
  } else if (name == "4b") {
    p.n_embd = 2560, p.n_layer = 36, p.n_head = 32, p.n_head_kv = 8, p.head_dim = 128, p.n_ff = 9728;
    p.n_vocab = 151669, p.n_ctx = 32768, p.tied = true;
  } else if (name == "8b") {
    p.n_embd = 4096, p.n_layer = 36, p.n_head = 32, p.n_head_kv = 8, p.head_dim = 128, p.n_ff = 12288;
    p.n_vocab = 151669, p.n_ctx = 65536, p.tied = false;
    p.yarn_factor = 4.0f, p.yarn_original_ctx = 16384;
  } else {
    return core::fail(core::Errc::kInvalidArgument,
                      "unknown preset '" + std::string(name) + "' (expected tiny, 1.7b, 4b or 8b)");
  }
  return p;
}

std::optional<WeightType> parse_weight_type(std::string_view name) {
  if (name == "q1_0") return WeightType::kQ1_0;
  if (name == "q2_0") return WeightType::kQ2_0;
  if (name == "f16") return WeightType::kF16;
  if (name == "pq2_0") return WeightType::kPQ2_0;
  if (name == "ptq1_0") return WeightType::kPTQ1_0;
  return std::nullopt;
}

std::string_view weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::kQ1_0:
      return "q1_0";
    case WeightType::kQ2_0:
      return "q2_0";
    case WeightType::kF16:
      return "f16";
    case WeightType::kPQ2_0:
      return "pq2_0";
    case WeightType::kPTQ1_0:
      return "ptq1_0";
  }
  return "?";
}

std::string_view chat_template() { return kChatTemplate; }

core::Expected<Vocab> build_vocab(uint32_t n_vocab, uint32_t first_special) {
  const ByteAlphabet& ab = byte_alphabet();
  if (n_vocab < 256 + kNumSpecials) {
    return core::fail(core::Errc::kInvalidArgument, "synth: vocabulary of " + std::to_string(n_vocab) +
                                                        " is too small (needs at least " +
                                                        std::to_string(256 + kNumSpecials) + ")");
  }
  if (first_special == 0) first_special = n_vocab - kNumSpecials;
  if (first_special < 256 || first_special > n_vocab - kNumSpecials) {
    return core::fail(core::Errc::kInvalidArgument, "synth: first special token id " + std::to_string(first_special) +
                                                        " must be in [256, " + std::to_string(n_vocab - kNumSpecials) +
                                                        "] for a vocabulary of " + std::to_string(n_vocab));
  }
  Vocab v;
  v.tokens = ab.tokens_in_id_order;
  v.types.assign(v.tokens.size(), 1);
  const size_t max_merges = std::min<size_t>(first_special - 256, 4000);
  std::map<std::string, bool> have;
  for (const auto& t : v.tokens) have[t] = true;
  for (const auto& [a, b] : train_merges(max_merges)) {
    v.merges.push_back(a + " " + b);
    if (!have[a + b]) {
      have[a + b] = true;
      v.tokens.push_back(a + b);
      v.types.push_back(1);
    }
  }
  auto pad_to = [&v](uint32_t n) {
    for (uint32_t id = static_cast<uint32_t>(v.tokens.size()); id < n; ++id) {
      v.tokens.push_back("[PAD" + std::to_string(id) + "]");
      v.types.push_back(5);
    }
  };
  pad_to(first_special);
  for (const Special& s : kSpecials) {
    v.tokens.emplace_back(s.text);
    v.types.push_back(s.type);
  }
  pad_to(n_vocab);
  v.bos_id = first_special;      // <|endoftext|>
  v.eos_id = first_special + 2;  // <|im_end|>
  return v;
}

namespace {

// The type a tensor is stored in: the options' type for matrices, its own for the rest.
core::GgmlType stored_type(const TensorSpec& spec, WeightType type) {
  switch (spec.kind) {
    case Kind::kMatrix:
    case Kind::kLowBit:
      return ggml_type(type);
    case Kind::kNorm:
      return core::GgmlType::F32;
    case Kind::kDense:
      return spec.dense_type;
  }
  return core::GgmlType::F32;
}

// The tokenizer.* keys of `vocab` (moved from) with pre-tokenizer `pre`.
void set_tokenizer_keys(gguf::Writer& w, Vocab vocab, std::string_view pre) {
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", std::string(pre));
  w.set_string_array("tokenizer.ggml.tokens", std::move(vocab.tokens));
  w.set_i32_array("tokenizer.ggml.token_type", std::move(vocab.types));
  w.set_string_array("tokenizer.ggml.merges", std::move(vocab.merges));
  w.set_u32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  w.set_u32("tokenizer.ggml.padding_token_id", vocab.bos_id);
  w.set_u32("tokenizer.ggml.bos_token_id", vocab.bos_id);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string("tokenizer.chat_template", std::string(kChatTemplate));
}

// Adds every tensor of `specs` to `w` with data generated at write time
// (streaming), reporting progress through o.on_progress: bytes generated so
// far over the sum of every tensor's bytes.
core::Expected<void> add_tensors(gguf::Writer& w, std::vector<TensorSpec> specs, const Options& o) {
  struct Counter {
    uint64_t done = 0;
    uint64_t total = 0;
    std::function<void(uint64_t, uint64_t)> report;
  };
  auto counter = std::make_shared<Counter>();
  counter->report = o.on_progress;
  for (const TensorSpec& spec : specs) {
    const auto traits = core::ggml_type_traits(static_cast<uint32_t>(stored_type(spec, o.type)));
    int64_t n = 1;
    for (int64_t d : spec.ne) n *= d;
    if (traits) counter->total += static_cast<uint64_t>(n) / traits->block_size * traits->type_size;
  }
  for (TensorSpec& spec : specs) {
    const core::GgmlType t = stored_type(spec, o.type);
    auto shared = std::make_shared<TensorSpec>(std::move(spec));
    const WeightType wt = o.type;
    const uint64_t seed = o.seed;
    auto r = w.add_tensor_generated(shared->name, t, shared->ne, [shared, wt, seed, counter](std::span<uint8_t> out) {
      generate(*shared, wt, seed, out);
      counter->done += out.size();
      if (counter->report) counter->report(counter->done, counter->total);
    });
    if (!r) return std::unexpected(r.error());
  }
  return {};
}

// llama_ftype "mostly X" (general.file_type) as make_qwen3_gguf.py /
// make_qwen35_gguf.py write it; 142 for PTQ1_0 is the fixtures' guess.
uint32_t file_type(WeightType t) {
  switch (t) {
    case WeightType::kQ1_0:
      return 40;
    case WeightType::kQ2_0:
      return 41;
    case WeightType::kF16:
      return 1;
    case WeightType::kPQ2_0:
      return 141;
    case WeightType::kPTQ1_0:
      return 142;
  }
  return 1;
}

core::Expected<gguf::Writer> build_qwen3(const Options& o) {
  const Preset& p = o.preset;
  if (o.type == WeightType::kPQ2_0 || o.type == WeightType::kPTQ1_0) {
    return core::fail(core::Errc::kInvalidArgument, "synth: --type " + std::string(weight_type_name(o.type)) +
                                                        " is for --arch qwen35 (qwen3 takes q1_0, q2_0 or f16)");
  }
  if (o.hadamard) {
    return core::fail(core::Errc::kInvalidArgument, "synth: --hadamard is for --arch qwen35");
  }
  const int64_t block = o.type == WeightType::kQ1_0 ? 128 : o.type == WeightType::kQ2_0 ? 64 : 1;
  const int64_t q_dim = static_cast<int64_t>(p.n_head) * p.head_dim;
  for (int64_t cols : {static_cast<int64_t>(p.n_embd), static_cast<int64_t>(p.n_ff), q_dim}) {
    if (cols <= 0 || cols % block != 0) {
      return core::fail(core::Errc::kInvalidArgument, "synth: row length " + std::to_string(cols) +
                                                          " is not a multiple of the " +
                                                          std::string(weight_type_name(o.type)) + " block size");
    }
  }
  if (p.n_head_kv == 0 || p.n_head % p.n_head_kv != 0) {
    return core::fail(core::Errc::kInvalidArgument, "synth: n_head must be a multiple of n_head_kv");
  }
  auto vocab = build_vocab(p.n_vocab);
  if (!vocab) return std::unexpected(vocab.error());
  auto quiet = std::make_shared<const std::vector<uint8_t>>(quiet_rows(vocab->types));

  gguf::Writer w;
  const std::string arch = "qwen3";
  w.set_string("general.architecture", arch);
  w.set_string("general.type", "model");
  w.set_string("general.name", "bonsai-synth-" + p.name + "-" + std::string(weight_type_name(o.type)));
  w.set_string("general.description", "synthetic random-weight Qwen3 model (bonsai synth --preset " + p.name +
                                          " --type " + std::string(weight_type_name(o.type)) + " --seed " +
                                          std::to_string(o.seed) + ")");
  w.set_u32(arch + ".block_count", p.n_layer);
  w.set_u32(arch + ".context_length", p.n_ctx);
  w.set_u32(arch + ".embedding_length", p.n_embd);
  w.set_u32(arch + ".feed_forward_length", p.n_ff);
  w.set_u32(arch + ".attention.head_count", p.n_head);
  w.set_u32(arch + ".attention.head_count_kv", p.n_head_kv);
  w.set_f32(arch + ".rope.freq_base", p.rope_base);
  w.set_f32(arch + ".attention.layer_norm_rms_epsilon", p.rms_eps);
  w.set_u32(arch + ".attention.key_length", p.head_dim);
  w.set_u32(arch + ".attention.value_length", p.head_dim);
  if (p.yarn_factor > 0.0f) {
    w.set_string(arch + ".rope.scaling.type", "yarn");
    w.set_f32(arch + ".rope.scaling.factor", p.yarn_factor);
    w.set_u32(arch + ".rope.scaling.original_context_length", p.yarn_original_ctx);
  }
  w.set_u32("general.file_type", file_type(o.type));
  if (o.type != WeightType::kF16) w.set_u32("general.quantization_version", 2);
  set_tokenizer_keys(w, std::move(*vocab), "qwen2");
  if (auto r = add_tensors(w, tensor_list(p, quiet), o); !r) return std::unexpected(r.error());
  return w;
}

// The `prism.hadamard.*` keys of a Bonsai 2 file (../shared/fixtures/README.md
// "The Bonsai 2 Hadamard fold"): version 1, block p.hadamard_block, explicit
// signs, one random +-1 vector per distinct input width of the listed
// matrices and token_embd (sorted widths; vector of width n from the stream
// of "prism.hadamard.signs.<n>"), weight_names = every foldable matrix in
// tensor order. Errors: kInvalidArgument when a width is not a multiple of
// the block.
core::Expected<void> set_hadamard_keys(gguf::Writer& w, const std::vector<TensorSpec>& specs, const Preset& p,
                                       uint64_t seed) {
  const int64_t block = p.hadamard_block;
  std::vector<std::string> names;
  std::set<int64_t> widths;
  for (const TensorSpec& t : specs) {
    if (t.foldable) names.push_back(t.name);
    if (t.foldable || t.name == "token_embd.weight") widths.insert(t.ne[0]);
  }
  std::vector<int32_t> sign_widths, sign_values;
  for (int64_t width : widths) {
    if (block <= 0 || width % block != 0) {
      return core::fail(core::Errc::kInvalidArgument, "synth: input width " + std::to_string(width) +
                                                          " is not a multiple of the Hadamard block " +
                                                          std::to_string(block));
    }
    sign_widths.push_back(static_cast<int32_t>(width));
    Rng rng(tensor_seed(seed, "prism.hadamard.signs." + std::to_string(width)));
    uint64_t bits = 0;
    for (int64_t i = 0; i < width; ++i) {
      if (i % 64 == 0) bits = rng.next();
      sign_values.push_back(((bits >> (i % 64)) & 1) != 0 ? 1 : -1);
    }
  }
  w.set_u32("prism.hadamard.version", 1);
  w.set_u32("prism.hadamard.block_size", static_cast<uint32_t>(block));
  w.set_string("prism.hadamard.transform", "normalized-sylvester-walsh-hadamard");
  w.set_string("prism.hadamard.axis", "input-last-dimension");
  w.set_string("prism.hadamard.sign_mode", "explicit");
  w.set_i32_array("prism.hadamard.sign_widths", std::move(sign_widths));
  w.set_i32_array("prism.hadamard.sign_values", std::move(sign_values));
  w.set_string_array("prism.hadamard.weight_names", std::move(names));
  w.set_string_array("prism.hadamard.inverse_weight_names", {"token_embd.weight"});
  w.set_bool("prism.hadamard.gdn_v_grouped", true);
  return {};
}

core::Expected<gguf::Writer> build_qwen35(const Options& o) {
  const Preset& p = o.preset;
  auto invalid = [](const std::string& what) { return core::fail(core::Errc::kInvalidArgument, "synth: " + what); };
  const int64_t q_dim = static_cast<int64_t>(p.n_head) * p.head_dim;
  const int64_t value_dim = static_cast<int64_t>(p.ssm_state) * p.ssm_v_heads;
  // Every type is written in 128-weight groups (kLowBit), f16 included.
  for (int64_t cols : {static_cast<int64_t>(p.n_embd), static_cast<int64_t>(p.n_ff), q_dim, value_dim}) {
    if (cols <= 0 || cols % 128 != 0) {
      return invalid("row length " + std::to_string(cols) + " is not a multiple of 128 (the qwen35 weight group)");
    }
  }
  if (p.n_head_kv == 0 || p.n_head % p.n_head_kv != 0) return invalid("n_head must be a multiple of n_head_kv");
  if (p.ssm_groups == 0 || p.ssm_v_heads % p.ssm_groups != 0) {
    return invalid("ssm.time_step_rank must be a multiple of ssm.group_count");
  }
  if (p.full_attn_interval == 0 || p.ssm_conv == 0) {
    return invalid("full_attention_interval and ssm.conv_kernel must be > 0");
  }
  if (p.n_rot == 0 || p.n_rot % 2 != 0 || p.n_rot > p.head_dim) {
    return invalid("rope.dimension_count must be even and in [2, head_dim]");
  }
  const bool ternary = o.type == WeightType::kQ2_0 || o.type == WeightType::kPQ2_0 || o.type == WeightType::kPTQ1_0;
  if (o.hadamard && !ternary) {
    return invalid("--hadamard needs a ternary --type (q2_0, pq2_0 or ptq1_0), as Bonsai 2 files are");
  }
  auto vocab = build_vocab(p.n_vocab, p.first_special);
  if (!vocab) return std::unexpected(vocab.error());
  auto quiet = std::make_shared<const std::vector<uint8_t>>(quiet_rows(vocab->types));
  std::vector<TensorSpec> specs = qwen35_tensor_list(p, quiet);

  gguf::Writer w;
  const std::string arch = "qwen35";
  const std::string type_name(weight_type_name(o.type));
  const std::string suffix = o.hadamard ? "-bonsai2" : "";
  w.set_string("general.architecture", arch);
  w.set_string("general.type", "model");
  w.set_string("general.name", "bonsai-synth-qwen35-" + p.name + suffix + "-" + type_name);
  w.set_string("general.description",
               "synthetic random-weight Qwen3.5 (qwen35) model (bonsai synth --arch qwen35 "
               "--preset " +
                   p.name + " --type " + type_name + " --seed " + std::to_string(o.seed) +
                   (o.hadamard ? " --hadamard" : "") + ")");
  w.set_u32(arch + ".block_count", p.n_layer);
  w.set_u32(arch + ".context_length", p.n_ctx);
  w.set_u32(arch + ".embedding_length", p.n_embd);
  w.set_u32(arch + ".feed_forward_length", p.n_ff);
  w.set_u32(arch + ".attention.head_count", p.n_head);
  w.set_u32(arch + ".attention.head_count_kv", p.n_head_kv);
  w.set_u32(arch + ".attention.key_length", p.head_dim);
  w.set_u32(arch + ".attention.value_length", p.head_dim);
  w.set_f32(arch + ".attention.layer_norm_rms_epsilon", p.rms_eps);
  w.set_f32(arch + ".rope.freq_base", p.rope_base);
  w.set_u32(arch + ".rope.dimension_count", p.n_rot);
  w.set_i32_array(arch + ".rope.dimension_sections", {p.rope_sections.begin(), p.rope_sections.end()});
  w.set_u32(arch + ".full_attention_interval", p.full_attn_interval);
  w.set_u32(arch + ".ssm.conv_kernel", p.ssm_conv);
  w.set_u32(arch + ".ssm.state_size", p.ssm_state);
  w.set_u32(arch + ".ssm.group_count", p.ssm_groups);
  w.set_u32(arch + ".ssm.time_step_rank", p.ssm_v_heads);
  w.set_u32(arch + ".ssm.inner_size", static_cast<uint32_t>(value_dim));
  w.set_u32("general.file_type", file_type(o.type));
  if (o.type != WeightType::kF16) w.set_u32("general.quantization_version", 2);
  if (o.hadamard) {
    if (auto r = set_hadamard_keys(w, specs, p, o.seed); !r) return std::unexpected(r.error());
  }
  set_tokenizer_keys(w, std::move(*vocab), "qwen35");
  if (auto r = add_tensors(w, std::move(specs), o); !r) return std::unexpected(r.error());
  return w;
}

}  // namespace

core::Expected<gguf::Writer> build(const Options& o) {
  return o.preset.arch == Arch::kQwen35 ? build_qwen35(o) : build_qwen3(o);
}

core::Expected<void> write_model(const std::string& path, const Options& options) {
  auto w = build(options);
  if (!w) return std::unexpected(w.error());
  return w->write(path);
}

core::Expected<std::string> ensure_default_model() {
  namespace fs = std::filesystem;
  fs::path dir;
  if (const char* e = std::getenv("BONSAI_CACHE_DIR"); e != nullptr && *e != '\0') {
    dir = e;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    dir = fs::path(x) / "bonsai";
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = fs::path(h) / ".cache" / "bonsai";
  } else {
    return core::fail(core::Errc::kIo, "no cache directory: set BONSAI_CACHE_DIR, XDG_CACHE_HOME or HOME");
  }
  // The name carries the generator version so a changed synth writes a new file.
  const fs::path path = dir / "bonsai-synth-tiny-q1_0-seed1-v5.gguf";
  std::error_code ec;
  if (fs::exists(path, ec) && gguf::File::open(path.string())) return path.string();
  fs::create_directories(dir, ec);
  if (ec) return core::fail(core::Errc::kIo, dir.string() + ": cannot create cache directory: " + ec.message());
  Options o;
  auto p = preset("tiny");
  if (!p) return std::unexpected(p.error());
  o.preset = *p;
  const fs::path tmp = dir / (path.filename().string() + ".tmp." + std::to_string(::getpid()));
  if (auto r = write_model(tmp.string(), o); !r) return std::unexpected(r.error());
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    return core::fail(core::Errc::kIo, path.string() + ": cannot move the written model into place: " + why);
  }
  return path.string();
}

}  // namespace bonsai::synth
