// Loading (check_model, Weights) and the forward pass.
//
// The forward pass follows llama.cpp's graphs for qwen3 and llama
// (src/models/qwen3.cpp, src/models/llama.cpp) and reads like llama2.c's
// `forward`: one layer loop, each step commented with its formula.
#include "model/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_set>

#include "core/fp16.h"
#include "core/mapped_file.h"  // MappedFile::release
#include "core/thread_pool.h"
#include "kernels/hadamard.h"  // hadamard_unrotate (Bonsai 2 embedding rows)
#include "kernels/silu.h"      // silu_mul: the SwiGLU gate
#include "model/attention.h"   // attention
#include "model/model_internal.h"

namespace bonsai::model {

namespace {

// ---- Loading -------------------------------------------------------------------

// Checks tensor shapes and types against the config, recording every problem.
class TensorChecker {
 public:
  TensorChecker(const gguf::File& f, std::vector<core::Error>& errors) : f_(f), errors_(errors) {}

  // A weight matrix `rows` x `cols` (GGUF ne = [cols, rows]) in a kernel format.
  std::optional<kernels::MatrixView> matrix(const std::string& name, int64_t rows, int64_t cols) {
    const gguf::TensorInfo* t = find(name);
    if (t == nullptr) return std::nullopt;
    bool ok = true;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
      problem(core::Errc::kFormat, "tensor '" + name + "' has shape " + shape(*t) + ", expected [" +
                                       std::to_string(cols) + ", " + std::to_string(rows) + "]");
      ok = false;
    }
    const auto layout = f_.q2_layout().value_or(core::Q2Layout::kG64);
    const auto fmt = kernels::format_of(t->type, layout);
    if (!fmt) {
      problem(core::Errc::kUnsupported, "tensor '" + name + "' has type " + core::ggml_type_name(t->type_id) +
                                            ", which the kernels cannot compute on");
      return std::nullopt;
    }
    if (t->ne[0] % kernels::block_elems(*fmt) != 0) {
      problem(core::Errc::kFormat, "tensor '" + name + "' row length " + std::to_string(t->ne[0]) +
                                       " is not a multiple of the " + std::string(kernels::format_name(*fmt)) +
                                       " block size " + std::to_string(kernels::block_elems(*fmt)));
      return std::nullopt;
    }
    if (!ok) return std::nullopt;
    const size_t stride = kernels::row_bytes(*fmt, cols);
    if (t->n_bytes < stride * static_cast<uint64_t>(rows)) {
      problem(core::Errc::kFormat, "tensor '" + name + "' holds " + std::to_string(t->n_bytes) + " bytes, expected " +
                                       std::to_string(stride * rows));
      return std::nullopt;
    }
    bytes_ += t->n_bytes;
    return kernels::MatrixView{t->data, *fmt, rows, cols, stride};
  }

  // A norm weight vector of n elements (F32 viewed in place; F16/BF16
  // converted); with n1 > 1 a 2-D [n, n1] table read the same way (n * n1
  // floats, ne[0] fastest).
  std::optional<NormWeight> vector(const std::string& name, int64_t n, int64_t n1 = 1) {
    const gguf::TensorInfo* t = find(name);
    if (t == nullptr) return std::nullopt;
    if (t->ne[0] != n || t->ne[1] != n1 || t->ne[2] != 1 || t->ne[3] != 1) {
      problem(core::Errc::kFormat, "tensor '" + name + "' has shape " + shape(*t) + ", expected [" + std::to_string(n) +
                                       (n1 > 1 ? ", " + std::to_string(n1) : "") + "]");
      return std::nullopt;
    }
    n *= n1;
    NormWeight w;
    if (t->type == core::GgmlType::F32) {
      w.data = reinterpret_cast<const float*>(t->data);
    } else if (t->type == core::GgmlType::F16 || t->type == core::GgmlType::BF16) {
      w.owned.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t->data + 2 * i, 2);
        w.owned[static_cast<size_t>(i)] =
            t->type == core::GgmlType::F16 ? core::fp16_to_fp32(h) : core::bf16_to_fp32(h);
      }
    } else {
      problem(core::Errc::kUnsupported,
              "tensor '" + name + "' has type " + core::ggml_type_name(t->type_id) + ", expected F32, F16 or BF16");
      return std::nullopt;
    }
    bytes_ += t->n_bytes;
    return w;
  }

  uint64_t bytes() const { return bytes_; }
  // Whether `name` is one of the tensors the model looked up.
  bool used(std::string_view name) const { return used_.contains(std::string(name)); }

 private:
  const gguf::TensorInfo* find(const std::string& name) {
    used_.insert(name);
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (t == nullptr) problem(core::Errc::kNotFound, "missing tensor '" + name + "'");
    return t;
  }
  static std::string shape(const gguf::TensorInfo& t) {
    std::string s = "[";
    for (uint32_t d = 0; d < std::max<uint32_t>(1, t.n_dims); ++d) {
      if (d) s += ", ";
      s += std::to_string(t.ne[d]);
    }
    return s + "]";
  }
  void problem(core::Errc code, std::string msg) { errors_.push_back({code, f_.path() + ": " + msg}); }

  const gguf::File& f_;
  std::vector<core::Error>& errors_;
  uint64_t bytes_ = 0;
  std::unordered_set<std::string> used_;  // every tensor name looked up
};

