// Formats table, tier selection, row (de)quantization and the threaded
// dispatch of gemv/gemm onto the active tier (see kernels.h, internal.h).
#include "kernels/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>  // argmax_f32
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>  // argmax_f32
#endif

#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/formats.h"
#include "kernels/internal.h"

namespace bonsai::kernels {

using detail::TierOps;

std::optional<Format> format_of(core::GgmlType type, core::Q2Layout q2_layout) {
  for (size_t i = 0; i < kFormatCount; ++i) {
    const FormatDef& def = kFormatDefs[i];
    if (def.ggml_type == type && (type != core::GgmlType::Q2_0 || def.q2_layout == q2_layout)) {
      return static_cast<Format>(i);
    }
  }
  return std::nullopt;
}

std::string_view format_name(Format f) { return format_def(f).name; }
int64_t block_elems(Format f) { return format_def(f).block_elems; }
size_t block_bytes(Format f) { return format_def(f).block_bytes; }

// ---- Tiers -------------------------------------------------------------------

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kReference:
      return "reference";
    case Tier::kAvx2:
      return "avx2";
    case Tier::kAvx512:
      return "avx512";
    case Tier::kNeon:
      return "neon";
    case Tier::kNeonDotprod:
      return "neon-dotprod";
    case Tier::kNeonI8mm:
      return "neon-i8mm";
  }
  return "?";
}

std::optional<Tier> parse_tier(std::string_view name) {
  for (Tier t : kAllTiers) {
    if (name == tier_name(t)) return t;
  }
  return std::nullopt;
}

namespace {

const TierOps* ops_of(Tier t) {
  switch (t) {
    case Tier::kReference:
      return detail::reference_ops();
    case Tier::kAvx2:
      return detail::avx2_ops();
    case Tier::kAvx512:
      return detail::avx512_ops();
    case Tier::kNeon:
      return detail::neon_ops();
    case Tier::kNeonDotprod:
      return detail::neon_dotprod_ops();
    case Tier::kNeonI8mm:
      return detail::neon_i8mm_ops();
  }
  return nullptr;
}

}  // namespace

namespace detail {
const TierOps* tier_ops(Tier t) { return ops_of(t); }
}  // namespace detail

namespace {

// Active tier as an int; -1 = not chosen yet (lazily best_tier()).
std::atomic<int> g_active{-1};

const TierOps* active_ops() { return ops_of(active_tier()); }

}  // namespace

bool tier_supported(Tier t) {
  if (ops_of(t) == nullptr) return false;
  const core::CpuFeatures& cpu = core::cpu_features();
  switch (t) {
    case Tier::kReference:
      return true;
    case Tier::kAvx2:
      return cpu.avx2;
    case Tier::kAvx512:
      return cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512vnni && cpu.avx2;
    case Tier::kNeon:
      return cpu.neon;
    case Tier::kNeonDotprod:
      return cpu.neon && cpu.dotprod;
    case Tier::kNeonI8mm:
      return cpu.neon && cpu.dotprod && cpu.i8mm;
  }
  return false;
}

Tier best_tier() {
  for (Tier t : {Tier::kAvx512, Tier::kAvx2, Tier::kNeonI8mm, Tier::kNeonDotprod, Tier::kNeon}) {
    if (tier_supported(t)) return t;
  }
  return Tier::kReference;
}

Tier active_tier() {
  int v = g_active.load(std::memory_order_acquire);
  if (v < 0) {
    const int best = static_cast<int>(best_tier());
    int expected = -1;
    g_active.compare_exchange_strong(expected, best, std::memory_order_acq_rel);
    v = g_active.load(std::memory_order_acquire);
  }
  return static_cast<Tier>(v);
}

core::Expected<void> set_active_tier(Tier t) {
  if (!tier_supported(t)) {
    return core::fail(core::Errc::kUnsupported, "kernel tier '" + std::string(tier_name(t)) +
                                                    "' is not supported by this CPU" +
                                                    (ops_of(t) == nullptr ? " (not built into this binary)" : ""));
  }
  g_active.store(static_cast<int>(t), std::memory_order_release);
  return {};
}

