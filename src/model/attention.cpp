// Tiled causal GQA attention with an online softmax; see attention.h.
//
// One task = (tile of up to kQueryTile consecutive tokens of one sequence) x
// (one KV head). The task walks the key blocks 0, 32, 64, ... up to its last
// query's position; each block of K and V rows is converted once to fp32
// scratch (exact for f16 and q8_0: fp16 -> fp32 is exact and d * q fits in
// fp32's 24-bit mantissa) and then applied to every query of the tile and
// every query head of the group. Per (query head, block) the state update is
//   m' = max(m, max_t s_t),  c = exp(m - m'),  p_t = exp(s_t - m')
//   l' = l c + sum_t p_t,    acc' = acc c + sum_t p_t v_t      (t ascending)
// and at the end out = acc * (1 / l). Only keys t <= pos enter; rows past a
// query's position are never read for it.
//
// Q8_0 keys (-ctk q8_0) take an integer path instead of the fp32 rows: each
// query head's q is quantized once per task to Q8_0 blocks of 32 and the
// scores come from the integer scorer (kernels/attention.h gives the
// formula; every tier returns the same bits).
//
// The per-block steps are kernels (kernels/attention.h, chosen by the
// products' tier): on the AVX-512, AVX2 and NEON tiers the group step takes the
// heads that see the same keys of a block — the GQA group of a query, and
// two queries' groups on every block but the diagonal one — together, each
// K and V chunk loaded once for all of them while every head keeps its own
// ops, so the bits do not depend on the grouping. When at most kDirectHeads
// heads share a block (decode) the K/V rows are read in place from the cache
// (the same values as the scratch), which saves the conversion's store and
// reload. Elsewhere (the reference tier, head dims the SIMD steps do not
// take) each head runs the reference step (attn_block_ref / attn_update_ref).
#include "model/attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/attention.h"  // attn_kernels, the per-block steps

namespace bonsai::model {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// At most this many query heads of a task (tile queries x GQA group) read K/V
// rows in place on the AVX-512 and AVX2 paths; more convert each block once
// to fp32.
constexpr int64_t kDirectHeads = 4;

kernels::Format row_format(KvType t) {
  switch (t) {
    case KvType::kF16:
      return kernels::Format::kF16;
    case KvType::kF32:
      return kernels::Format::kF32;
    case KvType::kQ8_0:
      return kernels::Format::kQ8_0;
  }
  return kernels::Format::kF32;
}

// A run of consecutive tokens of one sequence: tok[first .. first+count).
struct Tile {
  int64_t first = 0;
  int64_t count = 0;
  int64_t last_pos = 0;  // position of its last token (cost ~ last_pos)
};

// Per-thread scratch, grown on demand.
struct Scratch {
  std::vector<float> k, v;               // [kKeyBlock][hd_k], [kKeyBlock][hd_v]: the block's rows in fp32
  std::vector<float> state;              // [tile queries * group][st_len]: each head's m, l, acc
  std::vector<float> s;                  // [tile queries * group][kKeyBlock] scores / probabilities
  std::vector<kernels::AttnQ8Query> qq;  // [tile queries * group] quantized q (Q8_0-key path)
  std::vector<const float*> qp;          // [tile queries * group] q rows of the task's heads
  void reserve(int64_t hd_k, int64_t hd_v, int64_t group, int64_t st_len);
};

void Scratch::reserve(int64_t hd_k, int64_t hd_v, int64_t group, int64_t st_len) {
  if (k.size() < static_cast<size_t>(kKeyBlock * hd_k)) k.resize(kKeyBlock * hd_k);
  if (v.size() < static_cast<size_t>(kKeyBlock * hd_v)) v.resize(kKeyBlock * hd_v);
  if (state.size() < static_cast<size_t>(kQueryTile * group * st_len)) state.resize(kQueryTile * group * st_len);
  if (s.size() < static_cast<size_t>(kQueryTile * group * kKeyBlock)) {
    s.resize(kQueryTile * group * kKeyBlock);
    qq.resize(kQueryTile * group);
    qp.resize(kQueryTile * group);
  }
}

// What one attention() call shares with its tasks.
struct Call {
  const ModelConfig& c;
  int64_t layer;
  std::span<const BatchToken> tok;
  std::span<KvCache* const> caches;
  const float* q;
  float* out;
  float scale;
  int64_t hd_k, hd_v, group;
  int64_t q_stride, o_stride;  // floats between tokens' rows of q, out
  int64_t st_len;              // floats of one head's state: m, l, acc[hd_v]
  kernels::AttnKernels kern;   // kern.step null: the reference per-head steps
};

// One task: a tile of one sequence's queries x one KV head.
struct Task {
  const Call& call;
  const Tile& tl;
  int64_t kvh;
  const KvCache& kv;
  Scratch& sc;
  kernels::Format kf, vf;  // K and V row formats
  bool q8k;                // Q8_0 keys: integer scores
  bool direct;             // the group step reads V rows in place
  bool direct_k;           // ... and K rows (not Q8_0 ones: those are scored by score_q8)
  int64_t p_first;         // position of the tile's first query
};

// Tiles: maximal runs of adjacent tokens of one sequence (their positions
// are consecutive, forward() checked), cut every kQueryTile tokens; the
// longest-context tiles first so the pool's tail is short.
void make_tiles(std::span<const BatchToken> tok, std::vector<Tile>& tiles) {
  const int64_t n = static_cast<int64_t>(tok.size());
  tiles.clear();
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && j - i < kQueryTile && tok[j].seq == tok[i].seq) ++j;
    tiles.push_back({i, j - i, tok[j - 1].pos});
    i = j;
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) { return a.last_pos > b.last_pos; });
}

