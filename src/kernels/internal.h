// Internal interface between kernels.cpp (dispatch, threading) and the tier
// files (reference.cpp, avx2.cpp, avx512.cpp, neon*.cpp). Not for other parts.
//
// Matrix products on quantized weights (Q8_0, Q1_0, Q2_0 layouts) quantize
// the activations once per call to Q8_0-style blocks (32 values, d =
// amax/127 rounded to fp16, q = round-to-nearest-even(x / d) as ggml's
// quantize_row_q8_0 does) and then follow one canonical order, the same in
// every tier and every path (GEMV, small batches, large GEMM, AMX, any row
// split), so that a column's result never depends on the batch it is in
// (DESIGN.md "Numerics", batch invariance):
//
// Canonical order. A weight row is cut into chunks of W consecutive weights
// (chunk_elems: W = 32 for Q1_0, 16 for the Q2_0 layouts, 4 for Q8_0); a
// chunk lies in one weight block and one 32-value activation sub-block. For
// row r and activation column j:
//   isum_c = sum_{e in chunk c} w_e * q_e            exact int32
//   Q1_0 / Q2_0:  lane[c mod 16] = fma(fl(float(isum_c) * dx_c), dw_c, lane)
//   Q8_0:         lane[c mod 16] = fma(float(isum_c), fl(dw_c * dx_c), lane)
// over c = 0, 1, ... in order, lanes starting at +0, then
//   y = reduce_lanes16(lane): pairs (i, i+8), then (i, i+4), (i, i+2), (0, 1).
// dx_c is the chunk's activation sub-block scale, dw_c its weight block's
// fp16 scale (w_e the small-int weight: +-1, code - 1, or the Q8_0 quant).
// Each step is one IEEE-754 fp32 operation (round to nearest), so every
// tier that does these operations -- a 16-lane vector accumulator, two
// 8-lane ones, AMX tile sums read out per chunk -- is bit-identical to the
// scalar reference (reference.cpp), whatever the number of columns or rows
// it computes at once. The lane of a chunk depends only on its position in
// the row, never on the tile or thread that computes it. Kernel files are
// compiled with -ffp-contract=off so that no mul + add pair is fused behind
// the code's back.
// The g128 Q2_0 layouts use the same chunks (16 weights, the block's d) as
// g64, so a g128 matrix and its g64 twin (pairs of blocks sharing d) give
// bit-identical products.
// Float weight formats (F32, F16, BF16) take the float activations directly;
// each tier computes a column with the same code whatever n is (batch
// invariant within the tier), tiers differ in fp32 order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <new>
#include <vector>

#include "kernels/kernels.h"