core::Expected<void> init_tier_from_env() {
  const char* env = std::getenv("BONSAI_KERNEL");
  if (env == nullptr || *env == '\0') {
    detail::set_avx512_amx(detail::AmxMode::kAuto);
    return set_active_tier(best_tier());
  }
  const std::string_view name = env;
  if (name == "avx512-amx") {
    if (!tier_supported(Tier::kAvx512)) return set_active_tier(Tier::kAvx512);  // its kUnsupported error
    if (!detail::amx_usable()) {
      return core::fail(core::Errc::kUnsupported,
                        "BONSAI_KERNEL='avx512-amx': this CPU has no AMX-INT8, or the OS did not grant the tile "
                        "state (expected a CPU with amx_int8 in /proc/cpuinfo and Linux 5.16 or later)");
    }
    detail::set_avx512_amx(detail::AmxMode::kOn);
    return set_active_tier(Tier::kAvx512);
  }
  const auto t = parse_tier(name);
  if (!t) {
    return core::fail(core::Errc::kInvalidArgument,
                      std::string("BONSAI_KERNEL='") + env +
                          "' is not a kernel tier (expected reference, avx2, avx512, avx512-amx, neon, neon-dotprod or "
                          "neon-i8mm)");
  }
  // Naming a tier runs that tier's own kernels: "avx512" is AVX-512 without AMX.
  detail::set_avx512_amx(*t == Tier::kAvx512 ? detail::AmxMode::kOff : detail::AmxMode::kAuto);
  return set_active_tier(*t);
}

std::string kernel_name() {
  std::string name(tier_name(active_tier()));
  if (active_tier() == Tier::kAvx512 && detail::avx512_amx_in_use()) name += "-amx";
  return name;
}

// ---- Rows ----------------------------------------------------------------------

void dequantize_row(Format f, const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (f) {
    case Format::kF32:
      std::memcpy(dst, p, static_cast<size_t>(n) * 4);
      return;
    case Format::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = core::fp16_to_fp32(h);
      }
      return;
    case Format::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = core::bf16_to_fp32(h);
      }
      return;
    default:
      break;
  }
  // Quantized: weight j of a block = w[j] * d (formats.h decode_block).
  const FormatDef& def = format_def(f);
  int8_t w[kMaxBlockElems];
  for (int64_t b = 0; b < n / def.block_elems; ++b) {
    const float d = def.decode_block(p + static_cast<size_t>(b) * def.block_bytes, w);
    for (int64_t j = 0; j < def.block_elems; ++j) dst[b * def.block_elems + j] = static_cast<float>(w[j]) * d;
  }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQ8_0Elems; ++b) {
    const float* x = src + b * kQ8_0Elems;
    float amax = 0.0f;
    for (int j = 0; j < kQ8_0Elems; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = core::fp32_to_fp16(d);
    std::memcpy(out[b].d, &dh, 2);
    for (int j = 0; j < kQ8_0Elems; ++j) out[b].qs[j] = detail::round_to_i8(x[j] * id);
  }
}

void quantize_row_q1_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ1_0*>(dst);
  for (int64_t b = 0; b < n / kQ1_0Elems; ++b) {
    const float* x = src + b * kQ1_0Elems;
    double sum = 0.0;
    for (int j = 0; j < kQ1_0Elems; ++j) sum += std::fabs(x[j]);
    const uint16_t dh = core::fp32_to_fp16(static_cast<float>(sum / kQ1_0Elems));
    std::memcpy(out[b].d, &dh, 2);
    std::memset(out[b].qs, 0, sizeof(out[b].qs));
    for (int j = 0; j < kQ1_0Elems; ++j) {
      if (x[j] >= 0.0f) out[b].qs[j / 8] = static_cast<uint8_t>(out[b].qs[j / 8] | (1u << (j % 8)));
    }
  }
}

void quantize_row_q2_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ2_0*>(dst);
  for (int64_t b = 0; b < n / kQ2_0Elems; ++b) {
    const float* x = src + b * kQ2_0Elems;
    float amax = 0.0f;
    for (int j = 0; j < kQ2_0Elems; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const uint16_t dh = core::fp32_to_fp16(amax);
    std::memcpy(out[b].d, &dh, 2);
    std::memset(out[b].qs, 0, sizeof(out[b].qs));
    for (int j = 0; j < kQ2_0Elems; ++j) {
      const float r = amax > 0.0f ? std::nearbyint(x[j] / amax) : 0.0f;
      int v = r == r ? static_cast<int>(std::clamp(r, -1.0f, 1.0f)) : 0;  // NaN -> 0
      v = std::clamp(v, -1, 1);
      out[b].qs[j / 4] = static_cast<uint8_t>(out[b].qs[j / 4] | ((v + 1) << (2 * (j % 4))));
    }
  }
}