// Builds the weight views for a config; every problem is appended to errors.
Weights build_weights(const gguf::File& f, const ModelConfig& c, std::vector<core::Error>& errors,
                      uint64_t& weight_bytes) {
  TensorChecker tc(f, errors);
  Weights w;
  auto fix_norm = [](std::optional<NormWeight>&& n) {
    NormWeight out = n ? std::move(*n) : NormWeight{};
    if (!out.owned.empty()) out.data = out.owned.data();
    return out;
  };
  const auto embd = tc.matrix("token_embd.weight", c.n_vocab, c.n_embd);
  if (embd) w.token_embd = *embd;
  w.output_norm = fix_norm(tc.vector("output_norm.weight", c.n_embd));
  if (c.tied_output) {
    w.output = w.token_embd;
  } else if (const auto out = tc.matrix("output.weight", c.n_vocab, c.n_embd)) {
    w.output = *out;
  }
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    auto mat = [&](const char* name, int64_t rows, int64_t cols) {
      return tc.matrix(p + name, rows, cols).value_or(kernels::MatrixView{});
    };
    L.attn_norm = fix_norm(tc.vector(p + "attn_norm.weight", c.n_embd));
    if (c.is_recurrent(l)) {
      GdnWeights& G = L.gdn;
      G.w_qkv = mat("attn_qkv.weight", c.ssm_conv_dim(), c.n_embd);
      G.w_z = mat("attn_gate.weight", c.ssm_v_dim(), c.n_embd);
      G.w_beta = mat("ssm_beta.weight", c.ssm_n_v_heads, c.n_embd);
      G.w_alpha = mat("ssm_alpha.weight", c.ssm_n_v_heads, c.n_embd);
      G.conv = fix_norm(tc.vector(p + "ssm_conv1d.weight", c.ssm_conv_kernel, c.ssm_conv_dim()));
      G.dt_bias = fix_norm(tc.vector(p + "ssm_dt.bias", c.ssm_n_v_heads));
      G.a = fix_norm(tc.vector(p + "ssm_a", c.ssm_n_v_heads));
      G.norm = fix_norm(tc.vector(p + "ssm_norm.weight", c.ssm_head_dim));
      G.w_out = mat("ssm_out.weight", c.n_embd, c.ssm_v_dim());
    } else {
      L.wq = mat("attn_q.weight", c.attn_output_gate ? 2 * c.q_dim() : c.q_dim(), c.n_embd);
      L.wk = mat("attn_k.weight", c.k_dim(), c.n_embd);
      L.wv = mat("attn_v.weight", c.v_dim(), c.n_embd);
      if (c.qk_norm) {
        L.q_norm = fix_norm(tc.vector(p + "attn_q_norm.weight", c.head_dim_k));
        L.k_norm = fix_norm(tc.vector(p + "attn_k_norm.weight", c.head_dim_k));
      }
      L.wo = mat("attn_output.weight", c.n_embd, c.attn_out_dim());
    }
    L.ffn_norm =
        fix_norm(tc.vector(p + (c.arch == Arch::kQwen35 ? "post_attention_norm.weight" : "ffn_norm.weight"), c.n_embd));
    L.w_gate = mat("ffn_gate.weight", c.n_ff, c.n_embd);
    L.w_up = mat("ffn_up.weight", c.n_ff, c.n_embd);
    L.w_down = mat("ffn_down.weight", c.n_embd, c.n_ff);
  }
  weight_bytes = tc.bytes();
  // Tensors the model would silently ignore mean the metadata does not
  // describe the file (e.g. block_count 1 on a 2-layer file: llama.cpp refuses
  // it as "wrong number of tensors"); one problem naming the first few.
  std::vector<std::string_view> unused;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (!tc.used(t.name)) unused.push_back(t.name);
  }
  if (!unused.empty()) {
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 4; ++i) {
      names += i ? ", '" : "'";
      names += unused[i];
      names += '\'';
    }
    if (unused.size() > 4) names += ", ...";
    errors.push_back({core::Errc::kFormat, f.path() + ": " + std::to_string(unused.size()) + " tensor" +
                                               (unused.size() == 1 ? " is" : "s are") + " not part of a " +
                                               std::to_string(c.n_layer) + "-layer " + c.arch_name + " model (check '" +
                                               c.arch_name + ".block_count'): " + names});
  }
  return w;
}

// The Bonsai 2 Hadamard fold (model/hadamard.h), when the file has
// prism.hadamard.* keys: validated, then recorded as the FoldBit of every
// listed matrix. Only qwen35's graph is defined with it (README "The Bonsai 2
// Hadamard fold"); on another architecture it is refused rather than ignored.
void read_fold(const gguf::File& f, const ModelConfig& c, Weights& w, std::vector<core::Error>& errors) {
  auto fold = read_hadamard_fold(f);
  if (!fold) {
    errors.push_back(fold.error());
    return;
  }
  if (!*fold) return;
  if (c.arch != Arch::kQwen35) {
    errors.push_back({core::Errc::kUnsupported, f.path() +
                                                    ": prism.hadamard.* keys (the Bonsai 2 fold) are only "
                                                    "supported on qwen35 models, not " +
                                                    c.arch_name});
    return;
  }
  static constexpr std::pair<const char*, FoldBit> kKinds[] = {
      {"attn_q.weight", kFoldQ},       {"attn_k.weight", kFoldK},      {"attn_v.weight", kFoldV},
      {"attn_output.weight", kFoldO},  {"ffn_gate.weight", kFoldGate}, {"ffn_up.weight", kFoldUp},
      {"ffn_down.weight", kFoldDown},  {"attn_qkv.weight", kFoldQkv},  {"attn_gate.weight", kFoldZ},
      {"ssm_out.weight", kFoldSsmOut},
  };
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (const auto& [kind, bit] : kKinds) {
      if ((*fold)->folded(p + kind)) w.layers[l].folded |= bit;
    }
  }
  // Matrices that read the same activation are rotated together (it is
  // transformed once for all of them): a fold covering part of such a group
  // is refused rather than computed two ways.
  static constexpr std::pair<uint32_t, const char*> kGroups[] = {
      {kFoldQ | kFoldK | kFoldV, "attn_q, attn_k and attn_v"},
      {kFoldGate | kFoldUp, "ffn_gate and ffn_up"},
      {kFoldQkv | kFoldZ, "attn_qkv and attn_gate"},
  };
  for (size_t l = 0; l < w.layers.size(); ++l) {
    for (const auto& [bits, names] : kGroups) {
      const uint32_t have = w.layers[l].folded & bits;
      // A group bit with no tensor on this layer (GDN vs attention) never gets set.
      const uint32_t present = c.is_recurrent(static_cast<int64_t>(l)) ? (bits & ~(kFoldQ | kFoldK | kFoldV))
                                                                       : (bits & ~(kFoldQkv | kFoldZ));
      if (have != 0 && have != present) {
        errors.push_back({core::Errc::kUnsupported, f.path() + ": prism.hadamard.weight_names folds only some of blk." +
                                                        std::to_string(l) + "'s " + names +
                                                        ", which read the same input (fold all or none)"});
      }
    }
  }
  w.output_folded = (*fold)->folded("output.weight");
  w.embd_inverted = (*fold)->inverted("token_embd.weight");
  if (c.tied_output && (w.output_folded != w.embd_inverted)) {
    // One tied matrix cannot be both rotated and not (the fold's version 2
    // tied case is refused by read_hadamard_fold already).
    errors.push_back({core::Errc::kFormat, f.path() + ": prism.hadamard.* folds only one use of the tied "
                                                      "token_embd.weight (output and embedding must agree)"});
  }
  w.fold = std::move(**fold);
}