namespace bonsai::kernels::detail {

// Minimal 64-byte aligned allocator for SIMD buffers.
template <class T>
struct AlignedAlloc {
  using value_type = T;
  AlignedAlloc() = default;
  template <class U>
  AlignedAlloc(const AlignedAlloc<U>&) {}
  T* allocate(size_t n) {
    void* p = ::operator new(n * sizeof(T) + 64, std::align_val_t(64));
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const AlignedAlloc<U>&) const {
    return true;
  }
};
template <class T>
using AVec = std::vector<T, AlignedAlloc<T>>;

// Quantized activations of n vectors of `cols` values (cols a multiple of
// 128). resize() (defined in kernels.cpp) allocates every buffer; tier files
// then use the raw pointers only, so that SIMD-flagged translation units
// instantiate no shared inline/template code (which the linker could merge
// with the portable copy and run on a CPU without the ISA).
struct QuantAct {
  int64_t n = 0;
  int64_t cols = 0;
  int8_t* q = nullptr;  // [n][cols] int8 quants in natural element order
  float* d = nullptr;   // [n][cols/32] sub-block scales (fp16-rounded, widened)
  // SIMD-tier extras (unused by the reference tier):
  int8_t* qp = nullptr;         // [n][cols + 384] quants in a tier's weight order
                                //   (column stride cols, or the AVX-512 grouped
                                //   layout's padded stride; see avx512.cpp)
  float* lane_d = nullptr;      // [n][cols/4] scale of each dword lane
  int32_t* lane_neg = nullptr;  // [n][cols/4] -(sum of the lane's quants)
  int32_t* sub_sum = nullptr;   // [n][cols/32] sum of each sub-block's quants
  // AMX GEMM layout (amx.cpp), valid when amx_ready; groups of 16 columns:
  int64_t amx_groups = 0;
  int8_t* amx_b = nullptr;      // [groups][cols/32] B tiles of 8 x 64 bytes (natural
                                //   element order within each 32-value sub-block)
  int32_t* amx_tsum = nullptr;  // [groups][cols/16][16] sum of the quants of each
                                //   16-value piece, per column of the group
  float* amx_dx = nullptr;      // [groups][cols/32][16] activation scales
  bool amx_ready = false;
  // Set by the caller before prepare: some weight matrix of this product is
  // packed in the active tier's lookup layout (AVX-512: kTile16, AVX2:
  // kAvx2Tile16). The AVX-512 tier (Q1_0, VBMI) and the AVX2 tier (Q1_0)
  // then set lut_ready: their tile16 paths build the lookup tables of q on
  // each thread that runs rows (avx512_tile.inc, avx2_tile.inc), once per
  // prepare (`gen`) and column group.
  bool want_lut = false;
  // Set with want_lut: every matrix of the product is so packed, so
  // with lut_ready the tier's other activation layout (AVX-512: grouped
  // qp, lane_neg, lane_d; AVX2: the pair layout) is not built (only an
  // AVX-512 CPU without VBMI converts tiles for the row-quad kernel).
  bool lut_only = false;
  // Set by the tier's prepare (AVX-512: prepare_setup, with VBMI): want_lut
  // and Q1_0; its tile16 rows then take the lookup path (and, with
  // lut_only, the other layout is not built).
  bool lut_ready = false;
  // Unique per resize() (so per prepare), process-wide.
  uint64_t gen = 0;

  // Sets n, cols and makes every buffer at least that large (64-byte
  // aligned); clears amx_ready and lut_ready, takes a new gen.
  void resize(int64_t n_vectors, int64_t n_cols);
  // Sizes the AMX buffers for `groups` groups of 16 columns (after resize).
  void resize_amx(int64_t groups);
  // Allocated bytes of every buffer (ActScratch::bytes).
  size_t bytes() const;