// Every head's state reset, its q row found and (Q8_0 keys) quantized once
// for the whole key walk.
void start_task(const Task& t) {
  const Call& a = t.call;
  const int64_t group = a.group;
  for (int64_t s = 0; s < t.tl.count * group; ++s) {
    float* st = t.sc.state.data() + s * a.st_len;
    st[0] = kNegInf;
    std::fill(st + 1, st + a.st_len, 0.0f);
  }
  for (int64_t qi = 0; qi < t.tl.count; ++qi) {
    for (int64_t g = 0; g < group; ++g) {
      t.sc.qp[qi * group + g] = a.q + (t.tl.first + qi) * a.q_stride + (t.kvh * group + g) * a.hd_k;
    }
  }
  if (t.q8k) {
    for (int64_t qi = 0; qi < t.tl.count; ++qi) {
      const float* qrow = a.q + (t.tl.first + qi) * a.q_stride + t.kvh * group * a.hd_k;
      for (int64_t g = 0; g < group; ++g) kernels::attn_quantize_q8(qrow + g * a.hd_k, a.hd_k, t.sc.qq[qi * group + g]);
    }
  }
}

// The key block at kb applied to the tile's queries from qi0 on (those whose
// position reaches it): the tier's group step, else per head the reference
// step. With Q8_0 keys the scores are already in sc.s.
void apply_block(const Task& t, int64_t kb, int64_t qi0) {
  const Call& a = t.call;
  const int64_t group = a.group, hd_k = a.hd_k, hd_v = a.hd_v, st_len = a.st_len;
  Scratch& sc = t.sc;
  if (a.kern.step) {
    const kernels::AttnRows kref =
        t.direct_k ? kernels::AttnRows{t.kf, t.kv.k_row(a.layer, t.kvh, kb), t.kv.k_row_bytes()}
                   : kernels::AttnRows{kernels::Format::kF32, reinterpret_cast<const uint8_t*>(sc.k.data()),
                                       static_cast<size_t>(hd_k) * sizeof(float)};
    const kernels::AttnRows vref =
        t.direct ? kernels::AttnRows{t.vf, t.kv.v_row(a.layer, t.kvh, kb), t.kv.v_row_bytes()}
                 : kernels::AttnRows{kernels::Format::kF32, reinterpret_cast<const uint8_t*>(sc.v.data()),
                                     static_cast<size_t>(hd_v) * sizeof(float)};
    // Two queries at a time where both see the whole block (every block but
    // the diagonal one), so their 2 x group heads share the loads; the
    // diagonal block one query at a time (nk differs).
    for (int64_t qi = qi0; qi < t.tl.count;) {
      const int64_t nk = std::min(kKeyBlock, t.p_first + qi + 1 - kb);
      const int64_t n_q = nk == kKeyBlock && qi + 1 < t.tl.count ? 2 : 1;
      float* srow = sc.s.data() + qi * group * kKeyBlock;
      if (t.q8k && nk < kKeyBlock) {
        for (int64_t j = 0; j < n_q * group; ++j)
          std::fill(srow + j * kKeyBlock + nk, srow + (j + 1) * kKeyBlock, kNegInf);
      }
      a.kern.step(sc.qp.data() + qi * group, n_q * group, t.q8k ? nullptr : &kref, vref, nk, hd_k, hd_v, a.scale, srow,
                  sc.state.data() + qi * group * st_len, st_len);
      qi += n_q;
    }
  } else if (t.q8k) {
    for (int64_t qi = qi0; qi < t.tl.count; ++qi) {
      const int64_t nk = std::min(kKeyBlock, t.p_first + qi + 1 - kb);
      for (int64_t g = 0; g < group; ++g) {
        float* srow = sc.s.data() + (qi * group + g) * kKeyBlock;
        std::fill(srow + nk, srow + kKeyBlock, kNegInf);
        kernels::attn_update_ref(srow, sc.v.data(), nk, hd_v, sc.state.data() + (qi * group + g) * st_len);
      }
    }
  } else {
    for (int64_t qi = qi0; qi < t.tl.count; ++qi) {
      const int64_t nk = std::min(kKeyBlock, t.p_first + qi + 1 - kb);
      const float* qrow = a.q + (t.tl.first + qi) * a.q_stride + t.kvh * group * hd_k;
      for (int64_t g = 0; g < group; ++g) {
        kernels::attn_block_ref(qrow + g * hd_k, sc.k.data(), sc.v.data(), nk, hd_k, hd_v, a.scale,
                                sc.state.data() + (qi * group + g) * st_len);
      }
    }
  }
}

