// Synthetic Qwen3 GGUF writer (see synth.h). Weights: every tensor has its own
// xoshiro256** stream seeded from (seed, tensor name), so a tensor's bytes do
// not depend on the order of tensors. Matrices are drawn row by row as
// approximately normal values (Irwin–Hall, 4 uniforms) with entry rms
// gain/sqrt(row length) so each projection maps rms-1 inputs to rms-`gain`
// outputs (activations stay O(1) after every RMSNorm); the lm head gets
// log-normal per-row gains so some tokens are consistently louder and the
// argmax is clear. Each row has its own stream (tensor seed, row index), so
// rows are generated in parallel. Rows are then quantized with the kernels' reference
// quantizers (Q1_0 / Q2_0) or rounded to fp16.
#include "apps/bonsai/synth.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <utility>

#include "core/fp16.h"
#include "core/thread_pool.h"
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

enum class Kind { kMatrix, kNorm };

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

core::GgmlType ggml_type(WeightType t) {
  switch (t) {
    case WeightType::kQ1_0:
      return core::GgmlType::Q1_0;
    case WeightType::kQ2_0:
      return core::GgmlType::Q2_0;
    case WeightType::kF16:
      return core::GgmlType::F16;
  }
  return core::GgmlType::F16;
}

// Fills `out` (the tensor's bytes). Matrix rows are independent: row r draws
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
          }
        }
      },
      16);
}

}  // namespace

core::Expected<Preset> preset(std::string_view name) {
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
  }
  return "?";
}

std::string_view chat_template() { return kChatTemplate; }

core::Expected<Vocab> build_vocab(uint32_t n_vocab) {
  const ByteAlphabet& ab = byte_alphabet();
  if (n_vocab < 256 + kNumSpecials) {
    return core::fail(core::Errc::kInvalidArgument, "synth: vocabulary of " + std::to_string(n_vocab) +
                                                        " is too small (needs at least " +
                                                        std::to_string(256 + kNumSpecials) + ")");
  }
  Vocab v;
  v.tokens = ab.tokens_in_id_order;
  v.types.assign(v.tokens.size(), 1);
  const size_t max_merges = std::min<size_t>(n_vocab - 256 - kNumSpecials, 4000);
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
  const uint32_t first_special = n_vocab - kNumSpecials;
  for (uint32_t id = static_cast<uint32_t>(v.tokens.size()); id < first_special; ++id) {
    v.tokens.push_back("[PAD" + std::to_string(id) + "]");
    v.types.push_back(5);
  }
  for (const Special& s : kSpecials) {
    v.tokens.emplace_back(s.text);
    v.types.push_back(s.type);
  }
  v.bos_id = first_special;      // <|endoftext|>
  v.eos_id = first_special + 2;  // <|im_end|>
  return v;
}

core::Expected<gguf::Writer> build(const Options& o) {
  const Preset& p = o.preset;
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
  // llama_ftype "mostly X" values as make_qwen3_gguf.py writes them.
  w.set_u32("general.file_type", o.type == WeightType::kQ1_0 ? 40 : o.type == WeightType::kQ2_0 ? 41 : 1);
  if (o.type != WeightType::kF16) w.set_u32("general.quantization_version", 2);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen2");
  w.set_string_array("tokenizer.ggml.tokens", std::move(vocab->tokens));
  w.set_i32_array("tokenizer.ggml.token_type", std::move(vocab->types));
  w.set_string_array("tokenizer.ggml.merges", std::move(vocab->merges));
  w.set_u32("tokenizer.ggml.eos_token_id", vocab->eos_id);
  w.set_u32("tokenizer.ggml.padding_token_id", vocab->bos_id);
  w.set_u32("tokenizer.ggml.bos_token_id", vocab->bos_id);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string("tokenizer.chat_template", std::string(kChatTemplate));

  // Progress: bytes generated so far over the sum of every tensor's bytes.
  struct Counter {
    uint64_t done = 0;
    uint64_t total = 0;
    std::function<void(uint64_t, uint64_t)> report;
  };
  auto counter = std::make_shared<Counter>();
  counter->report = o.on_progress;
  auto specs = tensor_list(p, quiet);
  for (const TensorSpec& spec : specs) {
    const core::GgmlType t = spec.kind == Kind::kNorm ? core::GgmlType::F32 : ggml_type(o.type);
    const auto traits = core::ggml_type_traits(static_cast<uint32_t>(t));
    int64_t n = 1;
    for (int64_t d : spec.ne) n *= d;
    if (traits) counter->total += static_cast<uint64_t>(n) / traits->block_size * traits->type_size;
  }
  for (TensorSpec& spec : specs) {
    const core::GgmlType t = spec.kind == Kind::kNorm ? core::GgmlType::F32 : ggml_type(o.type);
    auto shared = std::make_shared<TensorSpec>(spec);
    const WeightType wt = o.type;
    const uint64_t seed = o.seed;
    auto r = w.add_tensor_generated(spec.name, t, spec.ne, [shared, wt, seed, counter](std::span<uint8_t> out) {
      generate(*shared, wt, seed, out);
      counter->done += out.size();
      if (counter->report) counter->report(counter->done, counter->total);
    });
    if (!r) return std::unexpected(r.error());
  }
  return w;
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