 private:
  AVec<int8_t> q_buf_, qp_buf_, amx_b_buf_;
  AVec<float> d_buf_, lane_d_buf_, amx_dx_buf_;
  AVec<int32_t> lane_neg_buf_, sub_sum_buf_, amx_tsum_buf_;
};

// Function table of one tier. All pointers are non-null.
struct TierOps {
  // Quantizes x ([n][cols]) for a product with weights of format f (a
  // quantized format) into `a` (resized as needed).
  void (*prepare)(Format f, const float* x, int64_t n, int64_t cols, QuantAct& a);
  // Y[j][r] (Y is [n][w.rows]) for rows [r0, r1) and j < n. `a` is the
  // prepared activation for quantized formats, nullptr for float formats
  // (which read x: [n][w.cols]).
  void (*rows)(const MatrixView& w, const float* x, const QuantAct* a, int64_t n, float* y, int64_t r0, int64_t r1);
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  float (*dot_f16_f32)(const uint16_t* a, const float* b, int64_t n);
  void (*axpy_f32)(float alpha, const float* x, float* y, int64_t n);
  void (*axpy_f16)(float alpha, const uint16_t* x, float* y, int64_t n);
  void (*f32_to_f16)(const float* src, uint16_t* dst, int64_t n);
  // Optional (may be nullptr): the same work split so that batches can be
  // prepared in parallel (both read a.want_lut / a.lut_only, which the
  // caller sets first): prepare_setup sizes `a` for n columns on one
  // thread, then prepare_cols fills columns [j0, j1) (x is the whole [n][cols]
  // batch); disjoint column ranges may run concurrently.
  void (*prepare_setup)(Format f, int64_t n, int64_t cols, QuantAct& a);
  void (*prepare_cols)(Format f, const float* x, int64_t j0, int64_t j1, QuantAct& a);
  // The formats prepare / rows compute (format_bit set, formats.h); the
  // products of any other format run on the reference tier (kernels.cpp
  // product_ops), so a new format computes everywhere before it has kernels.
  uint32_t formats = 0;
};

// Tier tables; nullptr when the tier is not compiled into this binary.
// The formats the AVX2 and AVX-512 tiers compute (TierOps::formats): the
// float ones, Q8_0, and every 1- and 2-bit format, whose kernels are
// generic over UnitGeo (formats.h).
inline constexpr uint32_t kX86TierFormats = format_bit(Format::kF32) | format_bit(Format::kF16) |
                                            format_bit(Format::kBF16) | format_bit(Format::kQ8_0) |
                                            family_bits(Family::kSign) | family_bits(Family::kCode2);

// The AVX2 tier also computes PTQ1_0 (avx2_trit.inc); the AVX-512 tier
// hands PTQ1_0 products to it (ops_for_format).
inline constexpr uint32_t kAvx2TierFormats = kX86TierFormats | family_bits(Family::kTrit);

const TierOps* reference_ops();
const TierOps* avx2_ops();
const TierOps* avx512_ops();
const TierOps* neon_ops();
const TierOps* neon_dotprod_ops();  // NEON + SDOT (neon_dotprod.cpp)
const TierOps* neon_i8mm_ops();     // NEON + SDOT + SMMLA (neon_i8mm.cpp)

// The table of a tier (nullptr if not built); does not check the CPU.
const TierOps* tier_ops(Tier t);

// The ops that compute products of format f for a tier whose ops are `ops`:
// ops itself where it lists f (TierOps::formats); for the AVX-512 tier the
// AVX2 tier where that lists f (PTQ1_0: every AVX-512 CPU runs AVX2 code);
// else reference_ops(), which defines every format (kernels.cpp routes
// every product through it).
const TierOps* ops_for_format(const TierOps* ops, Format f);

// Test hook: lets tests run the AVX-512 tier's code paths for CPUs without
// GFNI / AVX512_VBMI (e.g. Cascade Lake) on a machine that has them.
// `enabled` is ANDed with CPUID; returns the previous setting.
bool set_avx512_gfni(bool enabled);

// One row of PTQ1_0 blocks to PQ2_0 blocks (kernels.h
// transcode_ptq1_0_to_pq2_0): `blocks` blocks of 28 bytes at src to blocks
// of 34 at dst (the same 128 weights, codes = digits, d copied). The scalar
// form (packing.cpp, any CPU) and the AVX2 tier's (avx2.cpp: the PTQ1_0
// kernels' in-register digit decode, four digits packed per byte; callable
// where tier_supported(Tier::kAvx2)) write the same bytes for every input
// byte, valid base-3 or not (tests/kernels/formats_test.cpp).
void transcode_ptq1_0_row_scalar(const uint8_t* src, uint8_t* dst, int64_t blocks);
void transcode_ptq1_0_row_avx2(const uint8_t* src, uint8_t* dst, int64_t blocks);

// Test hook: makes the AVX2 tier use PMADDUBSW/PMADDWD instead of AVX-VNNI's
// VPDPBUSD on a CPU that has it (`enabled` is ANDed with CPUID); returns the
// previous setting.
bool set_avx2_vnni(bool enabled);

// When the AVX-512 tier sends a batch to the AMX GEMM (amx.cpp) instead of
// its VNNI kernels. kAuto (the default): where kAmxMeasured says AMX won
// (amx_wins); kOn: every batch of n >= kAmxMinCols (BONSAI_KERNEL=avx512-amx,
// the tests' AMX variants); kOff: never (BONSAI_KERNEL=avx512). AMX runs
// only where the CPU and OS allow it (amx_usable) whatever the mode.
enum class AmxMode : uint8_t { kOff, kAuto, kOn };
// Sets the mode; returns the previous one. A test hook and the
// BONSAI_KERNEL switch; set it before weights are packed (packing_for reads
// it through avx512_amx_in_use). Not thread-safe against running products.
AmxMode set_avx512_amx(AmxMode mode);
AmxMode avx512_amx_mode();

// AMX-INT8 GEMM path (amx.cpp), used by the AVX-512 tier for n >= kAmxMinCols
// when the mode allows it.
inline constexpr int64_t kAmxMinCols = 6;

// One measurement of the AMX GEMM against the AVX-512 VNNI path at one batch
// size: microseconds per product, same run, same matrix.
struct AmxMeasure {
  int64_t n;       // activation columns
  double amx_us;   // AMX GEMM (stored layout)
  double vnni_us;  // VNNI path (tile16 for Q1_0 rows of <= 2,048 columns)
};
// What kAuto decides from. Source: issue 27, bonsai_bench_kernels on a
// 2-vCPU Intel Xeon (Sapphire Rapids class, KVM; AVX-512 VNNI/BF16/FP16,
// AMX-INT8/BF16), 2 threads, Q1_0 6144 x 2048, main at 41c3a74
// (2026-12-05): AMX lost at every batch size measured (2.3x slower at
// N = 8, 1.25x at N = 64, 1.33x at N = 512), so kAuto never chooses it
// today. A faster AMX kernel adds its own figures here (with the machine
// that gave them) and kAuto follows.
inline constexpr AmxMeasure kAmxMeasured[] = {
    {8, 770, 337},
    {16, 998, 638},
    {64, 3056, 2450},
    {512, 25500, 19200},
};
static_assert(
    [] {
      for (size_t i = 1; i < std::size(kAmxMeasured); ++i)
        if (kAmxMeasured[i].n <= kAmxMeasured[i - 1].n) return false;
      return true;
    }(),
    "kAmxMeasured must be sorted by n (amx_wins takes the last entry with n <= the batch)");
// Whether kAmxMeasured says AMX is faster for a batch of n columns: the
// entry with the largest measured N <= n decides; below the smallest
// measured N (and below kAmxMinCols), never.
constexpr bool amx_wins(int64_t n) {
  if (n < kAmxMinCols) return false;
  bool wins = false;
  for (const AmxMeasure& m : kAmxMeasured) {
    if (m.n <= n) wins = m.amx_us < m.vnni_us;
  }
  return wins;
}
// Whether kAmxMeasured shows AMX winning at any batch size (kAuto uses it somewhere).
inline constexpr bool kAmxWinsSomewhere = [] {
  for (const AmxMeasure& m : kAmxMeasured)
    if (m.amx_us < m.vnni_us) return true;
  return false;
}();
// CPU has AMX-INT8 and the OS granted the tile-data permission (asked once).
bool amx_usable();
// The AMX int8 peak probe's loop (roofline.cpp): `iters` iterations of 4
// independent TDPBUSD tile products (16 x 16 x 64 multiply-adds each) on
// tiles held in registers; returns a value that depends on the results.
// Call only where amx_usable(); configures and releases the tiles itself.
uint64_t amx_peak_loop(int64_t iters);
bool amx_supports(Format f);
// Sizes a.amx_* for a.n columns (after a.resize), zeroes the padding
// columns of the last group and sets amx_ready.
void amx_setup(QuantAct& a);
// Fills a.amx_* for columns [j0, j1) from their a.q / a.d (natural Q8_0
// quants) for weights of format f. Column ranges may run concurrently.
void amx_fill_columns(Format f, QuantAct& a, int64_t j0, int64_t j1);
// Rows [r0, r1) of Y = W X with the AMX layout of `a`.
void amx_rows(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1);

// Whether the AVX-512 tier sends a batch of n columns to AMX now (the mode,
// amx_wins for kAuto, amx_usable).
bool avx512_amx_for(int64_t n);
// Whether the AVX-512 tier sends any batch to AMX (kOn, or kAuto with a
// measured win, on a CPU and OS that allow AMX). Packings of that tier are
// not made then: amx_rows reads the stored layout, and one weight copy per
// process means the stored pages are the copy it reads.
bool avx512_amx_in_use();

// The PQ2_0 twin of a PTQ1_0 matrix w (same values, chunk order and scales;
// formats.h): w with format kPQ2_0 and PQ2_0's row stride. `data` is still
// w's PTQ1_0 bytes, so only the twin's geometry and `packed` may be read. A
// PTQ1_0 matrix is packed (pack_matrix) and, on the AVX-512 tier, computed
// (kernels.cpp) as this twin.
MatrixView pq2_twin(const MatrixView& w);

// ---- Packed row-quad layout (Packing::kAvx512RowQuad; packing.cpp writes it,
// avx512_packed.inc reads it) -----------------------------------------------
// The AVX-512 grouped kernel (avx512.cpp "Grouped layout") gathers, per row
// and group of four weight units (Q1_0 blocks of 128, or 64-weight Q2_0
// units: g64 blocks, g128 halves), the 4 x 16 packed bytes into one vector Q
// and the four fp16 scales into a lane vector. The packed layout stores
// those gathers, made once at load:
//   U = units per row (cols / 128 for Q1_0, cols / 64 for Q2_0), G =
//   ceil(U / 4) groups, quads of 4 rows (the last one padded with zero rows),
//   each quad ceil(G / K) blocks of K groups:
//     [Q(Kb): 4 rows x 64 B] ... [Q(Kb+K-1)][S(Kb)] ... [S(Kb+K-1)]
//   Q row i, bytes 16u..16u+15 = unit 4g+u's packed bytes (g128: codes 3
//   rewritten to 1, both meaning 0).
//   Q1_0 and Q2_0 g64 (one scale per unit): S = 4 rows x 4 fp16 (32 B), row
//   i's fp16 u = unit 4g+u's scale; K = 2 (a "pair", kPackPairBytes).
//   Q2_0 g128 layouts (one scale per two units): S = 4 rows x 2 fp16 (16 B),
//   row i's fp16 h = the scale of the 128-weight block of units 4g+2h and
//   4g+2h+1; K = 4 (kPackG128BlockBytes). Same bytes as the stored g128 rows.
//   Units, groups and rows past the matrix are zero (zero scale, zero
//   codes), which the kernel computes exactly like the stored layout's
//   masked tail (lanes past the row add +0).
// Every Q is 64-byte aligned (K S's fill one 64-byte line) and a quad is one
// sequential stream (one prefetch stream instead of four rows' unaligned
// 72-/68-byte groups; no VPERMT2B / VPERMT2W per group and row). Same bytes
// as the stored layout, up to the padding.
inline constexpr size_t kPackQBytes = 256;           // Q of one group: 4 rows x 64 B
inline constexpr size_t kPackSBytes = 32;            // S of one group (Q1_0, g64): 4 rows x 4 fp16
inline constexpr size_t kPackPairBytes = 576;        // Q1_0, g64 block: 2 x (Q + S)
inline constexpr size_t kPackG128SBytes = 16;        // S of one group (g128): 4 rows x 2 fp16
inline constexpr size_t kPackG128BlockBytes = 1088;  // g128 block: 4 x (Q + S)

// ---- Packed tile16 layout (Packing::kTile16; packing.cpp writes it,
// avx512_tile.inc reads it; avx2_tile.inc reads its avx2-tile16 variant) -----
// Q1_0 rows of at most kTileMaxUnits units. Rows in tiles of 16 (the last
// padded with zero rows); U = cols / 128 units (blocks) per row, padded to
// even (a zero unit). A tile is U / 2 unit pairs of kTilePairBytes, tiles
// back to back:
//   [S: unit 2p's 16 fp16 scales (row order), unit 2p+1's 16 (64 B)]
//   [W(2p, k) for k = 0..3: 64 B each][W(2p+1, k) for k = 0..3]
//   W(u, k) dword r = row r's packed bytes 4k .. 4k+3 of unit u (ggml order:
//   bit b of byte i is element 8i + b), i.e. the 32 weights of sub-block k,
//   the canonical chunk of lane 4 (u mod 4) + k (see "Canonical order").
// One 64-byte vector is thus one chunk of each of 16 rows, and byte j of a
// row's dword holds two groups of 4 weights: elements 8j..8j+3 in its low
// nibble, 8j+4..8j+7 in its high one. The products look each nibble up in a
// 16-entry table of that group's signed sums (+-1 weights times the int8
// activations) (AVX-512: VPERMB, four groups per 64-entry table; AVX2:
// VPSHUFB, one group per 128-bit lane): the exact integer chunk sum, so
// results are bit-identical to every other path.
// Same bytes as the stored layout, up to the padding.
inline constexpr int64_t kTileRows = 16;
inline constexpr size_t kTileUnitBytes = 256;   // W of one unit: 4 x 64 B
inline constexpr size_t kTilePairBytes = 576;   // S + 2 units' W
inline constexpr size_t kLutBytesPerValue = 8;  // table bytes per activation value
// Longest row (in units) that gets the layout: 2,048 columns, whose tables
// (16 KiB) stay in L1 beside the weight stream (avx512_tile.inc).
inline constexpr int64_t kTileMaxUnits = 16;
// Columns per group of the tile16 path: it runs a batch column by column,
// on each thread's tables of one group at a time (measurements:
// bench/results/notes-kernels.md). It bounds the per-thread tables: kLutMaxCols x 2,048 x kLutBytesPerValue = 1 MiB per
// compute thread at most, which keeps a server's resident memory within
// its budget (rows past 2,048 columns: fewer columns, lut_group_cols).
inline constexpr int64_t kLutMaxCols = 64;

// ---- Packed avx2-tile16 layout (Packing::kAvx2Tile16; packing.cpp writes
// it, avx2_tile.inc reads it) -------------------------------------------------
// The tile16 layout above (same sizes, tiles, pairs, units and zero padding),
// for Q1_0 rows of up to kAvx2TileMaxUnits units, with two orders changed to those of the AVX2 VPSHUFB kernel:
//   * each 64-byte W(u, k) is byte-major: bytes 16 j .. 16 j + 15 hold byte
//     j (j = 0..3) of the 16 rows' dwords, row kAvx2TilePosRow[p] at byte
//     16 j + p. One 32-byte load is then [byte 0 of the rows | byte 1], the
//     next [byte 2 | byte 3]: the nibbles the kernel looks up, with no
//     regrouping (tile16 costs it two PSHUFBs, two dword unpacks and two
//     VPERMQs per 32 weights of 16 rows; bench/results/notes-kernels.md);
//   * each unit's 16 fp16 scales in the order kAvx2TileScaleRow, the order
//     of the kernel's 32-bit chunk sums (two 8-row halves), so each half
//     converts with one VCVTPH2PS.
inline constexpr int kAvx2TilePosRow[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
inline constexpr int kAvx2TileScaleRow[16] = {0, 8, 4, 12, 1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15};

// Longest row (in units) that gets the avx2-tile16 layout: 12,288 columns
// (the 8B's ffn_down). Past 2,048 columns a column's tables (8 bytes per
// value: 48 KiB at 6,144) outgrow L1 and are read from L2, and the kernel
// still wins (measurements: bench/results/notes-kernels.md).
inline constexpr int64_t kAvx2TileMaxUnits = 96;
// Columns whose tables one thread holds at once (thread_luts) for rows of
// `cols` values: kLutMaxCols up to 2,048 columns, fewer beyond, so a
// thread's tables stay within kLutMaxCols x 2,048 x kLutBytesPerValue (1 MiB).
inline int64_t lut_group_cols(int64_t cols) {
  return cols <= 2048 ? kLutMaxCols : std::max<int64_t>(1, kLutMaxCols * 2048 / cols);
}

// Whether p is a table-lookup layout (tile16 or avx2-tile16), whose
// products take any number of columns through per-thread lookup tables.
inline bool is_lut_packing(Packing p) { return p == Packing::kTile16 || p == Packing::kAvx2Tile16; }

// A growable 64-byte-aligned byte buffer for one thread's scratch (keep it
// thread_local; freed at thread exit). Its members are defined out of line
// in kernels.cpp, compiled without ISA flags, so the tier units share one
// copy that any CPU can run. get() returns at least `bytes` bytes (the old
// contents are not kept when it grows); throws std::bad_alloc.
class ThreadScratch {
 public:
  ThreadScratch() = default;
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
  ~ThreadScratch();
  uint8_t* get(size_t bytes);

 private:
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

// Builds one column's tile16 lookup tables: q [cols] int8 quants (natural
// order) -> lut [cols * kLutBytesPerValue] bytes in the tier's table order.
using LutBuildFn = void (*)(const int8_t* q, int64_t cols, uint8_t* lut);

// The calling thread's tables of columns [j0, min(n, j0 + G)) of `a`, G =
// lut_group_cols(a.cols) (a.cols * kLutBytesPerValue bytes per column, in
// that order), built with `build` unless this thread's previous call had
// the same a.gen, j0 and build (so a GEMV or a batch of <= G columns builds
// them once per thread and prepare). Tables built on one thread are read by
// that core only (tables built by the calling thread cost the other cores a
// cache-to-cache transfer of 8 bytes per value, measured slower). Valid
// until this thread's next call; at most G columns are held.
// Throws std::bad_alloc.
const uint8_t* thread_luts(const QuantAct& a, int64_t n, int64_t j0, LutBuildFn build);

// Whether the AVX-512 tier runs VBMI code (CPUID and the set_avx512_gfni
// hook), so it can read kTile16. Safe on any CPU (no AVX-512 code).
bool avx512_vbmi_in_use();

// Whether the AVX2 tier's products use AVX-VNNI (CPUID and the
// set_avx2_vnni hook). Without it the AVX2 tier reads Q1_0 as avx2-tile16
// (avx2_tile.inc); with it the pair-layout kernel was as fast or faster.
// Safe on any CPU.
bool avx2_vnni_in_use();

// True for Q8_0, Q1_0 and the Q2_0 layouts (activations get quantized).
inline bool is_quantized(Format f) { return format_def(f).family != Family::kFloat; }

// Round to nearest even and convert to int8 (NaN -> -128, as cvtps2dq's
// out-of-range result saturates); shared by the reference quantizers.
int8_t round_to_i8(float v);

// Reference Q8_0 activation quantizer for one vector of `cols` values:
// q[cols], d[cols/32]. The SIMD tiers must reproduce it bit for bit.
void quantize_act_ref(const float* x, int64_t cols, int8_t* q, float* d);

// The canonical reduction of 16 fp32 lanes (see "Canonical order").
float reduce_lanes16(const float* acc);
// Weights per canonical chunk of a quantized format (32, 16 or 4).
int64_t chunk_elems(Format f);

// Reference row products, shared as fallbacks by the SIMD tiers.
void rows_ref(const MatrixView& w, const float* x, const QuantAct* a, int64_t n, float* y, int64_t r0, int64_t r1);
void prepare_ref(Format f, const float* x, int64_t n, int64_t cols, QuantAct& a);

}  // namespace bonsai::kernels::detail
