// Model: a loaded Qwen3 / llama GGUF (weights as zero-copy views into the one
// mapping) and its forward pass over a Batch.
//
// Usage (one engine replica):
//   auto model = Model::load(path);                 // shared_ptr<const Model>, share it
//   auto cache = KvCache::create((*model)->config(), n_ctx);
//   Workspace ws;                                   // one per replica
//   Batch b = Batch::for_sequence(ids, /*pos0=*/0);
//   std::vector<float> logits(b.n_wanted() * (*model)->config().n_vocab);
//   KvCache* caches[] = {&*cache};
//   (*model)->forward(b, caches, ws, logits, pool);
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"        // File, OpenOptions
#include "kernels/kernels.h"  // MatrixView
#include "model/batch.h"      // Batch
#include "model/config.h"     // ModelConfig
#include "model/hadamard.h"   // HadamardFold
#include "model/kv_cache.h"   // KvCache

namespace bonsai::core {
class ThreadPool;
}

namespace bonsai::model {

// A norm weight vector: F32 tensors are viewed in place; F16/BF16 ones (tiny)
// are converted once at load into `owned`.
struct NormWeight {
  const float* data = nullptr;  // n floats; points into the mapping or into owned
  std::vector<float> owned;
};

// Which of a layer's matrices read a Hadamard-rotated input (the Bonsai 2
// fold, model/hadamard.h): bits of LayerWeights::folded.
enum FoldBit : uint32_t {
  kFoldQ = 1u << 0,  // attn_q, attn_k, attn_v: one bit each
  kFoldK = 1u << 1,
  kFoldV = 1u << 2,
  kFoldO = 1u << 3,  // attn_output
  kFoldGate = 1u << 4,
  kFoldUp = 1u << 5,
  kFoldDown = 1u << 6,
  kFoldQkv = 1u << 7,     // attn_qkv (GDN)
  kFoldZ = 1u << 8,       // attn_gate (GDN)
  kFoldSsmOut = 1u << 9,  // ssm_out (GDN)
};

// A qwen35 Gated DeltaNet layer's own tensors (llama.cpp names, model/config.h
// for the widths; the math is ../shared/fixtures/README.md "The graph").
struct GdnWeights {
  kernels::MatrixView w_qkv;    // attn_qkv.weight   ssm_conv_dim x n_embd
  kernels::MatrixView w_z;      // attn_gate.weight  ssm_v_dim x n_embd (the output gate z)
  kernels::MatrixView w_beta;   // ssm_beta.weight   ssm_n_v_heads x n_embd (BF16 in the real files)
  kernels::MatrixView w_alpha;  // ssm_alpha.weight  ssm_n_v_heads x n_embd
  NormWeight conv;              // ssm_conv1d.weight [conv_kernel, conv_dim]: tap k of channel c at c*kernel + k
  NormWeight dt_bias;           // ssm_dt.bias       [ssm_n_v_heads]
  NormWeight a;                 // ssm_a             [ssm_n_v_heads] (stored negative: -exp(A_log))
  NormWeight norm;              // ssm_norm.weight   [ssm_head_dim]
  kernels::MatrixView w_out;    // ssm_out.weight    n_embd x ssm_v_dim
};

// Views of one transformer block's tensors (llama.cpp names `blk.N.*`).
// Matrix shapes as rows x cols (GGUF ne = [cols, rows]). A qwen35 GDN layer
// uses attn_norm, gdn and the FFN; its attention members are empty.
struct LayerWeights {
  NormWeight attn_norm;        // attn_norm.weight   [n_embd]
  kernels::MatrixView wq;      // attn_q.weight      q_dim x n_embd (qwen35: 2 q_dim, [q, gate] per head)
  kernels::MatrixView wk;      // attn_k.weight      k_dim x n_embd
  kernels::MatrixView wv;      // attn_v.weight      v_dim x n_embd
  NormWeight q_norm;           // attn_q_norm.weight [head_dim_k] (qwen3 only)
  NormWeight k_norm;           // attn_k_norm.weight [head_dim_k] (qwen3 only)
  kernels::MatrixView wo;      // attn_output.weight n_embd x attn_out_dim
  NormWeight ffn_norm;         // ffn_norm.weight    [n_embd] (qwen35: post_attention_norm.weight)
  kernels::MatrixView w_gate;  // ffn_gate.weight    n_ff x n_embd
  kernels::MatrixView w_up;    // ffn_up.weight      n_ff x n_embd
  kernels::MatrixView w_down;  // ffn_down.weight    n_embd x n_ff
  GdnWeights gdn;              // qwen35 GDN layers only
  uint32_t folded = 0;         // FoldBit: matrices whose input is Hadamard-rotated
};

// All weights: views into the gguf::File's mapping (zero-copy; a split
// file's tensors each into its own part's mapping), except that
// a matrix repacked at load (RepackStats) also points at its one packed copy
// in Model::packed_ (MatrixView::packed). Valid while the owning Model lives.
struct Weights {
  kernels::MatrixView token_embd;  // n_vocab x n_embd, stored type; rows dequantized on lookup
  NormWeight output_norm;          // [n_embd]
  kernels::MatrixView output;      // n_vocab x n_embd; == token_embd when tied
  std::vector<LayerWeights> layers;
  // The Bonsai 2 Hadamard fold (prism.hadamard.*), when the file has one:
  // block size and sign vectors by input width; which matrices it covers is
  // LayerWeights::folded, output_folded and embd_inverted.
  std::optional<HadamardFold> fold;
  bool output_folded = false;  // output.weight's input is rotated
  bool embd_inverted = false;  // token_embd rows get the inverse transform after lookup
};

// Per-caller scratch buffers for forward(), grown on demand and reused across
// calls (no allocation in steady-state decode). One per engine replica; not
// thread-safe (one forward() at a time per Workspace).
class Workspace {
 public:
  Workspace() = default;
  Workspace(Workspace&&) noexcept = default;
  Workspace& operator=(Workspace&&) noexcept = default;
  size_t bytes() const;  // currently allocated scratch bytes