// Config + weights, collecting every problem.
struct Checked {
  ModelConfig config;
  Weights weights;
  uint64_t weight_bytes = 0;
  std::vector<core::Error> errors;
};

Checked check_all(const gguf::File& f) {
  Checked r;
  r.config = parse_config(f, r.errors);
  // Shapes need the config's sizes; skip them when the sizes themselves are unknown.
  const ModelConfig& c = r.config;
  if (c.n_layer > 0 && c.n_embd > 0 && c.n_head > 0 && c.n_head_kv > 0 && c.head_dim_k > 0 && c.head_dim_v > 0 &&
      c.n_ff > 0 && c.n_vocab > 0) {
    // A block count far beyond what the tensor table could hold is one
    // problem, not millions of "missing tensor" lines (or a huge allocation).
    const uint64_t max_layers = std::max<uint64_t>(256, f.tensors().size());
    if (static_cast<uint64_t>(c.n_layer) > max_layers) {
      r.errors.push_back({core::Errc::kFormat,
                          f.path() + ": key '" + c.arch_name + ".block_count' = " + std::to_string(c.n_layer) +
                              " is more than the file's " + std::to_string(f.tensors().size()) + " tensors can hold"});
    } else {
      r.weights = build_weights(f, c, r.errors, r.weight_bytes);
      read_fold(f, c, r.weights, r.errors);
    }
  }
  return r;
}

// ---- Forward-pass building blocks (single token, single thread) -----------------

// Rotates the first n_rot dims of one head by the cached angles.
//   kNorm: pairs (x[2i], x[2i+1]);  kNeox: pairs (x[i], x[i + n_rot/2]).
//   (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)
void apply_rope(RopeType type, const float* cs, int64_t n_rot, float* x) {
  const int64_t half = n_rot / 2;
  const float* cos_t = cs;
  const float* sin_t = cs + half;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = type == RopeType::kNeox ? i : 2 * i;
    const int64_t b = type == RopeType::kNeox ? i + half : 2 * i + 1;
    const float x0 = x[a];
    const float x1 = x[b];
    x[a] = x0 * cos_t[i] - x1 * sin_t[i];
    x[b] = x0 * sin_t[i] + x1 * cos_t[i];
  }
}

// Writes n floats as one cache row of type t (f16: round to nearest even;
// q8_0: ggml's quantize_row_q8_0; f32: as is).
void store_kv_row(KvType t, const float* src, uint8_t* dst, int64_t n) {
  switch (t) {
    case KvType::kF16:
      kernels::f32_to_f16_row(src, reinterpret_cast<uint16_t*>(dst), n);
      break;
    case KvType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      break;
    case KvType::kQ8_0:
      kernels::quantize_row_q8_0(src, dst, n);
      break;
  }
}

constexpr int64_t kFusedMaxTokens = 16;  // largest batch whose attention rides the QKV dispatch

}  // namespace

// ---- Shared forward helpers (model_internal.h) ------------------------------------

// y = x / sqrt(mean(x^2) + eps) * w   (RMSNorm, Zhang & Sennrich 2019; ggml_rms_norm
// sums in double). x and y may alias.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void rms_norm_rows(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps,
                   core::ThreadPool& pool) {
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) rms_norm(x + i * dim, w, y + i * dim, dim, eps);
      },
      kTokChunk);
}

// Y[n][rows] = X[n][cols] W^T: GEMV for one token (decode), GEMM for several
// (prefill). The activations are quantized into `act` (the Workspace's).
void matmul(const kernels::MatrixView& w, const float* x, int64_t n, float* y, core::ThreadPool& pool,
            kernels::ActScratch& act) {
  if (n == 1) {
    kernels::gemv(w, x, y, &pool, &act);
  } else {
    kernels::gemm(w, x, n, y, &pool, &act);
  }
}

// ---- RoPE angles (model_internal.h) ----------------------------------------------

// The cos/sin of every rotated pair at position `pos` (ggml_rope_cache_init):
// theta_i = pos * base^(-2i/n_rot), optionally scaled (linear: theta * freq_scale;
// YaRN: ramp between interpolated and extrapolated theta over the correction
// dims, magnitude scaled by mscale = attn_factor * (1 + 0.1 ln(1/freq_scale))).
// out: [n_rot/2] cos then [n_rot/2] sin.
void rope_angles(const ModelConfig& c, const float corr_dims[2], int32_t pos, float* out) {
  const int64_t half = c.n_rot / 2;
  const float theta_scale = std::pow(c.rope_freq_base, -2.0f / static_cast<float>(c.n_rot));
  const float freq_scale = c.rope_scaling == RopeScaling::kNone ? 1.0f : 1.0f / c.rope_scaling_factor;
  float theta_extrap = static_cast<float>(pos);
  for (int64_t i = 0; i < half; ++i) {
    const float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp;
    float mscale = c.yarn_attn_factor;
    if (c.yarn_ext_factor != 0.0f) {
      // rope_yarn_ramp: 1 - clamp((i0/2 - low) / max(0.001, high - low), 0, 1)
      const float y = (static_cast<float>(i) - corr_dims[0]) / std::max(0.001f, corr_dims[1] - corr_dims[0]);
      const float ramp_mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * c.yarn_ext_factor;
      theta = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / freq_scale);
    }
    out[i] = std::cos(theta) * mscale;
    out[half + i] = std::sin(theta) * mscale;
    theta_extrap *= theta_scale;
  }
}