// ---- Matrix products ---------------------------------------------------------------

namespace {

struct RowsCtx {
  const TierOps* ops;
  const MatrixView* w;
  const float* x;
  const detail::QuantAct* a;
  int64_t n;
  float* y;
};

// Smallest chunk (rows) of a product over `total_rows` rows split across
// `pool`; the pool makes chunks of at least this and about four per thread.
// Always enough rows that a chunk streams >= ~64 KiB of weights.
// GEMV and small batches (memory-bound): one contiguous chunk per thread (a
// multiple of 64 rows). Every chunk start is a cold weight stream (the
// prefetchers need a few KiB to ramp up), so fewer, longer streams measured
// best: Q1_0 GEMV at 2 threads moved 6-15% more bytes per second than with
// four chunks per thread on 1024..151936 rows. Threads that are busy
// elsewhere (concurrent callers) leave their chunk to the ones that are not.
// Larger batches (compute-bound) keep the pool's finer split for balance
// (one chunk per thread measured ~5% slower prefill).
// The AVX2 tier without VNNI is compute-bound already at N = 1 (Zen 3, 2
// cores: the int8 peak allows fewer columns/s than the read bandwidth), so
// there balance wins over stream count: four chunks per thread (multiples of
// 64 rows) measured 0-50% faster for N = 1, 2, 4 at 2 threads
// (bench/results/kernels-2026-12-02-zen3-avx2.txt). Row splits never change
// results (kernels_invariance_test).
int64_t chunk_rows(const MatrixView& w, int64_t n, int64_t total_rows, const core::ThreadPool& pool) {
  const size_t rb = std::max<size_t>(1, row_bytes(w.format, w.cols));
  const int64_t min_rows =
      static_cast<int64_t>((size_t{64} << 10) / (rb * static_cast<size_t>(std::max<int64_t>(1, n))));
  // tile16 / avx2-tile16 matrices (the table-lookup path, any n): whole
  // 64-row blocks, as for GEMV. A thread keeps the tables of its last
  // (prepare, group of G = lut_group_cols(cols) columns), so up to G columns any number of chunks
  // builds them once per thread (the AVX2 tier's four per thread below
  // stay); with more columns each chunk rebuilds every group, so one chunk
  // per thread.
  if (n >= detail::kAmxMinCols && !detail::is_lut_packing(w.packing)) return std::max<int64_t>(4, min_rows);
  const bool tile16_regroups = detail::is_lut_packing(w.packing) && n > detail::lut_group_cols(w.cols);
  const int64_t split = active_tier() == Tier::kAvx2 && !tile16_regroups ? 4 : 1;
  const int64_t per_thread = (total_rows + pool.size() * split - 1) / (pool.size() * split);
  return std::max<int64_t>({4, min_rows, (per_thread + 63) / 64 * 64});
}

// How many of ws[0 .. count) are packed in the lookup layout of `tier`, the
// tier that runs the product (AVX-512: tile16, AVX2: avx2-tile16; a layout
// of another tier is read stored): 0 none, 1 some, 2 all (the tier then
// wants the lookup tables of the activations; QuantAct::want_lut).
int tile16_use(const MatrixView* ws, int count, Tier tier = active_tier()) {
  const Packing own = tier == Tier::kAvx512 ? Packing::kTile16
                      : tier == Tier::kAvx2 ? Packing::kAvx2Tile16
                                            : Packing::kNone;
  if (own == Packing::kNone) return 0;
  int k = 0;
  for (int i = 0; i < count; ++i) k += ws[i].packing == own && ws[i].packed != nullptr ? 1 : 0;
  return k == 0 ? 0 : k == count ? 2 : 1;
}

// Marks a for a product whose matrices' tile16_use is `use` (before prepare).
void mark_tile16(detail::QuantAct& a, int use) {
  a.want_lut = use > 0;
  a.lut_only = use == 2;
}

// Quantizes x for weights of format f into the calling thread's scratch
// (in parallel for batches) and returns it; nullptr for float formats.
// tile16: tile16_use of the product's matrices (QuantAct::want_lut, lut_only).
const detail::QuantAct* prepare_act(const TierOps* ops, Format f, int64_t cols, const float* x, int64_t n,
                                    core::ThreadPool* pool, ActScratch* scratch, int tile16) {
  if (!detail::is_quantized(f)) return nullptr;
  // Without a caller's scratch (tests, benchmarks): the calling thread's.
  thread_local detail::QuantAct own;
  // (A pointer, not the name: a lambda naming a thread_local variable would
  // reach each worker's own instance.)
  detail::QuantAct* ap = scratch != nullptr ? &scratch->act() : &own;
  mark_tile16(*ap, tile16);
  if (ops->prepare_setup != nullptr && pool != nullptr && pool->size() > 1 && n >= 8) {
    // Batches: quantize / lay out the columns in parallel.
    ops->prepare_setup(f, n, cols, *ap);
    pool->parallel_for(
        n, [ops, f, x, ap](int64_t j0, int64_t j1) { ops->prepare_cols(f, x, j0, j1, *ap); }, 4);
  } else {
    ops->prepare(f, x, n, cols, *ap);
  }
  return ap;
}

// The matrix a product on `tier` computes: w, or for a PTQ1_0 matrix whose
// row-quad copy that tier reads (packing.cpp packs PTQ1_0 as its PQ2_0
// twin), the twin with `data` cleared (its stored bytes are PTQ1_0, not the
// twin's; only `packed` is read). Every other tier, and the AVX-512 tier
// while AMX is in use (it reads stored layouts), computes w's PTQ1_0 bytes.
MatrixView computed(const MatrixView& w, Tier tier) {
  if (w.format != Format::kPTQ1_0 || w.packed == nullptr || w.packing != Packing::kAvx512RowQuad ||
      tier != Tier::kAvx512 || detail::avx512_amx_in_use())
    return w;
  MatrixView t = detail::pq2_twin(w);
  t.data = nullptr;
  return t;
}

// computed() of ws[0 .. count) into `out` (kMaxMulti views), or ws itself
// when none changes.
constexpr int kMaxMulti = 8;
const MatrixView* computed(const MatrixView* ws, int count, MatrixView (&out)[kMaxMulti]) {
  bool any = false;
  for (int i = 0; i < count; ++i) any = any || (ws[i].format == Format::kPTQ1_0 && ws[i].packed != nullptr);
  // (More than kMaxMulti, which no caller passes: left as they are, computed
  // from their PTQ1_0 bytes by the AVX2 kernels, the same bits more slowly.)
  if (!any || count > kMaxMulti) return ws;
  for (int i = 0; i < count; ++i) out[i] = computed(ws[i], active_tier());
  return out;
}

void run_rows(const TierOps* ops, const MatrixView& w_in, const float* x, int64_t n, float* y, core::ThreadPool* pool,
              ActScratch* scratch) {
  if (w_in.rows <= 0 || n <= 0) return;
  const MatrixView w = computed(w_in, active_tier());
  ops = detail::ops_for_format(ops, w.format);
  const detail::QuantAct* a = prepare_act(ops, w.format, w.cols, x, n, pool, scratch, tile16_use(&w, 1));
  RowsCtx ctx{ops, &w, x, a, n, y};
  if (pool == nullptr || pool->size() <= 1) {
    ops->rows(w, x, a, n, y, 0, w.rows);
    return;
  }
  pool->parallel_for(
      w.rows, [&ctx](int64_t b, int64_t e) { ctx.ops->rows(*ctx.w, ctx.x, ctx.a, ctx.n, ctx.y, b, e); },
      chunk_rows(w, n, w.rows, *pool));
}

}  // namespace

