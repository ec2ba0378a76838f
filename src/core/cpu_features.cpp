#include "core/cpu_features.h"

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace bonsai::core {
namespace {

int count_physical_cores() {
  // Count distinct (physical package, core id) pairs from sysfs.
  std::set<std::pair<int, int>> cores;
  const unsigned n = std::thread::hardware_concurrency();
  for (unsigned cpu = 0; cpu < n; ++cpu) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core_f(base + "core_id");
    std::ifstream pkg_f(base + "physical_package_id");
    int core = -1;
    int pkg = -1;
    if (!(core_f >> core) || !(pkg_f >> pkg)) continue;
    cores.emplace(pkg, core);
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  return n > 0 ? static_cast<int>(n) : 1;
}

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(_M_X64)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1u;
  const bool fma = (ecx >> 12) & 1u;
  const bool f16c = (ecx >> 29) & 1u;
  const bool avx = (ecx >> 28) & 1u;
  unsigned long long xcr0 = 0;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool ymm_os = (xcr0 & 0x6u) == 0x6u;
  const bool zmm_os = (xcr0 & 0xe6u) == 0xe6u;
  const bool amx_os = (xcr0 & 0x60000u) == 0x60000u;
  unsigned b7 = 0, c7 = 0, d7 = 0, a7 = 0;
  __cpuid_count(7, 0, a7, b7, c7, d7);
  unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  __cpuid_count(7, 1, a71, b71, c71, d71);
  f.avx2 = avx && ymm_os && fma && f16c && ((b7 >> 5) & 1u);
  f.avx512f = zmm_os && ((b7 >> 16) & 1u);
  f.avx512bw = f.avx512f && ((b7 >> 30) & 1u);
  f.avx512vl = f.avx512f && ((b7 >> 31) & 1u);
  f.avx512vnni = f.avx512f && ((c7 >> 11) & 1u);
  f.avx512vbmi = f.avx512f && ((c7 >> 1) & 1u);
  f.avx512bf16 = f.avx512f && ((a71 >> 5) & 1u);
  f.avx_vnni = ymm_os && ((a71 >> 4) & 1u);
  f.gfni = (c7 >> 8) & 1u;
  f.amx_int8 = amx_os && ((d7 >> 25) & 1u) && ((d7 >> 24) & 1u);
#elif defined(__aarch64__)
  // Advanced SIMD is part of every ARMv8-A Linux target. The optional
  // extensions come from the kernel's hardware capabilities (Linux
  // Documentation/arch/arm64/elf_hwcaps.rst; bit values of
  // arch/arm64/include/uapi/asm/hwcap.h): HWCAP_ASIMDDP (SDOT, bit 20 of
  // AT_HWCAP), HWCAP2_I8MM (SMMLA, bit 13 of AT_HWCAP2).
  f.neon = true;
#if defined(__linux__)
  constexpr unsigned long kHwcapAsimd = 1ul << 1, kHwcapAsimdDp = 1ul << 20, kHwcap2I8mm = 1ul << 13;
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.neon = (hw & kHwcapAsimd) != 0;
  f.dotprod = f.neon && (hw & kHwcapAsimdDp) != 0;
  f.i8mm = f.neon && (hw2 & kHwcap2I8mm) != 0;
#endif
#endif
  f.physical_cores = count_physical_cores();
  return f;
}

}  // namespace

std::string CpuFeatures::to_string() const {
  std::string s;
  auto add = [&s](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ',';
    s += name;
  };
  add(avx2, "avx2");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512vnni");
  add(avx512vbmi, "avx512vbmi");
  add(avx512bf16, "avx512bf16");
  add(avx_vnni, "avxvnni");
  add(gfni, "gfni");
  add(amx_int8, "amx_int8");
  add(neon, "neon");
  add(dotprod, "dotprod");
  add(i8mm, "i8mm");
  return s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace bonsai::core
