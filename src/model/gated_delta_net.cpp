// The qwen35 (Qwen3.5 hybrid) Gated DeltaNet layer and the Bonsai 2 input
// rotation, members of Model (model.h). The layer follows llama.cpp's
// src/models/qwen35.cpp as ../shared/fixtures/README.md "The graph" writes it
// down (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks"); the float64
// reference is ../shared/tools/qwen35_ref.py (Model.gdn).
//
// Invariance (DESIGN.md "Numerics"): the recurrence runs token by token, in
// position order, for each (sequence, v head) on its own, and the conv sums
// its taps in a fixed order, so a sequence's state and outputs are the same
// bits however its prompt was chunked and whatever shares its step. The cost
// of that choice over a chunked (parallel-scan) delta rule: prefill does
// O(head_dim^2) sequential work per token and head instead of matrix
// products; at the 27B shape (48 v heads, head_dim 128, 48 GDN layers) that
// is 7 flops per state element, about 0.26 GFLOP per token, against ~54 GOP
// of weight products. The step itself is kernels::delta_rule_step (16-lane
// sums, the same bits on every tier).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/delta_rule.h"
#include "kernels/hadamard.h"
#include "kernels/silu.h"      // silu_mul: the conv's SiLU, the gated norm
#include "kernels/ssm_conv.h"  // ssm_conv_step: the causal conv
#include "model/model.h"
#include "model/model_internal.h"