// One key block at kb: the next block's rows requested, this block's rows
// converted to scratch (unless read in place), Q8_0 scores, then the step.
void key_block(const Task& t, int64_t kb) {
  const Call& a = t.call;
  const KvCache& kv = t.kv;
  Scratch& sc = t.sc;
  const int64_t last_pos = t.tl.last_pos;
  const int64_t nk_all = std::min(kKeyBlock, last_pos + 1 - kb);
  // The next key block's K and V rows are requested into L2 while this one
  // is converted and applied (hints only; no result changes). Decode (rows
  // read in place: `direct`): a few lines at a time from the group step's
  // inner loops (attn_prefetch_spread). Prefill: spread over the block's
  // phases (K before this block's K conversion and V after it; with Q8_0
  // keys, not converted, K in two halves around V's conversion and V in two
  // halves around the scoring and the V update), so the misses in flight
  // never fill the core's miss queue at once. Measurements:
  // bench/results/notes-attention.md.
  const bool k_conv = !t.q8k && !t.direct_k;
  const int64_t kn = kb + kKeyBlock;
  const int64_t nk_next = kn <= last_pos ? std::min(kKeyBlock, last_pos + 1 - kn) : 0;
  const size_t kbytes = static_cast<size_t>(nk_next) * kv.k_row_bytes();
  const size_t vbytes = static_cast<size_t>(nk_next) * kv.v_row_bytes();
  const uint8_t* k_next = nk_next > 0 ? kv.k_row(a.layer, t.kvh, kn) : nullptr;
  const uint8_t* v_next = nk_next > 0 ? kv.v_row(a.layer, t.kvh, kn) : nullptr;
  if (t.direct) {
    kernels::attn_prefetch_spread(k_next, kbytes, v_next, vbytes);
  } else {
    kernels::attn_prefetch_spread(nullptr, 0, nullptr, 0);
  }
  const bool conv = !t.direct;  // the block's rows go through fp32 scratch
  if (k_next && conv) kernels::attn_prefetch_l2(k_next, k_conv ? kbytes : kbytes / 2);
  // One head's rows are contiguous, so the block is one row of nk_all * hd values.
  if (k_conv) a.kern.load_rows(t.kf, kv.k_row(a.layer, t.kvh, kb), sc.k.data(), nk_all * a.hd_k);
  if (v_next && k_conv && conv) kernels::attn_prefetch_l2(v_next, vbytes);
  if (conv) a.kern.load_rows(t.vf, kv.v_row(a.layer, t.kvh, kb), sc.v.data(), nk_all * a.hd_v);
  if (k_next && !k_conv && conv) kernels::attn_prefetch_l2(k_next + kbytes / 2, kbytes - kbytes / 2);
  const int64_t qi0 = std::max<int64_t>(0, kb - t.p_first);  // first query reaching this block
  if (t.q8k) {
    // Scores of keys kb..kb+nk_all for the tile's queries that reach this
    // block (positions are consecutive: the first ones may not).
    a.kern.score_q8(kv.k_row(a.layer, t.kvh, kb), kv.k_row_bytes(), nk_all, a.hd_k, sc.qq.data() + qi0 * a.group,
                    (t.tl.count - qi0) * a.group, a.scale, sc.s.data() + qi0 * a.group * kKeyBlock);
  }
  if (v_next && !k_conv && conv) kernels::attn_prefetch_l2(v_next, vbytes / 2);
  apply_block(t, kb, qi0);
  if (v_next && !k_conv && conv) kernels::attn_prefetch_l2(v_next + vbytes / 2, vbytes - vbytes / 2);
}