ActScratch::ActScratch() : act_(std::make_unique<detail::QuantAct>()) {}
ActScratch::~ActScratch() = default;
ActScratch::ActScratch(ActScratch&&) noexcept = default;
ActScratch& ActScratch::operator=(ActScratch&&) noexcept = default;
size_t ActScratch::bytes() const { return act_ ? act_->bytes() : 0; }

void gemv(const MatrixView& w, const float* x, float* y, core::ThreadPool* pool, ActScratch* scratch) {
  run_rows(active_ops(), w, x, 1, y, pool, scratch);
}

void gemm(const MatrixView& w, const float* x, int64_t n, float* y, core::ThreadPool* pool, ActScratch* scratch) {
  run_rows(active_ops(), w, x, n, y, pool, scratch);
}

void gemm_multi(const MatrixView* ws_in, int count, const float* x, int64_t n, float* const* ys, core::ThreadPool* pool,
                ActScratch* scratch) {
  if (count <= 0 || n <= 0) return;
  MatrixView mapped[kMaxMulti];
  const MatrixView* ws = computed(ws_in, count, mapped);
  bool same = true;
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    same = same && ws[i].format == ws[0].format && ws[i].cols == ws[0].cols;
    total += ws[i].rows;
  }
  if (!same || pool == nullptr || pool->size() <= 1) {
    // (run_rows picks each matrix's ops for its own format.)
    for (int i = 0; i < count; ++i) run_rows(active_ops(), ws[i], x, n, ys[i], pool, scratch);
    return;
  }
  const TierOps* ops = detail::ops_for_format(active_ops(), ws[0].format);
  const detail::QuantAct* a = prepare_act(ops, ws[0].format, ws[0].cols, x, n, pool, scratch, tile16_use(ws, count));
  // Global row index over the concatenated matrices; a chunk may span several.
  pool->parallel_for(
      total,
      [&](int64_t b, int64_t e) {
        int64_t base = 0;
        for (int i = 0; i < count && b < e; ++i) {
          const int64_t lo = b - base, hi = e - base;
          if (lo < ws[i].rows) {
            const int64_t r0 = lo < 0 ? 0 : lo, r1 = hi < ws[i].rows ? hi : ws[i].rows;
            if (r0 < r1) ops->rows(ws[i], x, a, n, ys[i], r0, r1);
          }
          base += ws[i].rows;
        }
      },
      chunk_rows(ws[0], n, total, *pool));
}