 private:
  friend class Model;
  // Row-major [n_tokens][dim] activations.
  std::vector<float> x_;     // residual stream       [n][n_embd]
  std::vector<float> xb_;    // normed input          [n][n_embd]
  std::vector<float> q_;     // queries               [n][q_dim]
  std::vector<float> k_;     // keys                  [n][k_dim]
  std::vector<float> v_;     // values                [n][v_dim]
  std::vector<float> att_;   // attention output      [n][attn_out_dim]
  std::vector<float> proj_;  // wo / w_down output    [n][n_embd]
  std::vector<float> gate_;  // silu(gate) * up       [n][n_ff]
  std::vector<float> up_;    //                       [n][n_ff]
  std::vector<float> rope_;  // cos/sin per token     [n][n_rot]
  // qwen35: rotated matmul inputs (the Hadamard fold) [n][widest folded
  // input]; the gated attention's q|gate rows [n][2 q_dim] and gate
  // [n][q_dim]; GDN conv input/output [n][conv_dim], z [n][v_dim], beta and
  // alpha [n][n_v_heads], output [n][v_dim]; ones_ [conv_dim] of 1.0f
  // (the u of kernels::silu_mul for the conv's plain SiLU).
  std::vector<float> rot_;
  std::vector<float> qg_;
  std::vector<float> agate_;
  std::vector<float> qkv_;
  std::vector<float> conv_;
  std::vector<float> z_;
  std::vector<float> beta_;
  std::vector<float> alpha_;
  std::vector<float> ssm_o_;
  std::vector<float> ones_;
  std::vector<std::vector<int32_t>> seq_tokens_;  // per sequence id: its token indices in the ubatch, in order
  std::vector<int32_t> seq_order_;                // the sequence ids present in the ubatch, first appearance first
  std::vector<float> out_;                        // final-normed rows of wanted tokens [n_wanted][n_embd]
  std::vector<int64_t> seq_next_;                 // per sequence id: next position in this batch (-1: absent)
  std::vector<int64_t> seq_first_;                // per sequence id: its first position in this batch
  // Quantized activations of the products: ~2.3 bytes x [n][largest cols]
  // (the widest product's input, n_ff for w_down), grown on demand.
  kernels::ActScratch act_;
};

// What loading did about repacked weights (DESIGN.md "Weights", issue 8
// decision 2): the matrices the active kernel tier computes faster in
// another layout (kernels::packing_for) are copied once into that layout at
// load, on the compute pool, and their mapped pages released, so resident
// memory stays about the file size. Shared by every replica and request
// (it lives in the one Model).
struct RepackStats {
  kernels::Packing packing = kernels::Packing::kNone;  // kNone: nothing repacked; else the first layout used
  int tensors = 0;                                     // matrices repacked
  // Matrices per layout (index: the Packing value): one model can mix them
  // (AVX-512 with VBMI: Q1_0 rows of up to 2,048 columns as tile16, the rest
  // as row quads; the AVX2 tier has one, avx2-tile16).
  std::array<int, kernels::kPackingCount> by_packing{};
  uint64_t bytes = 0;  // bytes of the packed (and transcoded) copies
  // Matrices copied into another format at load (kernels::transcode_target:
  // PTQ1_0 -> PQ2_0 where the PQ2_0 kernels are faster), and their bytes
  // as stored in the file (the copies take 34/28 of that).
  int transcoded = 0;
  uint64_t transcoded_from_bytes = 0;
  uint64_t released_bytes = 0;  // mapped bytes released (MADV_DONTNEED)
  double seconds = 0;           // wall time (packing and release)
  int threads = 1;              // compute threads it ran on
};
// One log line, e.g. "repacked 197 tensors (169 tile16, 28 avx512-row-quad), 231.4 MiB in
// 85 ms on 2 threads (0.37 s/GB), 231.2 MiB of mapped pages released";
// "weights not repacked (zero-copy)" when nothing was.
std::string describe(const RepackStats& stats);

// Lists every problem that stops `file` from loading as a model: unsupported
// or missing architecture, missing/ill-typed/inconsistent metadata keys,
// missing tensors, wrong shapes, tensor types the kernels cannot compute on,
// tensors the model would not use (metadata that does not describe the file,
// e.g. block_count too small). Empty means loadable. Each entry is one human-readable line naming the
// key or tensor. Used by Model::from_file and `bonsai validate`.
std::vector<std::string> check_model(const gguf::File& file);

// How Model::load reads a file and lays out its weights.
struct LoadOptions {
  gguf::OpenOptions file;  // how the GGUF is parsed (Q2_0 layout override)
  // Repack the weight matrices the active kernel tier computes faster in
  // another layout (kernels::packing_for) into one copy at load and release
  // their mapped pages. false (`--no-repack`): every tensor stays a
  // zero-copy view (DESIGN.md "Weights").
  bool repack = true;
};

// An immutable loaded model, shared by every engine replica
// (std::shared_ptr<const Model>); all members are const after load, so
// concurrent forward() calls with distinct caches and workspaces are safe.
class Model {
 public:
  // Opens `path` (gguf::File::open: any part of a split model loads the set) and builds the weights; repacks them
  // (RepackStats) unless options.repack is false.
  // Errors: those of File::open; kFormat / kUnsupported / kNotFound listing
  // every problem check_model finds (joined with "; "); kResourceExhausted
  // when the memory for the packed copies cannot be mapped.
  static core::Expected<std::shared_ptr<const Model>> load(const std::string& path, const LoadOptions& options = {});
  // Same on an already opened file (kept alive by the model). `repack`:
  // as LoadOptions::repack; the packing runs on core::global_pool().
  static core::Expected<std::shared_ptr<const Model>> from_file(std::shared_ptr<const gguf::File> file,
                                                                bool repack = true);

  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }
  const std::shared_ptr<const gguf::File>& file_ptr() const { return file_; }
  const Weights& weights() const { return weights_; }
  // Bytes of all weight tensors in the mapping (token_embd counted once when tied).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // What loading repacked (packing kNone when nothing).
  const RepackStats& repack_stats() const { return repack_stats_; }

