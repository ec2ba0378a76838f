// Helpers for the kernel tests: deterministic random weight matrices in every
// Format, and double-precision reference products.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "kernels/kernels.h"

namespace bonsai::kernels::testing {

inline constexpr Format kAllFormats[] = {Format::kF32,   Format::kF16,   Format::kBF16,      Format::kQ8_0,
                                         Format::kQ1_0,  Format::kQ2_0,  Format::kQ2_0G128D, Format::kQ2_0G128Qs,
                                         Format::kPQ2_0, Format::kPTQ1_0};
// The quantized ones.
inline constexpr Format kQuantFormats[] = {Format::kQ8_0,       Format::kQ1_0,  Format::kQ2_0,  Format::kQ2_0G128D,
                                           Format::kQ2_0G128Qs, Format::kPQ2_0, Format::kPTQ1_0};

// Byte offset of the fp16 scale inside a block of a quantized format.
inline size_t scale_offset(Format f) { return static_cast<size_t>(format_def(f).d_offset); }

// A random matrix of `rows` x `cols` in format f, rows packed back to back.
// Quantized blocks get random payload bytes (all codes, incl. Q2 code 3) and
// fp16 scales drawn from [smin, smax]; float formats get N(0, 1)-ish values.
struct RandomMatrix {
  std::vector<uint8_t> bytes;
  MatrixView view;
};

inline RandomMatrix random_matrix(Format f, int64_t rows, int64_t cols, uint32_t seed, float smin = 0.005f,
                                  float smax = 0.05f) {
  RandomMatrix m;
  const size_t rb = row_bytes(f, cols);
  m.bytes.resize(rb * static_cast<size_t>(rows) + 64);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(smin, smax);
  if (f == Format::kF32 || f == Format::kF16 || f == Format::kBF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = normal(rng);
      if (f == Format::kF32) {
        std::memcpy(m.bytes.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = f == Format::kF16 ? core::fp32_to_fp16(v) : core::fp32_to_bf16(v);
        std::memcpy(m.bytes.data() + 2 * i, &h, 2);
      }
    }
  } else {
    // splitmix64 fills 8 bytes at a time (fast for the 150k-row shapes).
    uint64_t state = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (size_t i = 0; i < rb * static_cast<size_t>(rows); i += 8) {
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      std::memcpy(m.bytes.data() + i, &z, 8);  // bytes has 64 bytes of slack
    }
    const size_t bb = block_bytes(f);
    const size_t nblocks = rb * static_cast<size_t>(rows) / bb;
    for (size_t b = 0; b < nblocks; ++b) {
      const uint16_t h = core::fp32_to_fp16(scale(rng));
      std::memcpy(m.bytes.data() + b * bb + scale_offset(f), &h, 2);
    }
  }
  m.view = MatrixView{m.bytes.data(), f, rows, cols, rb};
  return m;
}

// Random activations: N(0, sigma) with a few larger outliers.
inline std::vector<float> random_vector(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(rng);
  for (int64_t i = 0; i < n; i += 97) v[static_cast<size_t>(i)] *= 8.0f;
  return v;
}

// n activation columns of `cols` floats each, column j = random_vector(cols,
// seed + j) with a spread that varies by column ([n][cols], column-major by
// column, as gemm takes it).
inline std::vector<float> random_batch(int64_t n, int64_t cols, uint32_t seed) {
  std::vector<float> x;
  for (int64_t j = 0; j < n; ++j) {
    const auto v = random_vector(cols, seed + static_cast<uint32_t>(j), 0.3f + 0.2f * (j % 7));
    x.insert(x.end(), v.begin(), v.end());
  }
  return x;
}

// Row r of the matrix dequantized.
inline std::vector<float> dequant_row(const MatrixView& w, int64_t r) {
  std::vector<float> out(static_cast<size_t>(w.cols));
  dequantize_row(w.format, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride, out.data(),
                 w.cols);
  return out;
}

inline bool is_quantized(Format f) { return f != Format::kF32 && f != Format::kF16 && f != Format::kBF16; }

// The activations as the quantized products see them: x rounded through Q8_0
// blocks for quantized weight formats, x itself for float formats.
inline std::vector<float> effective_x(Format f, const float* x, int64_t cols) {
  std::vector<float> out(x, x + cols);
  if (!is_quantized(f)) return out;
  std::vector<uint8_t> q(row_bytes(Format::kQ8_0, cols));
  quantize_row_q8_0(x, q.data(), cols);
  dequantize_row(Format::kQ8_0, q.data(), out.data(), cols);
  return out;
}

// sum |w| |x| and sum w x in double for row r.
struct DotD {
  double dot = 0.0;
  double abs = 0.0;
};
inline DotD dot_double(const std::vector<float>& w, const std::vector<float>& x) {
  DotD d;
  for (size_t i = 0; i < w.size(); ++i) {
    d.dot += static_cast<double>(w[i]) * x[i];
    d.abs += std::fabs(static_cast<double>(w[i]) * x[i]);
  }
  return d;
}

// Float tolerance of one output against an exact (double) or another
// float-order result: the standard worst-case bound for summing `terms`
// float products in any order, 2 * terms * u * sum|w x| with u = 2^-24,
// plus a tiny absolute floor.
inline double float_tol(int64_t terms, double abs_sum) {
  return static_cast<double>(terms + 16) * std::ldexp(1.0, -23) * abs_sum + 1e-30;
}

// Number of sequential fp32 adds in a row product: one per 32-value
// sub-block plus one per scaled group (64 weights for the Q2_0 layouts,
// whose g128 blocks are scaled per half; 128 otherwise) for quantized
// formats, one per element for float formats.
inline int64_t sum_terms(Format f, int64_t cols) {
  if (!is_quantized(f)) return cols;
  const Family fam = format_def(f).family;
  const bool q2 = fam == Family::kCode2 || fam == Family::kTrit;  // scaled per 16-weight chunk, summed per 64
  return cols / 32 + cols / (q2 ? 64 : 128);
}

}  // namespace bonsai::kernels::testing