void gemm_units(const MatrixView* ws, int count, const float* x, int64_t n, float* const* ys, int64_t units,
                void (*epilogue)(void* ctx, int64_t u0, int64_t u1), void* ctx, core::ThreadPool* pool,
                ActScratch* scratch) {
  if (count <= 0 || n <= 0 || units <= 0) return;
  MatrixView mapped[kMaxMulti];
  ws = computed(ws, count, mapped);
  bool same = true;
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    same = same && ws[i].format == ws[0].format && ws[i].cols == ws[0].cols && ws[i].rows % units == 0;
    total += ws[i].rows;
  }
  if (!same) {
    for (int i = 0; i < count; ++i) run_rows(active_ops(), ws[i], x, n, ys[i], pool, scratch);
    epilogue(ctx, 0, units);
    return;
  }
  const TierOps* ops = detail::ops_for_format(active_ops(), ws[0].format);
  const detail::QuantAct* a = prepare_act(ops, ws[0].format, ws[0].cols, x, n, pool, scratch, tile16_use(ws, count));
  auto slice = [&](int64_t u0, int64_t u1) {
    for (int i = 0; i < count; ++i) {
      const int64_t ru = ws[i].rows / units;
      ops->rows(ws[i], x, a, n, ys[i], u0 * ru, u1 * ru);
    }
    epilogue(ctx, u0, u1);
  };
  if (pool == nullptr || pool->size() <= 1) {
    slice(0, units);
    return;
  }
  // Runs of units as long as gemm's row chunks of the concatenated matrices.
  const int64_t unit_rows = std::max<int64_t>(1, total / units);
  const int64_t per_chunk = std::max<int64_t>(1, (chunk_rows(ws[0], n, total, *pool) + unit_rows - 1) / unit_rows);
  pool->parallel_for(units, std::move(slice), per_chunk);
}

void gemm_rows(Tier tier, const MatrixView& w_in, const float* x, int64_t n, float* y, int64_t row_begin,
               int64_t row_end) {
  const bool supported = tier_supported(tier);
  const MatrixView w = computed(w_in, supported ? tier : Tier::kReference);
  const TierOps* ops = detail::ops_for_format(supported ? ops_of(tier) : detail::reference_ops(), w.format);
  if (row_end <= row_begin || n <= 0) return;
  thread_local detail::QuantAct act;
  const detail::QuantAct* a = nullptr;
  if (detail::is_quantized(w.format)) {
    mark_tile16(act, tile16_use(&w, 1, supported ? tier : Tier::kReference));
    ops->prepare(w.format, x, n, w.cols, act);
    a = &act;
  }
  ops->rows(w, x, a, n, y, row_begin, row_end);
}

// ---- Float helpers ---------------------------------------------------------------------