  // Runs the transformer on `batch`.
  //   caches: indexed by BatchToken::seq; caches[seq] must be non-null for
  //           every seq used, made for this model (KvCache::matches) and big
  //           enough for the positions written.
  //   logits: [batch.n_wanted()][n_vocab] floats, rows in batch order of the
  //           tokens with logits == true; must hold at least that many.
  //   pool:   matrix products and attention heads run on it.
  // Errors (checked before anything is written; caches unchanged on error):
  // kInvalidArgument for an empty batch, a token id outside [0, n_vocab), a
  // seq id outside caches or a null cache, a cache of another model,
  // non-consecutive positions in a sequence, a first position beyond the
  // cache's size(), a logits span too small; kOutOfRange for a position >=
  // the cache's n_ctx(); kResourceExhausted when a paged cache's pool has no
  // block left for the positions written (KvCache::prepare: blocks may have
  // been attached, sizes and rows are unchanged).
  core::Expected<void> forward(const Batch& batch, std::span<KvCache* const> caches, Workspace& ws,
                               std::span<float> logits, core::ThreadPool& pool) const;
  // forward() that also writes, for every token with BatchToken::hidden, its
  // final hidden state after the output norm (as forward_hidden below):
  // `hidden` is [batch.n_hidden()][n_embd] floats, rows in batch order. A
  // scheduler step mixing completions (logits rows) and embeddings (hidden
  // rows). Each row is the one forward / forward_hidden give for that token
  // alone (batch invariance). Same checks and errors, plus a hidden span too small.
  core::Expected<void> forward(const Batch& batch, std::span<KvCache* const> caches, Workspace& ws,
                               std::span<float> logits, std::span<float> hidden, core::ThreadPool& pool) const;

