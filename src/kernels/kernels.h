// Block-format kernels: dequantize, quantize (reference), GEMV and GEMM for
// the weight formats Bonsai files use, with a scalar reference tier and SIMD
// tiers (AVX2, AVX-512, NEON) chosen at run time. Formats are bit-exact with
// ggml's definitions (llama.cpp ggml-quants.c / ggml-common.h); formats.h
// defines each one (block struct, geometry, reference decode).
//
// Threading: gemv/gemm split rows over the given pool; everything else is
// single-threaded. All functions are thread-safe (no shared mutable state
// other than the tier selection, which is set once at start-up).
//
// Arithmetic of the quantized products (every tier, see internal.h): the
// activations are quantized to Q8_0 blocks of 32 (d = amax/127 rounded to
// fp16, q = round-to-nearest-even(x/d), as llama.cpp's quantize_row_q8_0),
// the integer dot product of each chunk of 32 (Q1_0), 16 (Q2_0) or 4 (Q8_0)
// weights is exact in int32, and the fp32 scaling follows one canonical
// order (chunk c -> accumulator lane c mod 16, then a fixed 16-lane tree).
// Every tier and path (GEMV, small batches, large GEMM, AMX, any thread
// split) reproduces it exactly, so results are bit-identical to the
// reference tier and batch invariant: a column's result does not depend on
// n, on the other columns or on the thread count. Float weight formats are
// batch invariant within a tier (tiers differ in fp32 order).
// Tiers (kernels/*.cpp, each compiled with its own ISA flags): reference
// (scalar), avx2 (AVX2+FMA+F16C), avx512 (F/BW/VL/DQ + VNNI; GFNI and VBMI
// when present; AMX-INT8 tiles for batches of >= 6 columns when the CPU and
// OS allow), neon (arm64).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"
#include "core/ggml_types.h"
#include "kernels/formats.h"

namespace bonsai::core {
class ThreadPool;
}