// out = acc * (1 / l) for every head of the task.
void finish_task(const Task& t) {
  const Call& a = t.call;
  for (int64_t qi = 0; qi < t.tl.count; ++qi) {
    float* orow = a.out + (t.tl.first + qi) * a.o_stride + t.kvh * a.group * a.hd_v;
    for (int64_t g = 0; g < a.group; ++g) {
      const float* st = t.sc.state.data() + (qi * a.group + g) * a.st_len;
      const float inv_l = 1.0f / st[1];
      for (int64_t i = 0; i < a.hd_v; ++i) orow[g * a.hd_v + i] = st[2 + i] * inv_l;
    }
  }
}

// Task (tile tl, KV head kvh): its key blocks in increasing order.
void run_task(const Call& a, const Tile& tl, int64_t kvh, Scratch& sc) {
  const KvCache& kv = *a.caches[a.tok[tl.first].seq];
  const bool q8k = kv.type_k() == KvType::kQ8_0 && a.hd_k <= kernels::kAttnQ8MaxHeadDim;
  // The group step reads K/V straight from the cache rows when at most
  // kDirectHeads query heads share the block (decode), and converts them
  // once to fp32 scratch otherwise (prefill tiles): the same values.
  const bool direct = a.kern.step != nullptr && tl.count * a.group <= kDirectHeads;
  const kernels::Format kf = row_format(kv.type_k());
  const Task t{a,
               tl,
               kvh,
               kv,
               sc,
               kf,
               row_format(kv.type_v()),
               q8k,
               direct,
               direct && kf != kernels::Format::kQ8_0,
               a.tok[tl.first].pos};
  start_task(t);
  for (int64_t kb = 0; kb <= tl.last_pos; kb += kKeyBlock) key_block(t, kb);
  finish_task(t);
}

}  // namespace

const char* attention_kernel_name(int64_t head_dim_k, int64_t head_dim_v) {
  return kernels::attn_kernels(head_dim_k, head_dim_v).name;
}

void attention_q8_scores(const float* q, const uint8_t* k_rows, size_t row_bytes, int64_t nk, int64_t hd, float scale,
                         float* s) {
  kernels::AttnQ8Query qq;
  kernels::attn_quantize_q8(q, hd, qq);
  kernels::attn_kernels(hd, hd).score_q8(k_rows, row_bytes, nk, hd, &qq, 1, scale, s);
}

void attention(const ModelConfig& c, int64_t layer, std::span<const BatchToken> tok, std::span<KvCache* const> caches,
               const float* q, float* out, float scale, core::ThreadPool& pool, int64_t kvh_begin, int64_t kvh_end) {
  const int64_t hd_k = c.head_dim_k, hd_v = c.head_dim_v, group = c.n_head / c.n_head_kv;
  const Call call{c,
                  layer,
                  tok,
                  caches,
                  q,
                  out,
                  scale,
                  hd_k,
                  hd_v,
                  group,
                  c.n_head * hd_k,
                  c.n_head * hd_v,
                  2 + hd_v,
                  kernels::attn_kernels(hd_k, hd_v)};

  thread_local std::vector<Tile> tiles_tls;
  std::vector<Tile>& tiles = tiles_tls;  // the caller's, also inside the workers' lambda
  make_tiles(tok, tiles);

  if (kvh_end < 0) kvh_end = c.n_head_kv;
  const int64_t n_kvh = kvh_end - kvh_begin;  // KV heads computed here
  if (n_kvh <= 0) return;
  // Tasks KV-head-major: consecutive tasks (one thread's chunk) walk the same
  // head's K/V rows for every tile, so those rows stay in cache between
  // tiles instead of all heads' rows passing through once per tile.
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
  pool.parallel_for(n_tiles * n_kvh, [&](int64_t b, int64_t e) {
    thread_local Scratch sc;
    sc.reserve(hd_k, hd_v, group, call.st_len);
    for (int64_t task = b; task < e; ++task) {
      run_task(call, tiles[static_cast<size_t>(task % n_tiles)], kvh_begin + task / n_tiles, sc);
    }
  });
}

}  // namespace bonsai::model