// YaRN correction dims (ggml_rope_yarn_corr_dims): the rotary dims whose
// wavelength crosses beta_fast / beta_slow rotations over the original context.
void yarn_corr_dims(const ModelConfig& c, float dims[2]) {
  auto corr_dim = [&](float n_rot) {
    return static_cast<float>(c.n_rot) *
           std::log(static_cast<float>(c.rope_orig_ctx) / (n_rot * 2.0f * static_cast<float>(M_PI))) /
           (2.0f * std::log(c.rope_freq_base));
  };
  const float start = std::floor(corr_dim(c.yarn_beta_fast));
  const float end = std::ceil(corr_dim(c.yarn_beta_slow));
  dims[0] = std::max(0.0f, start);
  dims[1] = std::min(static_cast<float>(c.n_rot - 1), end);
}

// ---- Public: loading ---------------------------------------------------------------

std::vector<std::string> check_model(const gguf::File& file) {
  std::vector<std::string> out;
  for (const auto& e : check_all(file).errors) out.push_back(e.message);
  return out;
}

core::Expected<std::shared_ptr<const Model>> Model::load(const std::string& path, const LoadOptions& options) {
  auto file = gguf::File::open(path, options.file);
  if (!file) return std::unexpected(file.error());
  return from_file(std::move(*file), options.repack);
}

std::string describe(const RepackStats& st) {
  std::string transcoded;  // "402 PTQ1_0 tensors transcoded to PQ2_0 (4704.0 -> 5712.0 MiB)"
  if (st.transcoded > 0) {
    char t[160];
    std::snprintf(t, sizeof t, "%d PTQ1_0 tensors transcoded to PQ2_0 (%.1f -> %.1f MiB)", st.transcoded,
                  static_cast<double>(st.transcoded_from_bytes) / (1 << 20),
                  static_cast<double>(st.transcoded_from_bytes) * 34.0 / 28.0 / (1 << 20));
    transcoded = t;
  }
  if (st.packing == kernels::Packing::kNone || st.tensors == 0) {
    if (st.transcoded == 0) return "weights not repacked (zero-copy)";
    char b[320];
    std::snprintf(b, sizeof b, "%s in %.0f ms on %d thread%s, %.1f MiB of mapped pages released", transcoded.c_str(),
                  st.seconds * 1e3, st.threads, st.threads == 1 ? "" : "s",
                  static_cast<double>(st.released_bytes) / (1 << 20));
    return b;
  }
  std::string layouts;  // "169 tile16, 28 avx512-row-quad", or the one layout's name
  int kinds = 0;
  for (size_t i = 1; i < st.by_packing.size(); ++i) kinds += st.by_packing[i] > 0 ? 1 : 0;
  for (size_t i = 1; i < st.by_packing.size(); ++i) {
    if (st.by_packing[i] == 0) continue;
    const std::string name(kernels::packing_name(static_cast<kernels::Packing>(i)));
    layouts += (layouts.empty() ? "" : ", ") + (kinds > 1 ? std::to_string(st.by_packing[i]) + " " + name : name);
  }
  char buf[320];
  const double mib = static_cast<double>(st.bytes) / (1 << 20);
  std::snprintf(
      buf, sizeof buf,
      "%s%srepacked %d tensors (%s), %.1f MiB in %.0f ms on %d thread%s (%.2f s/GB), %.1f MiB of mapped pages "
      "released",
      transcoded.c_str(), transcoded.empty() ? "" : "; ", st.tensors, layouts.c_str(), mib, st.seconds * 1e3,
      st.threads, st.threads == 1 ? "" : "s", st.bytes > 0 ? st.seconds / (static_cast<double>(st.bytes) / 1e9) : 0.0,
      static_cast<double>(st.released_bytes) / (1 << 20));
  return buf;
}

core::Expected<void> Model::repack_weights() {
  // The products' matrices; token_embd stays in its stored layout (rows are
  // dequantized on lookup; when tied, `output` is repacked and the few
  // looked-up rows fault back in from the file).
  std::vector<kernels::MatrixView*> mats;
  for (LayerWeights& L : weights_.layers) {
    for (kernels::MatrixView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.gdn.w_qkv, &L.gdn.w_z,
                                   &L.gdn.w_beta, &L.gdn.w_alpha, &L.gdn.w_out}) {
      if (m->data != nullptr) mats.push_back(m);
    }
  }
  mats.push_back(&weights_.output);
  // A job either packs a matrix into another layout of its format, or
  // transcodes it into another format the tier computes faster
  // (kernels::transcode_target: PTQ1_0 -> PQ2_0 on AVX2, and on AVX-512
  // where the matrix is not packed as its PQ2_0 twin's row quads instead);
  // a transcoded matrix is not packed further.
  struct Job {
    kernels::MatrixView* m;
    kernels::Packing p;
    size_t offset;
    kernels::Format to;  // == m->format: pack; else transcode into `to`
  };
  std::vector<Job> jobs;
  size_t total = 0;
  for (kernels::MatrixView* m : mats) {
    const kernels::Format to = kernels::transcode_target(*m);
    if (to != m->format) {
      jobs.push_back({m, kernels::Packing::kNone, total, to});
      total += (static_cast<size_t>(m->rows) * kernels::row_bytes(to, m->cols) + 63) / 64 * 64;
      continue;
    }
    const kernels::Packing p = kernels::packing_for(*m);
    if (p == kernels::Packing::kNone) continue;
    jobs.push_back({m, p, total, m->format});
    total += (kernels::packed_bytes(*m, p) + 63) / 64 * 64;
  }
  if (jobs.empty()) return {};
  const auto t0 = std::chrono::steady_clock::now();
  // Anonymous memory, huge-page advised (the packed streams then cost one
  // TLB entry per 2 MiB); unmapped when the last owner of the model drops it.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t mapped = (total + kHuge - 1) / kHuge * kHuge;
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return core::fail(core::Errc::kResourceExhausted, file_->path() + ": cannot map " + std::to_string(mapped >> 20) +
                                                          " MiB for the repacked weights (use --no-repack)");
  }
