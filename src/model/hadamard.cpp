// read_hadamard_fold: the checks of ../shared/fixtures/README.md "The Bonsai 2
// Hadamard fold" in the order of its key table (hadamard.h lists them).
#include "model/hadamard.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>

namespace bonsai::model {

namespace {

constexpr std::string_view kPrefix = "prism.hadamard.";
constexpr std::array<std::string_view, 10> kKnownKeys = {
    "version",      "block_size",           "transform",     "axis", "sign_mode", "sign_widths", "sign_values",
    "weight_names", "inverse_weight_names", "gdn_v_grouped",
};
// Matmul weights whose input a fold may rotate (blk.N.<kind>.weight), as
// qwen35_ref.py's loader check: not norms, ssm_conv1d, ssm_alpha/beta, ssm_a,
// ssm_dt nor token_embd.
constexpr std::array<std::string_view, 10> kFoldableKinds = {
    "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_gate", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "ssm_out",
};
constexpr int64_t kMaxBlock = int64_t{1} << 20;

std::string key_of(std::string_view suffix) { return std::string(kPrefix) + std::string(suffix); }

// "output.weight" or "blk.<N>.<foldable kind>.weight".
bool foldable_name(std::string_view n) {
  if (n == "output.weight") return true;
  if (!n.starts_with("blk.") || !n.ends_with(".weight")) return false;
  n.remove_prefix(4);
  n.remove_suffix(7);
  const size_t dot = n.find('.');
  if (dot == 0 || dot == std::string_view::npos) return false;
  if (!std::all_of(n.begin(), n.begin() + static_cast<ptrdiff_t>(dot),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return false;
  return std::find(kFoldableKinds.begin(), kFoldableKinds.end(), n.substr(dot + 1)) != kFoldableKinds.end();
}

class FoldReader {
 public:
  explicit FoldReader(const gguf::File& f) : f_(f) {}

  core::Expected<HadamardFold> read() {
    if (auto r = check_known_keys(); !r) return std::unexpected(r.error());
    if (auto r = read_header(); !r) return std::unexpected(r.error());
    if (auto r = read_signs(); !r) return std::unexpected(r.error());
    if (auto r = read_names("weight_names", /*required=*/true, fold_.weight_names); !r)
      return std::unexpected(r.error());
    if (auto r = read_names("inverse_weight_names", /*required=*/false, fold_.inverse_names); !r)
      return std::unexpected(r.error());
    if (f_.has(key_of("gdn_v_grouped"))) {
      auto g = f_.get<bool>(key_of("gdn_v_grouped"));
      if (!g) return std::unexpected(g.error());
      fold_.gdn_v_grouped = *g;
    }
    return std::move(fold_);
  }

 private:
  std::unexpected<core::Error> bad(std::string_view suffix, const std::string& what) const {
    return core::fail(core::Errc::kFormat, f_.path() + ": key '" + key_of(suffix) + "' " + what);
  }

  core::Expected<void> check_known_keys() const {
    for (const gguf::KeyValue& kv : f_.metadata()) {
      if (!kv.key.starts_with(kPrefix)) continue;
      const std::string_view suffix = kv.key.substr(kPrefix.size());
      if (std::find(kKnownKeys.begin(), kKnownKeys.end(), suffix) == kKnownKeys.end()) {
        return core::fail(core::Errc::kFormat, f_.path() + ": key '" + std::string(kv.key) +
                                                   "' is not a Hadamard fold key this reader knows (fold version 1)");
      }
    }
    return {};
  }

  core::Expected<void> read_header() {
    auto version = f_.get<uint32_t>(key_of("version"));
    if (!version) return std::unexpected(version.error());
    if (*version != 1) return bad("version", "= " + std::to_string(*version) + ": only fold version 1 is supported");
    fold_.version = *version;

    auto block = f_.get<int64_t>(key_of("block_size"));
    if (!block) return std::unexpected(block.error());
    if (*block < 1 || *block > kMaxBlock || !std::has_single_bit(static_cast<uint64_t>(*block))) {
      return bad("block_size", "= " + std::to_string(*block) + ": expected a power of two in 1..2^20");
    }
    fold_.block = *block;

    struct Fixed {
      std::string_view suffix, expected;
    };
    for (const Fixed& k :
         {Fixed{"transform", "normalized-sylvester-walsh-hadamard"}, Fixed{"axis", "input-last-dimension"}}) {
      auto v = f_.get<std::string_view>(key_of(k.suffix));
      if (!v) return std::unexpected(v.error());
      if (*v != k.expected)
        return bad(k.suffix, "= '" + std::string(*v) + "': expected '" + std::string(k.expected) + "'");
    }

    auto mode = f_.get<std::string_view>(key_of("sign_mode"));
    if (!mode) return std::unexpected(mode.error());
    if (*mode == "explicit") {
      fold_.sign_mode = HadamardFold::SignMode::kExplicit;
    } else if (*mode == "identity") {
      fold_.sign_mode = HadamardFold::SignMode::kIdentity;
    } else {
      return bad("sign_mode", "= '" + std::string(*mode) + "': expected 'explicit' or 'identity'");
    }
    return {};
  }

  core::Expected<void> read_signs() {
    const bool has_widths = f_.has(key_of("sign_widths"));
    const bool has_values = f_.has(key_of("sign_values"));
    if (fold_.sign_mode == HadamardFold::SignMode::kIdentity) {
      if (has_widths) return bad("sign_widths", "is present but sign_mode is 'identity' (all signs +1)");
      if (has_values) return bad("sign_values", "is present but sign_mode is 'identity' (all signs +1)");
      return {};
    }
    auto widths = f_.get_i32_array(key_of("sign_widths"));
    if (!widths) return std::unexpected(widths.error());
    auto values = f_.get_i32_array(key_of("sign_values"));
    if (!values) return std::unexpected(values.error());
    if (widths->empty()) return bad("sign_widths", "is empty: expected one width per distinct input width");
    int64_t total = 0;
    for (int32_t w : *widths) {
      if (w <= 0) return bad("sign_widths", "holds " + std::to_string(w) + ": expected positive widths");
      if (w % fold_.block != 0) {
        return bad("block_size", "= " + std::to_string(fold_.block) + " does not divide width " + std::to_string(w) +
                                     " of key '" + key_of("sign_widths") + "'");
      }
      total += w;
    }
    if (static_cast<int64_t>(values->size()) != total) {
      return bad("sign_values", "has " + std::to_string(values->size()) + " values: expected " + std::to_string(total) +
                                    " (the sum of key '" + key_of("sign_widths") + "')");
    }
    for (size_t i = 0; i < values->size(); ++i) {
      const int32_t v = (*values)[i];
      if (v != 1 && v != -1) {
        return bad("sign_values", "[" + std::to_string(i) + "] = " + std::to_string(v) + ": expected +1 or -1");
      }
    }
    size_t at = 0;
    for (int32_t w : *widths) {
      std::vector<float> s(static_cast<size_t>(w));
      for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>((*values)[at + i]);
      at += s.size();
      if (!fold_.signs.emplace(w, std::move(s)).second) {
        return bad("sign_widths", "lists width " + std::to_string(w) + " twice: expected one sign vector per width");
      }
    }
    return {};
  }

  // Checks that tensor `name` (listed in key `suffix`) exists and that its
  // input width ne[0] has a sign vector.
  core::Expected<void> check_width(std::string_view suffix, std::string_view name) const {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (t == nullptr) return bad(suffix, "lists '" + std::string(name) + "', which is not a tensor of the file");
    const int64_t w = t->ne[0];
    if (fold_.sign_mode == HadamardFold::SignMode::kIdentity) {
      if (w % fold_.block != 0) {
        return bad(suffix, "lists '" + std::string(name) + "' of input width " + std::to_string(w) +
                               ", not a multiple of key '" + key_of("block_size") +
                               "' = " + std::to_string(fold_.block));
      }
    } else if (!fold_.signs.contains(w)) {
      return bad(suffix, "lists '" + std::string(name) + "' of input width " + std::to_string(w) +
                             ", which has no sign vector in key '" + key_of("sign_widths") + "'");
    }
    return {};
  }

  core::Expected<void> read_names(std::string_view suffix, bool required, std::set<std::string, std::less<>>& out) {
    if (!required && !f_.has(key_of(suffix))) return {};
    auto names = f_.get_string_array(key_of(suffix));
    if (!names) return std::unexpected(names.error());
    const bool inverse = suffix == "inverse_weight_names";
    for (std::string_view n : *names) {
      if (!out.emplace(n).second) return bad(suffix, "lists '" + std::string(n) + "' twice");
      if (inverse && n != "token_embd.weight") {
        return bad(suffix, "lists '" + std::string(n) + "': only 'token_embd.weight' takes the inverse transform");
      }
      if (!inverse && !foldable_name(n)) {
        return bad(suffix, "lists '" + std::string(n) +
                               "', which cannot be folded: expected output.weight or blk.N.{attn_q,attn_k,attn_v,"
                               "attn_qkv,attn_gate,attn_output,ffn_gate,ffn_up,ffn_down,ssm_out}.weight");
      }
      if (auto r = check_width(suffix, n); !r) return r;
    }
    return {};
  }

  const gguf::File& f_;
  HadamardFold fold_;
};

}  // namespace

core::Expected<std::optional<HadamardFold>> read_hadamard_fold(const gguf::File& file) {
  const bool any = std::any_of(file.metadata().begin(), file.metadata().end(),
                               [](const gguf::KeyValue& kv) { return kv.key.starts_with(kPrefix); });
  if (!any) return std::optional<HadamardFold>{};
  auto fold = FoldReader(file).read();
  if (!fold) return std::unexpected(fold.error());
  return std::optional<HadamardFold>(std::move(*fold));
}

std::string describe(const HadamardFold& fold) {
  std::string s = "block " + std::to_string(fold.block) + ", ";
  if (fold.sign_mode == HadamardFold::SignMode::kIdentity) {
    s += "identity signs";
  } else {
    s += "sign widths [";
    bool first = true;
    for (const auto& [w, v] : fold.signs) {
      s += (first ? "" : ", ") + std::to_string(w);
      first = false;
    }
    s += "]";
  }
  s += ", " + std::to_string(fold.weight_names.size()) + " folded matrices, inverse [";
  bool first = true;
  for (const std::string& n : fold.inverse_names) {
    s += (first ? "" : ", ") + n;
    first = false;
  }
  s += "]";
  if (fold.gdn_v_grouped) s += ", gdn_v_grouped";
  return s;
}

}  // namespace bonsai::model