namespace bonsai::model {

namespace {

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
// ggml_softplus: log(1 + e^v), v itself past 20 (where they agree in fp32).
float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

// x <- x / max(||x||_2, eps) over n floats (ggml_l2_norm; sum in double).
void l2_norm(float* x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::max(std::sqrt(static_cast<float>(ss)), eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace

const float* Model::rotated_input(const float* x, int64_t n, int64_t width, bool gdn_permute, Workspace& ws,
                                  core::ThreadPool& pool) const {
  const HadamardFold& fold = *weights_.fold;
  const ModelConfig& c = config_;
  grow(ws.rot_, n * width);
  float* out = ws.rot_.data();
  const std::span<const float> signs = fold.signs_for(width);
  const bool permute = gdn_permute && fold.gdn_v_grouped;
  const int64_t d = c.ssm_head_dim, n_k = c.ssm_n_k_heads;
  const int64_t rep = n_k > 0 ? c.ssm_n_v_heads / n_k : 1;
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const float* src = x + i * width;
          float* dst = out + i * width;
          if (permute) {
            // llama.cpp's tiled v-head order (head t = r n_k + k) to the
            // checkpoint's grouped order (head k rep + r) the fold was made in.
            for (int64_t t = 0; t < c.ssm_n_v_heads; ++t) {
              const int64_t g = (t % n_k) * rep + t / n_k;
              std::memcpy(dst + g * d, src + t * d, static_cast<size_t>(d) * sizeof(float));
            }
          } else {
            std::memcpy(dst, src, static_cast<size_t>(width) * sizeof(float));
          }
          kernels::hadamard_rotate(std::span<float>(dst, static_cast<size_t>(width)), signs, fold.block);
        }
      },
      kTokChunk);
  return out;
}

void Model::gdn_block(int64_t l, std::span<const BatchToken> tok, std::span<KvCache* const> caches, Workspace& ws,
                      core::ThreadPool& pool) const {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[static_cast<size_t>(l)];
  const GdnWeights& G = L.gdn;
  const int64_t n = static_cast<int64_t>(tok.size());
  const int64_t E = c.n_embd, d = c.ssm_head_dim, n_k = c.ssm_n_k_heads, n_v = c.ssm_n_v_heads;
  const int64_t kd = c.ssm_k_dim(), vd = c.ssm_v_dim(), cd = c.ssm_conv_dim(), K = c.ssm_conv_kernel;
  const int64_t rl = c.recurrent_layer(l);
  grow(ws.qkv_, n * cd);
  grow(ws.conv_, n * cd);
  grow(ws.z_, n * vd);
  grow(ws.beta_, n * n_v);
  grow(ws.alpha_, n * n_v);
  grow(ws.ssm_o_, n * vd);
  float* x = ws.x_.data();
  float* xb = ws.xb_.data();
  float* qkv = ws.qkv_.data();
  float* conv = ws.conv_.data();
  float* z = ws.z_.data();
  float* beta = ws.beta_.data();
  float* alpha = ws.alpha_.data();
  float* o = ws.ssm_o_.data();
  float* proj = ws.proj_.data();

  // xb = RMSNorm(x) * attn_norm
  rms_norm_rows(x, L.attn_norm.data, xb, n, E, c.rms_eps, pool);
  // qkv = W_qkv xb, z = W_z xb (the fold rotates their input);
  // beta = W_beta xb, alpha = W_alpha xb (never folded).
  {
    const float* xin = (L.folded & kFoldQkv) != 0 ? rotated_input(xb, n, E, false, ws, pool) : xb;
    const kernels::MatrixView m[] = {G.w_qkv, G.w_z};
    float* const out[] = {qkv, z};
    kernels::gemm_multi(m, 2, xin, n, out, &pool, &ws.act_);
    // ggml computes a BF16 (F16) product on activations rounded to BF16
    // (F16) first (its vec_dot_type); beta and alpha feed the recurrence
    // of every later token, so the rounding is reproduced here (without it
    // the last-position logits of the Q1_0 fixture move 0.13 rms off
    // llama.cpp's golden, with it 0.03: fixtures README "Tolerances").
    const float* ab_in = xb;
    if (G.w_beta.format == G.w_alpha.format &&
        (G.w_beta.format == kernels::Format::kBF16 || G.w_beta.format == kernels::Format::kF16)) {
      const bool bf16 = G.w_beta.format == kernels::Format::kBF16;
      grow(ws.rot_, n * E);
      float* r = ws.rot_.data();
      for (int64_t j = 0; j < n * E; ++j) {
        r[j] = bf16 ? core::bf16_to_fp32(core::fp32_to_bf16(xb[j])) : core::fp16_to_fp32(core::fp32_to_fp16(xb[j]));
      }
      ab_in = r;
    }
    const kernels::MatrixView ab[] = {G.w_beta, G.w_alpha};
    float* const ab_out[] = {beta, alpha};
    kernels::gemm_multi(ab, 2, ab_in, n, ab_out, &pool, &ws.act_);
  }

  // Each sequence's tokens in order (run_ubatch grouped them once for all GDN layers).
  const auto& seq_tokens = ws.seq_tokens_;
  const auto& seqs = ws.seq_order_;

  // Causal depthwise conv over the cd channels, then SiLU:
  //   conv_t[ch] = silu(sum_{k<K} w[ch K + k] * in_{t-K+1+k}[ch])
  // where in_ before the sequence's first token of this ubatch comes from its
  // state's conv tail (zeros at position 0); kernels::ssm_conv_step sums the
  // taps in order and moves the tail by one token, so the tail keeps the
  // last K-1 inputs. Split by channel ranges: channels are independent. The
  // SiLU is kernels::silu_mul's (times 1.0f: exact), over each token's run of
  // channels at once: the same bits on every tier and for any chunking.
  // (Scalar per-channel loops here, with libm's expf for the SiLU, were ~5%
  // of a 27B decode token: ~10 ms of ~215.)
  constexpr int64_t kChanChunk = 64;
  if (static_cast<int64_t>(ws.ones_.size()) < cd) ws.ones_.assign(static_cast<size_t>(cd), 1.0f);
  const float* ones = ws.ones_.data();
  pool.parallel_for((cd + kChanChunk - 1) / kChanChunk,
                    [&](int64_t b, int64_t e) {
                      const int64_t c0 = b * kChanChunk, c1 = std::min(cd, e * kChanChunk);
                      for (int32_t s : seqs) {
                        float* tail = caches[s]->recurrent_state(rl);  // [(K-1)][cd]
                        for (int32_t i : seq_tokens[static_cast<size_t>(s)]) {
                          float* out = conv + i * cd + c0;
                          kernels::ssm_conv_step(G.conv.data + c0 * K, K, tail + c0, cd, qkv + i * cd + c0, out,
                                                 c1 - c0);
                          kernels::silu_mul(out, ones + c0, out, c1 - c0);
                        }
                      }
                    },
                    1);

  // Per token: q and k heads L2-normalised (eps = rms eps, as llama.cpp);
  // beta = sigmoid(beta); alpha becomes the decay g = exp(a * softplus(alpha + dt_bias)).
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          for (int64_t h = 0; h < 2 * n_k; ++h) l2_norm(conv + i * cd + h * d, d, c.rms_eps);
          for (int64_t h = 0; h < n_v; ++h) {
            beta[i * n_v + h] = sigmoid(beta[i * n_v + h]);
            alpha[i * n_v + h] = std::exp(G.a.data[h] * softplus(alpha[i * n_v + h] + G.dt_bias.data[h]));
          }
        }
      },
      kTokChunk);

  // The delta rule per (sequence, v head), token by token; v head h reads q/k
  // head h % n_k (llama.cpp's tiled order). Then the gated RMSNorm of each
  // head's output: o = RMSNorm(o) * ssm_norm * silu(z).
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto n_seq = static_cast<int64_t>(seqs.size());
  pool.parallel_for(
      n_seq * n_v,
      [&](int64_t b, int64_t e) {
        for (int64_t task = b; task < e; ++task) {
          const int32_t s = seqs[static_cast<size_t>(task / n_v)];
          const int64_t h = task % n_v, hk = h % n_k;
          float* S = caches[s]->recurrent_state(rl) + (K - 1) * cd + h * d * d;
          for (int32_t i : seq_tokens[static_cast<size_t>(s)]) {
            const float* row = conv + i * cd;
            float* oh = o + i * vd + h * d;
            kernels::delta_rule_step(S, row + hk * d, row + kd + hk * d, row + 2 * kd + h * d, alpha[i * n_v + h],
                                     beta[i * n_v + h], scale, oh, d);
            rms_norm(oh, G.norm.data, oh, d, c.rms_eps);
            const float* zh = z + i * vd + h * d;
            kernels::silu_mul(zh, oh, oh, d);  // oh[j] *= silu(zh[j])
          }
        }
      },
      1);

  // x = x + W_out o
  matmul(G.w_out, (L.folded & kFoldSsmOut) != 0 ? rotated_input(o, n, vd, true, ws, pool) : o, n, proj, pool, ws.act_);
  for (int64_t j = 0; j < n * E; ++j) x[j] += proj[j];
}

}  // namespace bonsai::model