#ifdef MADV_HUGEPAGE
  if (mapped >= (size_t{64} << 20)) ::madvise(base, mapped, MADV_HUGEPAGE);  // (a small model: 4 KiB pages, no waste)
#endif
  packed_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(base), [mapped](uint8_t* p) { ::munmap(p, mapped); });
  core::ThreadPool& pool = core::global_pool();
  RepackStats st;
  st.threads = pool.size();
  for (const Job& j : jobs) {
    uint8_t* dst = packed_.get() + j.offset;
    if (j.to != j.m->format) {
      kernels::transcode_ptq1_0_to_pq2_0(*j.m, dst, &pool);
      const size_t stride = kernels::row_bytes(j.to, j.m->cols);
      st.released_bytes += file_->release(j.m->data, static_cast<size_t>(j.m->rows) * j.m->row_stride);
      st.transcoded_from_bytes += static_cast<uint64_t>(j.m->rows) * j.m->row_stride;
      j.m->data = dst;
      j.m->format = j.to;
      j.m->row_stride = stride;
      st.bytes += static_cast<uint64_t>(j.m->rows) * stride;
      ++st.transcoded;
      continue;
    }
    kernels::pack_matrix(*j.m, j.p, dst, &pool);
    st.released_bytes += file_->release(j.m->data, static_cast<size_t>(j.m->rows) * j.m->row_stride);
    j.m->packed = dst;
    j.m->packing = j.p;
    if (st.packing == kernels::Packing::kNone) st.packing = j.p;
    if (static_cast<size_t>(j.p) < st.by_packing.size()) ++st.by_packing[static_cast<size_t>(j.p)];
    st.bytes += kernels::packed_bytes(*j.m, j.p);
    ++st.tensors;
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  repack_stats_ = st;
  return {};
}

core::Expected<std::shared_ptr<const Model>> Model::from_file(std::shared_ptr<const gguf::File> file, bool repack) {
  if (!file) return core::fail(core::Errc::kInvalidArgument, "Model::from_file: null file");
  Checked r = check_all(*file);
  if (!r.errors.empty()) return std::unexpected(join_errors(r.errors));
  std::shared_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  m->config_ = std::move(r.config);
  m->weights_ = std::move(r.weights);
  m->weight_bytes_ = r.weight_bytes;
  // NormWeight::data may point into `owned`, which a vector move keeps in place.
  if (repack) {
    if (auto ok = m->repack_weights(); !ok) return std::unexpected(ok.error());
  }
  return std::shared_ptr<const Model>(std::move(m));
}

size_t Workspace::bytes() const {
  size_t n = 0;
  for (const auto* v : {&x_,   &xb_, &q_,     &k_,   &v_,    &att_, &proj_, &gate_,  &up_,    &rope_, &out_,
                        &rot_, &qg_, &agate_, &qkv_, &conv_, &z_,   &beta_, &alpha_, &ssm_o_, &ones_}) {
    n += v->capacity() * sizeof(float);
  }
  for (const auto& t : seq_tokens_) n += t.capacity() * sizeof(int32_t);
  n += seq_order_.capacity() * sizeof(int32_t) + seq_first_.capacity() * sizeof(int64_t);
  return n + seq_next_.capacity() * sizeof(int64_t) + act_.bytes();
}

// ---- Public: the forward pass -------------------------------------------------------

core::Expected<void> Model::forward(const Batch& batch, std::span<KvCache* const> caches, Workspace& ws,
                                    std::span<float> logits, core::ThreadPool& pool) const {
  return forward_impl(batch, caches, ws, logits, {}, pool, /*as_hidden=*/false);
}

core::Expected<void> Model::forward(const Batch& batch, std::span<KvCache* const> caches, Workspace& ws,
                                    std::span<float> logits, std::span<float> hidden, core::ThreadPool& pool) const {
  return forward_impl(batch, caches, ws, logits, hidden, pool, /*as_hidden=*/false);
}

core::Expected<void> Model::forward_hidden(const Batch& batch, std::span<KvCache* const> caches, Workspace& ws,
                                           std::span<float> hidden, core::ThreadPool& pool) const {
  return forward_impl(batch, caches, ws, hidden, {}, pool, /*as_hidden=*/true);
}

