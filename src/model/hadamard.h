// The Bonsai 2 Hadamard fold (`prism.hadamard.*` GGUF keys): what the file
// says about its rotated weights, read and validated before any of them is
// used. The definition (keys, transform, fold rules, the malformed variants a
// loader must refuse) is ../shared/fixtures/README.md "The Bonsai 2 Hadamard
// fold"; ../shared/tools/qwen35_ref.py (class Hadamard) is its float64
// reference. The transform itself is kernels::hadamard_rotate /
// hadamard_unrotate (kernels/hadamard.h).
//
// In short: for every matrix W' named in weight_names the runtime computes
// y = W' · T(P(x)) with T(x) = H_B(s ⊙ x) per consecutive B-chunk (H_B the
// normalised Sylvester Walsh-Hadamard matrix, s the sign vector of x's width,
// P the GDN v-head regrouping for ssm_out when gdn_v_grouped); after the
// token_embd lookup (inverse_weight_names) the row z becomes s ⊙ (H_B z).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"  // gguf::File

namespace bonsai::model {

// The validated fold of one file. Value type; owns its data (no views into
// the mapping).
struct HadamardFold {
  // `prism.hadamard.sign_mode`: kExplicit reads one sign vector per input
  // width from sign_widths / sign_values; kIdentity means s = all +1 (and the
  // two sign keys must be absent).
  enum class SignMode : uint8_t { kExplicit, kIdentity };

  uint32_t version = 1;  // prism.hadamard.version (only 1 exists)
  int64_t block = 0;     // B = prism.hadamard.block_size, a power of two
  SignMode sign_mode = SignMode::kExplicit;
  // Input width n -> its sign vector [n] of +1.0f / -1.0f (element i
  // multiplies x_i). Explicit mode only; every width is a multiple of block.
  std::map<int64_t, std::vector<float>> signs;
  // Tensor names whose matmul input is rotated (prism.hadamard.weight_names):
  // each a tensor of the file of a foldable kind (output.weight, blk.N.
  // attn_q/k/v/qkv/gate/output, ffn_gate/up/down, ssm_out) whose input width
  // ne[0] has a sign vector (explicit) or is a multiple of block (identity).
  std::set<std::string, std::less<>> weight_names;
  // Tensor names whose looked-up rows get the inverse (prism.hadamard.
  // inverse_weight_names): empty or {"token_embd.weight"}.
  std::set<std::string, std::less<>> inverse_names;
  // prism.hadamard.gdn_v_grouped (false when absent): ssm_out's input is
  // permuted from llama.cpp's tiled v-head order to the grouped order first.
  bool gdn_v_grouped = false;

  // True when `name`'s matmul input is rotated.
  bool folded(std::string_view name) const { return weight_names.find(name) != weight_names.end(); }
  // True when `name`'s looked-up rows get the inverse transform.
  bool inverted(std::string_view name) const { return inverse_names.find(name) != inverse_names.end(); }
  // The sign vector [width] for inputs of `width`: empty in identity mode
  // (kernels::hadamard_rotate reads an empty span as all +1). Every width of
  // a listed tensor has one (read_hadamard_fold checked); for any other
  // width in explicit mode it is empty too, so callers pass only the widths
  // of listed tensors.
  std::span<const float> signs_for(int64_t width) const {
    auto it = signs.find(width);
    return it == signs.end() ? std::span<const float>{} : std::span<const float>(it->second);
  }
};

// Reads the `prism.hadamard.*` keys of `file`. nullopt when the file has none
// (no fold: weights are used as stored). Otherwise every rule of the README
// is checked, and the first broken one is a kFormat error
// "<path>: key 'prism.hadamard.K' ...: <what was expected>":
//  - version: an integer, = 1; block_size: an integer power of two in
//    1..2^20; transform = "normalized-sylvester-walsh-hadamard"; axis =
//    "input-last-dimension"; sign_mode "explicit" or "identity" (strings);
//    these five are required (missing: kNotFound from gguf::File::get).
//  - explicit: sign_widths (integer array, each > 0, a multiple of
//    block_size, no width twice) and sign_values (integer array of exactly
//    sum(widths) values, each +1 or -1) required; identity: both absent.
//  - weight_names (string array, required): unique, each a tensor of the
//    file, of a foldable kind, whose ne[0] has a sign vector (or is a
//    multiple of block_size in identity mode).
//  - inverse_weight_names (string array, optional): unique, only
//    "token_embd.weight", present in the file, ne[0] with a sign vector.
//  - gdn_v_grouped: a bool when present.
//  - any other `prism.hadamard.*` key is refused (a newer fold this reader
//    does not know must not load as if it were absent).
core::Expected<std::optional<HadamardFold>> read_hadamard_fold(const gguf::File& file);

// One line for `bonsai validate` / logs: "block 64, sign widths [128],
// 26 folded matrices, inverse [token_embd.weight], gdn_v_grouped".
std::string describe(const HadamardFold& fold);

}  // namespace bonsai::model