float dot_f32(const float* a, const float* b, int64_t n) { return active_ops()->dot_f32(a, b, n); }
float dot_f16_f32(const uint16_t* a, const float* b, int64_t n) { return active_ops()->dot_f16_f32(a, b, n); }
void axpy_f32(float alpha, const float* x, float* y, int64_t n) { active_ops()->axpy_f32(alpha, x, y, n); }
void axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n) { active_ops()->axpy_f16(alpha, x, y, n); }
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) { active_ops()->f32_to_f16(src, dst, n); }

int64_t argmax_f32(const float* p, int64_t n) {
  // Two vector passes give the scalar definition exactly: the maximum, then
  // the first index equal to it. One scalar compare chain over 151,936
  // logits was ~0.3 ms per sampled row.
  const float first = p[0];
  if (std::isnan(first)) return 0;
  float m = first;
  int64_t i = 0;
#if defined(__SSE2__)
  // _mm_max_ps(x, a) = x > a ? x : a: a NaN x leaves a unchanged, as the scalar compare does.
  __m128 a0 = _mm_set1_ps(first), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm_max_ps(_mm_loadu_ps(p + i), a0);
    a1 = _mm_max_ps(_mm_loadu_ps(p + i + 4), a1);
    a2 = _mm_max_ps(_mm_loadu_ps(p + i + 8), a2);
    a3 = _mm_max_ps(_mm_loadu_ps(p + i + 12), a3);
  }
  float lane[16];
  _mm_storeu_ps(lane, a0);
  _mm_storeu_ps(lane + 4, a1);
  _mm_storeu_ps(lane + 8, a2);
  _mm_storeu_ps(lane + 12, a3);
  for (const float l : lane) m = l > m ? l : m;
#elif defined(__aarch64__) && defined(__ARM_NEON)
  // a = x > a ? x : a lane-wise (FCMGT + BSL): the scalar compare exactly
  // (a NaN x, quiet or signalling, leaves a; FMAX would return the NaN and
  // FMAXNM a signalling one). Per 16 floats: 2 LDP q, 4 FCMGT, 4 BSL, loop
  // = 13 (SSE2's MAXPS loop: 15).
  float32x4_t a0 = vdupq_n_f32(first), a1 = a0, a2 = a0, a3 = a0;
  const auto max_of = [](float32x4_t x, float32x4_t a) { return vbslq_f32(vcgtq_f32(x, a), x, a); };
  for (; i + 16 <= n; i += 16) {
    a0 = max_of(vld1q_f32(p + i), a0);
    a1 = max_of(vld1q_f32(p + i + 4), a1);
    a2 = max_of(vld1q_f32(p + i + 8), a2);
    a3 = max_of(vld1q_f32(p + i + 12), a3);
  }
  float lane[16];
  vst1q_f32(lane, a0);
  vst1q_f32(lane + 4, a1);
  vst1q_f32(lane + 8, a2);
  vst1q_f32(lane + 12, a3);
  for (const float l : lane) m = l > m ? l : m;
#endif
  for (; i < n; ++i) m = p[i] > m ? p[i] : m;
  int64_t k = 0;
#if defined(__SSE2__)
  const __m128 mv = _mm_set1_ps(m);
  for (; k + 16 <= n; k += 16) {
    const __m128 e01 = _mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(p + k), mv), _mm_cmpeq_ps(_mm_loadu_ps(p + k + 4), mv));
    const __m128 e23 = _mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(p + k + 8), mv), _mm_cmpeq_ps(_mm_loadu_ps(p + k + 12), mv));
    if (_mm_movemask_ps(_mm_or_ps(e01, e23)) != 0) break;  // the first match is in this block of 16
  }
#elif defined(__aarch64__) && defined(__ARM_NEON)
  const float32x4_t mv = vdupq_n_f32(m);
  for (; k + 16 <= n; k += 16) {  // per 16 floats: 2 LDP q, 4 FCMEQ, 3 ORR, UMAXV, loop: 16 (SSE2: 17)
    const uint32x4_t e01 = vorrq_u32(vceqq_f32(vld1q_f32(p + k), mv), vceqq_f32(vld1q_f32(p + k + 4), mv));
    const uint32x4_t e23 = vorrq_u32(vceqq_f32(vld1q_f32(p + k + 8), mv), vceqq_f32(vld1q_f32(p + k + 12), mv));
    if (vmaxvq_u32(vorrq_u32(e01, e23)) != 0) break;  // the first match is in this block of 16
  }
#endif
  for (; k < n; ++k)
    if (p[k] == m) return k;
  return 0;  // unreachable: m is one of the values
}

}  // namespace bonsai::kernels