core::Expected<void> Model::forward_impl(const Batch& batch, std::span<KvCache* const> caches, Workspace& ws,
                                         std::span<float> logits, std::span<float> hidden_rows, core::ThreadPool& pool,
                                         bool hidden) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t n_wanted = static_cast<int64_t>(batch.n_wanted());
  const int64_t n_hidden = static_cast<int64_t>(batch.n_hidden());
  const int64_t row = hidden ? c.n_embd : c.n_vocab;  // floats per output row

  // ---- Validate everything before touching any state. ----
  if (n == 0) return core::fail(core::Errc::kInvalidArgument, "forward: empty batch");
  if (static_cast<uint64_t>(logits.size()) < static_cast<uint64_t>(n_wanted) * row) {
    return core::fail(core::Errc::kInvalidArgument, std::string("forward: ") + (hidden ? "hidden" : "logits") +
                                                        " span holds " + std::to_string(logits.size()) +
                                                        " floats, need " + std::to_string(n_wanted) + " x " +
                                                        std::to_string(row));
  }
  if (static_cast<uint64_t>(hidden_rows.size()) < static_cast<uint64_t>(n_hidden) * c.n_embd) {
    return core::fail(core::Errc::kInvalidArgument, "forward: hidden span holds " + std::to_string(hidden_rows.size()) +
                                                        " floats, need " + std::to_string(n_hidden) + " x " +
                                                        std::to_string(c.n_embd));
  }
  ws.seq_next_.assign(caches.size(), -1);
  ws.seq_first_.assign(caches.size(), -1);  // next expected position per sequence (-1: none yet)
  for (int64_t i = 0; i < n; ++i) {
    const BatchToken& t = batch.tokens[static_cast<size_t>(i)];
    auto where = [i] { return "forward: batch token " + std::to_string(i) + ": "; };  // built on error only
    if (t.token < 0 || t.token >= c.n_vocab) {
      return core::fail(core::Errc::kInvalidArgument, where() + "token id " + std::to_string(t.token) +
                                                          " outside [0, " + std::to_string(c.n_vocab) + ")");
    }
    if (t.seq < 0 || static_cast<size_t>(t.seq) >= caches.size() || caches[t.seq] == nullptr) {
      return core::fail(core::Errc::kInvalidArgument, where() + "sequence id " + std::to_string(t.seq) +
                                                          " has no KV cache (" + std::to_string(caches.size()) +
                                                          " given)");
    }
    const KvCache& kv = *caches[t.seq];
    if (!kv.matches(c)) {
      return core::fail(core::Errc::kInvalidArgument,
                        where() + "the KV cache of sequence " + std::to_string(t.seq) + " was made for another model");
    }
    int64_t& next = ws.seq_next_[static_cast<size_t>(t.seq)];
    if (next < 0) {
      if (t.pos < 0 || t.pos > kv.size()) {
        return core::fail(core::Errc::kInvalidArgument,
                          where() + "position " + std::to_string(t.pos) + " of sequence " + std::to_string(t.seq) +
                              " leaves a gap: its cache holds " + std::to_string(kv.size()) + " positions");
      }
      for (size_t s = 0; s < caches.size(); ++s) {  // one cache per sequence
        if (s != static_cast<size_t>(t.seq) && caches[s] == &kv && ws.seq_next_[s] >= 0) {
          return core::fail(core::Errc::kInvalidArgument, where() + "sequences " + std::to_string(s) + " and " +
                                                              std::to_string(t.seq) + " share one KV cache");
        }
      }
    } else if (t.pos != next) {
      return core::fail(core::Errc::kInvalidArgument, where() + "position " + std::to_string(t.pos) + " of sequence " +
                                                          std::to_string(t.seq) + " should be " + std::to_string(next) +
                                                          " (positions must be consecutive)");
    }
    if (next < 0 && kv.recurrent() && t.pos != 0 && kv.resumable(t.pos) != t.pos) {
      return core::fail(core::Errc::kInvalidArgument, where() + "position " + std::to_string(t.pos) + " of sequence " +
                                                          std::to_string(t.seq) +
                                                          ": a recurrent state continues only at its end (" +
                                                          std::to_string(kv.resumable(t.pos)) + ") or restarts at 0");
    }
    if (t.pos >= kv.n_ctx()) {
      return core::fail(core::Errc::kOutOfRange, where() + "position " + std::to_string(t.pos) +
                                                     " is beyond the context size " + std::to_string(kv.n_ctx()));
    }
    if (next < 0) ws.seq_first_[static_cast<size_t>(t.seq)] = t.pos;
    next = t.pos + 1;
  }
  // Attach (and un-share) the KV blocks the batch writes; sizes unchanged.
  for (size_t s = 0; s < caches.size(); ++s) {
    if (ws.seq_next_[s] < 0) continue;
    if (auto ok = caches[s]->prepare(ws.seq_first_[s], ws.seq_next_[s]); !ok) {
      return core::fail(ok.error().code, "forward: sequence " + std::to_string(s) + ": " + ok.error().message);
    }
  }
  // Recurrent states (qwen35): allocated on first use, zeroed for a sequence
  // that starts at position 0.
  for (size_t s = 0; s < caches.size(); ++s) {
    if (ws.seq_next_[s] < 0) continue;
    if (auto ok = caches[s]->begin_recurrent(ws.seq_first_[s]); !ok) {
      return core::fail(ok.error().code, "forward: sequence " + std::to_string(s) + ": " + ok.error().message);
    }
  }

  // ---- Run, in slices of at most kMaxUbatch tokens. ----
  const std::span<const BatchToken> all(batch.tokens);
  float* out_logits = logits.data();
  float* out_hidden = hidden_rows.data();
  for (int64_t b0 = 0; b0 < n; b0 += kMaxUbatch) {
    const auto slice = all.subspan(static_cast<size_t>(b0), static_cast<size_t>(std::min(kMaxUbatch, n - b0)));
    run_ubatch(slice, caches, ws, out_logits, out_hidden, pool, hidden);
    for (const auto& t : slice) {
      out_logits += t.logits ? row : 0;
      out_hidden += t.hidden ? c.n_embd : 0;
    }
  }

  // Each sequence's cache now ends after its last token in this batch.
  for (size_t s = 0; s < caches.size(); ++s) {
    if (ws.seq_next_[s] >= 0) caches[s]->set_size(ws.seq_next_[s]);
  }
  return {};
}

