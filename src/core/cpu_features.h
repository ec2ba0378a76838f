// Run-time CPU feature detection (CPUID + XGETBV on x86-64, getauxval's
// AT_HWCAP / AT_HWCAP2 on arm64 Linux). Used by kernels/ to pick a SIMD tier; never by the build.
#pragma once

#include <string>

namespace bonsai::core {

// What the running CPU and OS support. All false on an unknown architecture.
struct CpuFeatures {
  bool avx2 = false;     // AVX2 + FMA + F16C, and the OS saves YMM state
  bool avx512f = false;  // AVX-512 F, and the OS saves ZMM/opmask state
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;  // vpdpbusd
  bool avx512vbmi = false;  // vpermb / vpermt2b (AVX512_VBMI)
  bool avx512bf16 = false;
  bool avx_vnni = false;   // VEX-encoded vpdpbusd
  bool gfni = false;       // GF2P8AFFINEQB (CPUID; the AVX-512 tier uses its EVEX form)
  bool amx_int8 = false;   // AMX tiles with int8 (OS permission not requested here)
  bool neon = false;       // arm64 Advanced SIMD
  bool dotprod = false;    // arm64 sdot (FEAT_DotProd, HWCAP_ASIMDDP)
  bool i8mm = false;       // arm64 smmla (FEAT_I8MM, HWCAP2_I8MM)
  int physical_cores = 1;  // best effort: /sys topology, else hardware_concurrency

  // Comma-separated list of the true flags, e.g. "avx2,avx512f,avx512bw".
  std::string to_string() const;
};

// Detected once, thread-safe (function-local static).
const CpuFeatures& cpu_features();

}  // namespace bonsai::core