namespace bonsai::kernels {

// Format (the weight/row formats) and their definitions: formats.h.

// Maps a tensor's ggml type (and, for id 42, its layout) to a Format.
// nullopt for types the kernels cannot compute on (e.g. Q4_K).
std::optional<Format> format_of(core::GgmlType type, core::Q2Layout q2_layout = core::Q2Layout::kG64);
std::string_view format_name(Format f);  // "Q1_0", "Q2_0(g128-d-first)", ... (FormatDef::name)
int64_t block_elems(Format f);           // weights per block (FormatDef::block_elems)
size_t block_bytes(Format f);            // bytes per block (FormatDef::block_bytes)
// Bytes of one row of n elements (n must be a multiple of block_elems).
inline size_t row_bytes(Format f, int64_t n) { return static_cast<size_t>(n / block_elems(f)) * block_bytes(f); }

// ---- Tiers -----------------------------------------------------------------
// arm64: kNeon (Advanced SIMD, every ARMv8-A CPU), kNeonDotprod (+ SDOT,
// ARMv8.2-A DotProd), kNeonI8mm (+ SDOT and SMMLA, ARMv8.6-A I8MM), chosen
// from getauxval(AT_HWCAP / AT_HWCAP2).
enum class Tier : uint8_t { kReference, kAvx2, kAvx512, kNeon, kNeonDotprod, kNeonI8mm };
// Every tier, in enum order (tests and tools that try each one).
inline constexpr Tier kAllTiers[] = {Tier::kReference, Tier::kAvx2,        Tier::kAvx512,
                                     Tier::kNeon,      Tier::kNeonDotprod, Tier::kNeonI8mm};
// "reference", "avx2", "avx512", "neon", "neon-dotprod", "neon-i8mm"
std::string_view tier_name(Tier t);
std::optional<Tier> parse_tier(std::string_view name);
bool tier_supported(Tier t);  // built in AND the CPU has it
Tier best_tier();             // fastest supported
Tier active_tier();           // what gemv/gemm use now
// Errors: kUnsupported "kernel tier 'avx512' is not supported by this CPU".
core::Expected<void> set_active_tier(Tier t);
// Applies env BONSAI_KERNEL=reference|avx2|avx512|avx512-amx|neon|
// neon-dotprod|neon-i8mm if set
// (else best_tier(), with the AMX GEMM used only where its measured table
// says it wins: internal.h kAmxMeasured). "avx512" is the AVX-512 tier with
// AMX off; "avx512-amx" is that tier with the AMX GEMM for every batch of
// >= 6 columns (and no repacked weights, since AMX reads the stored layout).
// Call it before loading weights: the packing of each matrix follows it.
// Errors: kInvalidArgument for an unknown name, kUnsupported as above, or
// "avx512-amx" where the CPU or OS does not allow AMX.
core::Expected<void> init_tier_from_env();
// What runs the products now: tier_name(active_tier()), plus "-amx" where
// the AVX-512 tier sends batches to AMX ("avx512-amx"). For logs and benches.
std::string kernel_name();

// ---- Rows --------------------------------------------------------------------
// Dequantizes n elements (a multiple of block_elems(f)) of `src` to float.
void dequantize_row(Format f, const void* src, float* dst, int64_t n);
// Reference quantizers (n a multiple of the block size).
//   Q8_0: d = amax/127 (fp16), q = round(x/d)        (ggml quantize_row_q8_0_ref)
//         computed as round-to-nearest-even(x * (1/d)) with the unrounded d,
//         as ggml's SIMD quantize_row_q8_0 does at inference (the _ref variant
//         rounds exact ties away from zero; the two differ only on ties).
//   Q1_0: d = mean |x| over the block, bit = x >= 0
//   Q2_0 (g64): d = amax of the block, code = round(x/d) + 1 in {0,1,2}
void quantize_row_q8_0(const float* src, void* dst, int64_t n);
void quantize_row_q1_0(const float* src, void* dst, int64_t n);
void quantize_row_q2_0(const float* src, void* dst, int64_t n);

// ---- Matrix products -------------------------------------------------------------
// A load-time repacked layout of a quantized weight matrix (issue 8,
// decision 2: allowed where measurably faster; DESIGN.md "Weights"). A
// packing belongs to one tier, which reads the packed copy; every other tier
// reads the matrix in its stored layout, so a packed view is correct under
// any tier. Bit-identical results either way (the canonical order of
// internal.h does not depend on the layout).
enum class Packing : uint8_t {
  kNone,
  // AVX-512 tier, Q1_0 and the three Q2_0 layouts (see internal.h "Packed
  // row-quad layout"): per quad of 4 rows, the group gathers of the grouped
  // kernel done once at load, 64-byte aligned, in one stream with the scales.
  kAvx512RowQuad,
  // Q1_0 rows of up to 2,048 columns (see internal.h "Packed tile16
  // layout"): 16-row tiles whose 64-byte vectors hold one 32-weight
  // sub-block of each of the 16 rows, for the table-lookup products, any
  // number of columns: the AVX-512 tier with VBMI (VPERMB) chooses it.
  kTile16,
  // AVX2 tier without AVX-VNNI (VPSHUFB lookups), Q1_0 rows of up to 12,288
  // columns: tile16 with each 64-byte vector byte-major (16 bytes per byte
  // position, rows in the kernel's lane order) and the scales in the order
  // of its sums (internal.h "Packed avx2-tile16 layout"), so the kernel
  // loads what it looks up without regrouping.
  kAvx2Tile16,
};
inline constexpr size_t kPackingCount = 4;  // values of Packing (0 .. kPackingCount - 1)
static_assert(kPackingCount == static_cast<size_t>(Packing::kAvx2Tile16) + 1, "kPackingCount: update with Packing");
std::string_view packing_name(Packing p);  // "none", "avx512-row-quad", "tile16", "avx2-tile16"

// A row-major weight matrix in one Format: `rows` rows of `cols` elements,
// row r at (const uint8_t*)data + r * row_stride. Borrowed (points into the
// model mapping); must outlive the call.
// `packed`, when not null, is a copy of the same matrix in layout `packing`
// (pack_matrix), owned by whoever owns the view (the Model) and read only by
// the tier that defines `packing`; `data` stays valid (pages released after
// packing fault back in from the file if another tier reads them).
struct MatrixView {
  const void* data = nullptr;
  Format format = Format::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_stride = 0;             // bytes
  const void* packed = nullptr;      // 64-byte aligned, packed_bytes(*this, packing) bytes
  Packing packing = Packing::kNone;  // layout of `packed`
};

// The packing the active tier computes `w` faster with, kNone where there is
// none (float and Q8_0 formats, tiers without a packing, the AVX-512 tier
// when its AMX path is in use: AMX reads the stored layout; the AVX2 tier
// packs only Q1_0, as avx2-tile16, and only without AVX-VNNI) or where the layout's
// padding would add more than 1/32 of the tensor's bytes.
Packing packing_for(const MatrixView& w);
// Bytes of w's copy in layout p (0 for kNone, and for a layout not defined
// for w's format or shape); a multiple of 64.
size_t packed_bytes(const MatrixView& w, Packing p);
// Writes w's copy in layout p to dst (packed_bytes(w, p) bytes, 64-byte
// aligned), reading w.data; rows are split over `pool` (nullptr: the calling
// thread). p must be packing_for(w) (a layout defined for w.format), not kNone.
void pack_matrix(const MatrixView& w, Packing p, void* dst, core::ThreadPool* pool);

// Load-time transcoding (issue 30 item 4): PTQ1_0 (28 bytes per 128
// ternary weights) is computed by the AVX2 trit kernels at 0.52-0.56x the
// weights per second of PQ2_0's (34 bytes; bench/results/ptq1_0-simd-
// 2026-12-06-zen3.txt: compute-bound decoding the base-3 digits), so where
// that holds the model copies a PTQ1_0 matrix once into PQ2_0 at load (one
// copy, 34/28 = 1.21x the bytes, the mapped pages released) and runs the
// PQ2_0 kernels. The two formats share the Q2_0 chunk order, so the
// products are bit-identical either way. The AVX-512 tier goes one step
// further: packing_for gives a PTQ1_0 matrix the row-quad layout of its PQ2_0
// twin (the same 34/28 of the bytes; pack_matrix has each thread transcode
// up to 16 quads' rows into an L2-sized scratch and pack them), `data` keeps
// the file's PTQ1_0 bytes
// for every other tier, and the products run the row-quad PQ2_0 kernel: on
// Zen 5, 17408 x 5120 GEMV from DRAM at 2 threads 1.55x the stored PQ2_0
// layout's, the 27B shape's tg32 1.27-1.61x the transcoded build's
// (bench/results/ptq1-rowquad-2026-12-06-zen5.txt).
// The format `w` is better computed in on the active tier: kPQ2_0 for a
// PTQ1_0 matrix on the AVX2 tier and on the AVX-512 tier where it is not
// packed instead (packing_for), else w.format (no change).
Format transcode_target(const MatrixView& w);
// Writes w (PTQ1_0) as PQ2_0 rows to dst (w.rows * row_bytes(kPQ2_0,
// w.cols) bytes; block b of a row keeps its fp16 scale bits and each digit
// t becomes the 2-bit code t, i.e. weight t - 1): rows split over `pool`
// (nullptr: the calling thread). w.format must be kPTQ1_0. Rows go through
// the AVX2 digit decode on the AVX2 and AVX-512 tiers, else (the reference
// and ARM tiers) a scalar table form:
// the same bytes (bench/results/ptq1-load-2026-12-07-zen5.txt: 6.2 against
// 2.2 GB/s of input per Zen 5 thread).
void transcode_ptq1_0_to_pq2_0(const MatrixView& w, void* dst, core::ThreadPool* pool);

namespace detail {
struct QuantAct;
}

// Scratch of a product's quantized activations ([n][cols] int8 quants plus
// scales and the tier's layouts, ~2.3 bytes per input value): grown to the
// largest batch seen, reused, freed with its owner. The model keeps one per
// Workspace, so the scratch lives (and is counted) with the sequence or
// step loop that runs the forward pass, not with a thread. Not thread-safe:
// one product at a time per scratch.
class ActScratch {
 public:
  ActScratch();
  ~ActScratch();
  ActScratch(ActScratch&&) noexcept;
  ActScratch& operator=(ActScratch&&) noexcept;
  ActScratch(const ActScratch&) = delete;
  ActScratch& operator=(const ActScratch&) = delete;
  size_t bytes() const;  // allocated bytes
  detail::QuantAct& act() { return *act_; }