void Model::run_ubatch(std::span<const BatchToken> tok, std::span<KvCache* const> caches, Workspace& ws, float* logits,
                       float* hidden_rows, core::ThreadPool& pool, bool hidden) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tok.size());
  int64_t n_wanted = 0;
  for (const auto& t : tok) n_wanted += t.logits ? 1 : 0;

  // ---- Scratch: activations are row-major [n tokens][dim]. ----
  const int64_t E = c.n_embd;
  grow(ws.x_, n * E);
  grow(ws.xb_, n * E);
  grow(ws.q_, n * c.q_dim());
  grow(ws.k_, n * c.k_dim());
  grow(ws.v_, n * c.v_dim());
  grow(ws.att_, n * c.attn_out_dim());
  grow(ws.proj_, n * E);
  grow(ws.gate_, n * c.n_ff);
  grow(ws.up_, n * c.n_ff);
  grow(ws.rope_, n * c.n_rot);
  grow(ws.out_, std::max<int64_t>(1, n_wanted) * E);
  if (c.attn_output_gate) {
    grow(ws.qg_, n * 2 * c.q_dim());
    grow(ws.agate_, n * c.q_dim());
  }

  if (c.n_recurrent_layer() > 0) {
    // GDN layers walk each sequence's tokens in order: grouped once per ubatch
    // (positions are consecutive in batch order), reusing the workspace's lists.
    if (ws.seq_tokens_.size() < caches.size()) ws.seq_tokens_.resize(caches.size());
    for (auto& list : ws.seq_tokens_) list.clear();
    ws.seq_order_.clear();
    for (int64_t i = 0; i < n; ++i) {
      auto& list = ws.seq_tokens_[static_cast<size_t>(tok[i].seq)];
      if (list.empty()) ws.seq_order_.push_back(tok[i].seq);
      list.push_back(static_cast<int32_t>(i));
    }
  }
  embed_tokens(tok, ws, pool);  // x[i] = token_embd[token_i], RoPE angles of pos_i
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (c.is_recurrent(l)) {
      gdn_block(l, tok, caches, ws, pool);  // x = x + W_out GatedDeltaNet(RMSNorm(x)) (qwen35)
    } else {
      attention_block(l, tok, caches, ws, pool);  // x = x + Wo attention(RMSNorm(x))
    }
    ffn_block(l, n, ws, pool);  // x = x + W_down (silu(W_gate xb) * W_up xb)
  }
  write_outputs(tok, n_wanted, ws, logits, hidden_rows, pool, hidden);
}

void Model::embed_tokens(std::span<const BatchToken> tok, Workspace& ws, core::ThreadPool& pool) const {
  const ModelConfig& c = config_;
  const Weights& W = weights_;
  const int64_t E = c.n_embd;
  float* x = ws.x_.data();
  // x[i] = token_embd[token_i]   (row dequantized from its stored type; no FP32 table)
  // and the RoPE angles of each token's position.
  float corr_dims[2] = {0.0f, 0.0f};
  if (c.yarn_ext_factor != 0.0f) yarn_corr_dims(c, corr_dims);
  pool.parallel_for(
      static_cast<int64_t>(tok.size()),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const auto* row = static_cast<const uint8_t*>(W.token_embd.data) +
                            static_cast<size_t>(tok[i].token) * W.token_embd.row_stride;
          kernels::dequantize_row(W.token_embd.format, row, x + i * E, E);
          // Bonsai 2: the stored row is rotated; e = s (.) H z.
          if (W.embd_inverted) {
            kernels::hadamard_unrotate(std::span<float>(x + i * E, static_cast<size_t>(E)), W.fold->signs_for(E),
                                       W.fold->block);
          }
          rope_angles(c, corr_dims, tok[i].pos, ws.rope_.data() + i * c.n_rot);
        }
      },
      kTokChunk);
}

void Model::attention_block(int64_t l, std::span<const BatchToken> tok, std::span<KvCache* const> caches, Workspace& ws,
                            core::ThreadPool& pool) const {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[static_cast<size_t>(l)];
  const int64_t n = static_cast<int64_t>(tok.size());
  const int64_t E = c.n_embd, hd_k = c.head_dim_k, hd_v = c.head_dim_v;
  const int64_t n_head_kv = c.n_head_kv;
  float* x = ws.x_.data();
  float* xb = ws.xb_.data();
  float* q = ws.q_.data();
  float* k = ws.k_.data();
  float* v = ws.v_.data();
  float* att = ws.att_.data();
  float* proj = ws.proj_.data();
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd_k));
  const int64_t group = c.n_head / n_head_kv;  // query heads per KV head
  const int64_t kl = c.kv_layer(l);            // its layer in the KV cache (qwen35: attention layers only)
  // qwen35: the q product holds [q, gate] per head (2 q_dim rows); the
  // per-head steps split it into q and agate.
  const bool gated = c.attn_output_gate;
  float* qg = gated ? ws.qg_.data() : q;
  float* agate = ws.agate_.data();
  // Decode-sized batches run the QKV product, the per-head steps and
  // attention as one pool dispatch per layer, split by KV head; that needs
  // enough KV heads for every thread (two runs each). Larger batches keep
  // attention's finer (tile x head) split.
  const bool fuse_attention = n <= kFusedMaxTokens && n_head_kv >= 2 * pool.size();

  // xb = RMSNorm(x) * attn_norm; the products read T(xb) when folded.
  rms_norm_rows(x, L.attn_norm.data, xb, n, E, c.rms_eps, pool);
  const float* xin = (L.folded & kFoldQ) != 0 ? rotated_input(xb, n, E, false, ws, pool) : xb;

  // q = Wq xb,  k = Wk xb,  v = Wv xb: one pass (the activations quantized
  // once); equal to three separate products bit for bit. Then per token and
  // KV head h: QK-norm (qwen3: q_h = RMSNorm(q_h) * q_norm for the query
  // heads of h's group, k_h likewise), RoPE on those q and k heads, k_h and
  // v_h stored in the sequence's cache at slot = position; then
  // att = causal grouped-query attention of q over the cached k, v
  // (attention.h: tiled online softmax, batch invariant).
  auto qk_rope_store = [&](int64_t i, int64_t h) {
    float* qi = q + i * c.q_dim();
    float* ki = k + i * c.k_dim() + h * hd_k;
    const float* cs = ws.rope_.data() + i * c.n_rot;
    for (int64_t qh = h * group; qh < (h + 1) * group; ++qh) {
      if (gated) {  // head qh's rows of the product: [q (hd), gate (hd)]
        const float* src = qg + i * 2 * c.q_dim() + qh * 2 * hd_k;
        std::memcpy(qi + qh * hd_k, src, static_cast<size_t>(hd_k) * sizeof(float));
        std::memcpy(agate + i * c.q_dim() + qh * hd_k, src + hd_k, static_cast<size_t>(hd_k) * sizeof(float));
      }
      if (c.qk_norm) rms_norm(qi + qh * hd_k, L.q_norm.data, qi + qh * hd_k, hd_k, c.rms_eps);
      apply_rope(c.rope_type, cs, c.n_rot, qi + qh * hd_k);
    }
    if (c.qk_norm) rms_norm(ki, L.k_norm.data, ki, hd_k, c.rms_eps);
    apply_rope(c.rope_type, cs, c.n_rot, ki);
    KvCache& kv = *caches[tok[i].seq];
    store_kv_row(kv.type_k(), ki, kv.k_row(kl, h, tok[i].pos), hd_k);
    store_kv_row(kv.type_v(), v + i * c.v_dim() + h * hd_v, kv.v_row(kl, h, tok[i].pos), hd_v);
  };
  const kernels::MatrixView qkv[] = {L.wq, L.wk, L.wv};
  float* const qkv_out[] = {qg, k, v};
  if (fuse_attention) {
    // Decode-sized batches: one pool dispatch per layer for all of it, each
    // task a run of KV heads (their q, k, v rows, then the per-head steps,
    // then attention for those heads, inline). Every token's keys of head
    // h are stored before head h's attention reads them: both run in the
    // task that owns h.
    kernels::gemm_units(
        qkv, 3, xin, n, qkv_out, n_head_kv,
        [&](int64_t h0, int64_t h1) {
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t h = h0; h < h1; ++h) qk_rope_store(i, h);
          }
          attention(c, kl, tok, caches, q, att, kq_scale, pool, h0, h1);
        },
        &pool, &ws.act_);
  } else {
    kernels::gemm_multi(qkv, 3, xin, n, qkv_out, &pool, &ws.act_);
    pool.parallel_for(
        n,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            for (int64_t h = 0; h < n_head_kv; ++h) qk_rope_store(i, h);
          }
        },
        kTokChunk);
    attention(c, kl, tok, caches, q, att, kq_scale, pool);
  }
  // qwen35: att = att * sigmoid(gate), the per-head output gate.
  if (gated) {
    const int64_t m = n * c.attn_out_dim();
    for (int64_t j = 0; j < m; ++j) att[j] /= 1.0f + std::exp(-agate[j]);
  }

  // x = x + Wo att
  matmul(L.wo, (L.folded & kFoldO) != 0 ? rotated_input(att, n, c.attn_out_dim(), false, ws, pool) : att, n, proj, pool,
         ws.act_);
  for (int64_t j = 0; j < n * E; ++j) x[j] += proj[j];
}