  // forward() that writes, instead of logits, the final hidden state of
  // each wanted token after the output norm (RMSNorm(x) * output_norm.weight,
  // the vector the output matrix multiplies): `hidden` is
  // [batch.n_wanted()][n_embd] floats, rows in batch order. Same checks,
  // errors and cache updates as forward(); used for embeddings.
  core::Expected<void> forward_hidden(const Batch& batch, std::span<KvCache* const> caches, Workspace& ws,
                                      std::span<float> hidden, core::ThreadPool& pool) const;

  // Batches longer than this are run in consecutive slices of at most this
  // many tokens (llama.cpp's n_ubatch default), bounding workspace memory;
  // the result is the same as one pass.
  static constexpr int64_t kMaxUbatch = 512;

 private:
  Model() = default;
  // The transformer on one validated slice of a batch (at most kMaxUbatch
  // tokens): writes the rows of the tokens with `logits` to `logits`
  // ([n_wanted][n_vocab]; with as_hidden, their final-normed hidden rows
  // [n_wanted][n_embd] instead, forward_hidden) and the final-normed rows of
  // the tokens with `hidden` to hidden_rows ([n_hidden][n_embd]).
  void run_ubatch(std::span<const BatchToken> tokens, std::span<KvCache* const> caches, Workspace& ws, float* logits,
                  float* hidden_rows, core::ThreadPool& pool, bool as_hidden) const;
  // The steps of run_ubatch on the ubatch's scratch in ws (sized for tok):
  // x = the tokens' embedding rows and ws.rope_ their RoPE angles;
  void embed_tokens(std::span<const BatchToken> tok, Workspace& ws, core::ThreadPool& pool) const;
  // layer l's attention block (norm, QKV, QK-norm + RoPE, cache store,
  // attention, Wo) added to x;
  void attention_block(int64_t l, std::span<const BatchToken> tok, std::span<KvCache* const> caches, Workspace& ws,
                       core::ThreadPool& pool) const;
  // qwen35 GDN layer l (norm, qkv/z/beta/alpha products, causal conv + SiLU,
  // L2-normed q/k, the gated delta rule over each sequence's recurrent
  // state, gated RMSNorm, ssm_out) added to x (gated_delta_net.cpp);
  void gdn_block(int64_t l, std::span<const BatchToken> tok, std::span<KvCache* const> caches, Workspace& ws,
                 core::ThreadPool& pool) const;
  // the input of a Hadamard-folded product: ws.rot_ = T(P(x)) for n rows of
  // `width` floats (P: the GDN v-head regrouping, when `gdn_permute` and the
  // fold's gdn_v_grouped; T: weights_.fold's transform); returns ws.rot_.
  const float* rotated_input(const float* x, int64_t n, int64_t width, bool gdn_permute, Workspace& ws,
                             core::ThreadPool& pool) const;
  // layer l's feed-forward block (norm, SwiGLU) added to x, for n tokens;
  void ffn_block(int64_t l, int64_t n, Workspace& ws, core::ThreadPool& pool) const;
  // the final-normed rows and logits (run_ubatch's outputs) from x.
  void write_outputs(std::span<const BatchToken> tok, int64_t n_wanted, Workspace& ws, float* logits,
                     float* hidden_rows, core::ThreadPool& pool, bool as_hidden) const;
  core::Expected<void> forward_impl(const Batch& batch, std::span<KvCache* const> caches, Workspace& ws,
                                    std::span<float> out, std::span<float> hidden_rows, core::ThreadPool& pool,
                                    bool as_hidden) const;
  // Packs the matrices packing_for picks into packed_ and releases their
  // mapped pages (RepackStats). Errors: kResourceExhausted (no memory).
  core::Expected<void> repack_weights();
  std::shared_ptr<const gguf::File> file_;
  ModelConfig config_;
  Weights weights_;  // a repacked matrix's view also points into packed_
  uint64_t weight_bytes_ = 0;
  std::shared_ptr<uint8_t> packed_;  // one anonymous mapping holding every packed copy (unmapped with the model)
  RepackStats repack_stats_;
};

}  // namespace bonsai::model