 private:
  std::unique_ptr<detail::QuantAct> act_;
};

// y[r] = sum_c W[r][c] * x[c] for r in [0, rows). x: cols floats, y: rows floats.
// Uses the active tier; pool == nullptr runs on the calling thread.
// `scratch`: where the activations are quantized (nullptr: a scratch of the
// calling thread that lives as long as it, for tests and benchmarks).
void gemv(const MatrixView& w, const float* x, float* y, core::ThreadPool* pool, ActScratch* scratch = nullptr);

// Y[j][r] = sum_c W[r][c] * X[j][c] for j in [0, n). X: [n][cols] row-major,
// Y: [n][rows] row-major. Column j is bit-identical to gemv of X[j] (batch
// invariance, any n and pool).
void gemm(const MatrixView& w, const float* x, int64_t n, float* y, core::ThreadPool* pool,
          ActScratch* scratch = nullptr);

// Several matrices applied to the same activations in one threaded pass:
// Y_i = W_i X for i < count (X: [n][cols], ys[i]: [n][ws[i].rows]). All
// ws[i] must have the same cols. When they also share a format (e.g. the Q,
// K, V projections, or ffn gate and up) the activations are quantized once
// and all rows go through one pool dispatch; otherwise this is `count` gemm
// calls. Results equal the separate gemm calls exactly.
void gemm_multi(const MatrixView* ws, int count, const float* x, int64_t n, float* const* ys, core::ThreadPool* pool,
                ActScratch* scratch = nullptr);

// Several matrices applied to the same activations, computed in `units`
// aligned slices with an epilogue per slice, in one pool dispatch:
// Y_i = W_i X for i < count (X: [n][cols], ys[i]: [n][ws[i].rows]); unit u
// covers rows [u * R_i, (u + 1) * R_i) of every matrix i, R_i = ws[i].rows /
// units (every ws[i].rows must be a multiple of `units`). Once a run of units
// [u0, u1) is computed for all n columns, epilogue(ctx, u0, u1) runs on the
// same thread, so per-slice work that needs the slice of every output (QK-norm
// + RoPE + cache store + attention of a KV head; silu(gate) * up) rides the
// product's hand-off instead of a dispatch of its own. Each unit reaches the
// epilogue exactly once; the epilogue may call pool->parallel_for (it runs
// inline inside a pool task, in parallel when there is no pool split). Runs of
// units are sized like gemm's row chunks (one per thread for GEMV and small
// batches). Products equal the separate gemm calls exactly (a row split never
// changes a result). Matrices of different formats or cols: the products run
// one by one, then epilogue(ctx, 0, units) once on the calling thread.
void gemm_units(const MatrixView* ws, int count, const float* x, int64_t n, float* const* ys, int64_t units,
                void (*epilogue)(void* ctx, int64_t u0, int64_t u1), void* ctx, core::ThreadPool* pool,
                ActScratch* scratch = nullptr);

// gemm_units with any callable epilogue(u0, u1) (must not throw).
template <class F>
void gemm_units(const MatrixView* ws, int count, const float* x, int64_t n, float* const* ys, int64_t units,
                F&& epilogue, core::ThreadPool* pool, ActScratch* scratch = nullptr) {
  auto tramp = [](void* c, int64_t u0, int64_t u1) { (*static_cast<std::remove_reference_t<F>*>(c))(u0, u1); };
  gemm_units(ws, count, x, n, ys, units, +tramp, const_cast<void*>(static_cast<const void*>(std::addressof(epilogue))),
             pool, scratch);
}

// Same as gemv/gemm but on rows [row_begin, row_end) with an explicit tier,
// single-threaded; for tests and benchmarks. The tier must be supported.
void gemm_rows(Tier tier, const MatrixView& w, const float* x, int64_t n, float* y, int64_t row_begin, int64_t row_end);

// ---- Float vector helpers (attention, norms); active tier --------------------------
float dot_f32(const float* a, const float* b, int64_t n);
float dot_f16_f32(const uint16_t* a, const float* b, int64_t n);  // a: fp16 bits
void axpy_f32(float alpha, const float* x, float* y, int64_t n);  // y += alpha * x
void axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n);
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n);
// Index of the first element equal to the largest non-NaN value of p[0, n)
// (n >= 1): the first i with p[i] > p[best] scanning from best = 0, so a NaN
// at index 0 stays the answer, NaNs elsewhere never win and the earlier of
// -0 / +0 wins. SSE2 (x86-64's baseline) or NEON (arm64's) where built for
// it, else scalar; same answer every way. Greedy sampling's argmax over the vocabulary.
int64_t argmax_f32(const float* p, int64_t n);

}  // namespace bonsai::kernels