void Model::ffn_block(int64_t l, int64_t n, Workspace& ws, core::ThreadPool& pool) const {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[static_cast<size_t>(l)];
  const int64_t E = c.n_embd;
  float* x = ws.x_.data();
  float* xb = ws.xb_.data();
  float* proj = ws.proj_.data();
  float* gate = ws.gate_.data();
  float* up = ws.up_.data();
  // Rows per slice of the fused gate/up product: 64 where n_ff allows.
  int64_t ff_unit = 64;
  while (c.n_ff % ff_unit != 0) ff_unit /= 2;

  // xb = RMSNorm(x) * ffn_norm
  rms_norm_rows(x, L.ffn_norm.data, xb, n, E, c.rms_eps, pool);
  // gate = W_gate xb,  up = W_up xb,  gate = silu(gate) * up,  silu(g) = g / (1 + e^-g)
  // (the product in slices of ff_unit rows of both; each slice's silu * up
  // right after it, on the same thread: no dispatch of its own)
  const kernels::MatrixView gu[] = {L.w_gate, L.w_up};
  float* const outs[] = {gate, up};
  const float* xin = (L.folded & kFoldGate) != 0 ? rotated_input(xb, n, E, false, ws, pool) : xb;
  kernels::gemm_units(
      gu, 2, xin, n, outs, c.n_ff / ff_unit,
      [&](int64_t u0, int64_t u1) {
        for (int64_t i = 0; i < n; ++i) {
          float* g = gate + i * c.n_ff;
          const float* u = up + i * c.n_ff;
          kernels::silu_mul(g + u0 * ff_unit, u + u0 * ff_unit, g + u0 * ff_unit, (u1 - u0) * ff_unit);
        }
      },
      &pool, &ws.act_);
  // x = x + W_down gate
  matmul(L.w_down, (L.folded & kFoldDown) != 0 ? rotated_input(gate, n, c.n_ff, false, ws, pool) : gate, n, proj, pool,
         ws.act_);
  for (int64_t j = 0; j < n * E; ++j) x[j] += proj[j];
}

void Model::write_outputs(std::span<const BatchToken> tok, int64_t n_wanted, Workspace& ws, float* logits,
                          float* hidden_rows, core::ThreadPool& pool, bool hidden) const {
  const ModelConfig& c = config_;
  const Weights& W = weights_;
  const int64_t n = static_cast<int64_t>(tok.size());
  const int64_t E = c.n_embd;
  const float* x = ws.x_.data();
  // ---- Output: logits only for the tokens that want them ----
  // out_j = RMSNorm(x_i) * output_norm;  logits_j = W_out out_j  (W_out = token_embd when tied)
  if (n_wanted > 0) {
    // forward_hidden: the final-normed rows themselves are the output.
    float* out = hidden ? logits : ws.out_.data();
    int64_t j = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (!tok[i].logits) continue;
      rms_norm(x + i * E, W.output_norm.data, out + j * E, E, c.rms_eps);
      ++j;
    }
    if (!hidden) {
      const float* in = W.output_folded ? rotated_input(out, n_wanted, E, false, ws, pool) : out;
      matmul(W.output, in, n_wanted, logits, pool, ws.act_);
    }
  }
  // Embedding rows (BatchToken::hidden): out_j = RMSNorm(x_i) * output_norm, no product.
  for (int64_t i = 0, j = 0; i < n; ++i) {
    if (!tok[i].hidden) continue;
    rms_norm(x + i * E, W.output_norm.data, hidden_rows + j * E, E, c.rms_eps);
    ++j;
  }
}

}  // namespace bonsai::model