namespace bonsai::kernels::detail {

const TierOps* ops_for_format(const TierOps* ops, Format f) {
  const auto lists = [f](const TierOps* o) {
    return o != nullptr && ((o->formats >> static_cast<unsigned>(f)) & 1u) != 0;
  };
  if (lists(ops)) return ops;
  if (ops == avx512_ops() && lists(avx2_ops()) && tier_supported(Tier::kAvx2)) return avx2_ops();
  return reference_ops();
}

size_t QuantAct::bytes() const {
  return q_buf_.capacity() + qp_buf_.capacity() + amx_b_buf_.capacity() +
         (d_buf_.capacity() + lane_d_buf_.capacity() + amx_dx_buf_.capacity()) * sizeof(float) +
         (lane_neg_buf_.capacity() + sub_sum_buf_.capacity() + amx_tsum_buf_.capacity()) * sizeof(int32_t);
}

void QuantAct::resize(int64_t n_vectors, int64_t n_cols) {
  n = n_vectors;
  cols = n_cols;
  const size_t e = static_cast<size_t>(n_vectors * n_cols);
  // qp: the AVX-512 grouped layout pads each column to whole groups of
  // four weight units (at most 3 * 128 extra bytes).
  const size_t ep = static_cast<size_t>(n_vectors * (n_cols + 384));
  if (qp_buf_.size() < ep) qp_buf_.resize(ep);
  if (q_buf_.size() < e) {
    q_buf_.resize(e);
    d_buf_.resize(e / 32 + 1);
    lane_d_buf_.resize(e / 4 + 1);
    lane_neg_buf_.resize(e / 4 + 1);
    sub_sum_buf_.resize(e / 32 + 1);
  }
  q = q_buf_.data();
  qp = qp_buf_.data();
  d = d_buf_.data();
  lane_d = lane_d_buf_.data();
  lane_neg = lane_neg_buf_.data();
  sub_sum = sub_sum_buf_.data();
  amx_ready = false;
  lut_ready = false;
  static std::atomic<uint64_t> next_gen{1};
  gen = next_gen.fetch_add(1, std::memory_order_relaxed);
}

ThreadScratch::~ThreadScratch() {
  if (p_ != nullptr) ::operator delete(p_, std::align_val_t(64));
}

uint8_t* ThreadScratch::get(size_t bytes) {
  if (bytes > n_) {
    if (p_ != nullptr) ::operator delete(p_, std::align_val_t(64));
    p_ = nullptr;  // (if the allocation throws, nothing is freed twice)
    n_ = 0;
    p_ = static_cast<uint8_t*>(::operator new(bytes, std::align_val_t(64)));
    n_ = bytes;
  }
  return p_;
}

const uint8_t* thread_luts(const QuantAct& a, int64_t n, int64_t j0, LutBuildFn build) {
  struct Held {
    uint64_t gen = 0;
    int64_t j0 = -1;
    LutBuildFn build = nullptr;
    ThreadScratch buf;
  };
  thread_local Held held;
  const int64_t lut_col = a.cols * static_cast<int64_t>(kLutBytesPerValue);
  const int64_t group = lut_group_cols(a.cols);
  uint8_t* luts = held.buf.get(static_cast<size_t>(std::min(n, group) * lut_col));
  if (held.gen != a.gen || held.j0 != j0 || held.build != build) {
    held.gen = 0;  // (stale until the build below has finished)
    const int64_t j1 = std::min(n, j0 + group);
    for (int64_t j = j0; j < j1; ++j) build(a.q + j * a.cols, a.cols, luts + (j - j0) * lut_col);
    held.gen = a.gen;
    held.j0 = j0;
    held.build = build;
  }
  return luts;
}

void QuantAct::resize_amx(int64_t groups) {
  amx_groups = groups;
  const size_t s = static_cast<size_t>(groups * (cols / 32));
  if (amx_b_buf_.size() < s * 512) amx_b_buf_.resize(s * 512);
  if (amx_tsum_buf_.size() < s * 32) amx_tsum_buf_.resize(s * 32);
  if (amx_dx_buf_.size() < s * 16) amx_dx_buf_.resize(s * 16);
  amx_b = amx_b_buf_.data();
  amx_tsum = amx_tsum_buf_.data();
  amx_dx = amx_dx_buf_.data();
}

}  // namespace bonsai::kernels::detail
