#include "common/cpu_features.hpp"

#include <cpuid.h>

#include <cstdlib>
#include <fstream>

#include "common/check.hpp"

namespace bigbatch {

namespace {

/// What BIGBATCH_MAX_ISA allows: the levels in increasing order.
enum class IsaLevel { baseline, avx2, avx512 };

/// The lowest level that includes `feature`.
IsaLevel level_of(CpuFeature feature) {
  switch (feature) {
    case CpuFeature::avx2:
    case CpuFeature::fma:
    case CpuFeature::f16c: return IsaLevel::avx2;
    case CpuFeature::avx512f:
    case CpuFeature::avx512bw:
    case CpuFeature::avx512dq:
    case CpuFeature::avx512vl: return IsaLevel::avx512;
  }
  return IsaLevel::avx512;
}

/// BIGBATCH_MAX_ISA's text, read once (the paths chosen at the first call must not change
/// under a running program).
const std::string& max_isa_setting() {
  static const std::string setting = [] {
    const char* value = std::getenv("BIGBATCH_MAX_ISA");
    return std::string(value == nullptr ? "" : value);
  }();
  return setting;
}

/// The highest level BIGBATCH_MAX_ISA allows.
IsaLevel max_level() {
  const std::string& v = max_isa_setting();
  if (v.empty() || v == "avx512") return IsaLevel::avx512;
  if (v == "avx2") return IsaLevel::avx2;
  if (v == "baseline") return IsaLevel::baseline;
  detail::fail_check(detail::concat("BIGBATCH_MAX_ISA must be avx512, avx2 or baseline, got '",
                                    v, "'"));
}

}  // namespace

std::string_view cpu_feature_name(CpuFeature feature) {
  switch (feature) {
    case CpuFeature::avx2: return "avx2";
    case CpuFeature::fma: return "fma";
    case CpuFeature::f16c: return "f16c";
    case CpuFeature::avx512f: return "avx512f";
    case CpuFeature::avx512bw: return "avx512bw";
    case CpuFeature::avx512dq: return "avx512dq";
    case CpuFeature::avx512vl: return "avx512vl";
  }
  return "?";
}

bool cpu_has(CpuFeature feature) {
  __builtin_cpu_init();  // we may run before libgcc's own constructor
  // __builtin_cpu_supports takes only a string literal, hence the switch.
  switch (feature) {
    case CpuFeature::avx2: return __builtin_cpu_supports("avx2");
    case CpuFeature::fma: return __builtin_cpu_supports("fma");
    case CpuFeature::f16c: {
      // Not every compiler's builtin knows "f16c" (clang 14's does not): CPUID leaf 1,
      // ECX bit 29, with the OS saving the AVX registers F16C works on.
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0 &&
             __builtin_cpu_supports("avx");
    }
    case CpuFeature::avx512f: return __builtin_cpu_supports("avx512f");
    case CpuFeature::avx512bw: return __builtin_cpu_supports("avx512bw");
    case CpuFeature::avx512dq: return __builtin_cpu_supports("avx512dq");
    case CpuFeature::avx512vl: return __builtin_cpu_supports("avx512vl");
  }
  return false;
}

bool cpu_supports(CpuFeature feature) {
  return level_of(feature) <= max_level() && cpu_has(feature);
}

std::string cpu_features_supported() {
  std::string names;
  for (const CpuFeature feature : kAllCpuFeatures) {
    if (!cpu_supports(feature)) continue;
    if (!names.empty()) names += ' ';
    names += cpu_feature_name(feature);
  }
  return names;
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto first = line.find_first_not_of(" \t", colon + 1);
    return first == std::string::npos ? "unknown CPU" : line.substr(first);
  }
  return "unknown CPU";
}

std::string cpu_description() {
  const std::string supported = cpu_features_supported();
  std::string line = cpu_model_name() + "; kernels may use: " +
                     (supported.empty() ? std::string("x86-64 baseline only") : supported);
  std::string hidden;
  for (const CpuFeature feature : kAllCpuFeatures) {
    if (!cpu_has(feature) || cpu_supports(feature)) continue;
    if (!hidden.empty()) hidden += ' ';
    hidden += cpu_feature_name(feature);
  }
  if (!hidden.empty()) line += " (BIGBATCH_MAX_ISA=" + max_isa_setting() + " hides " + hidden + ")";
  return line;
}

}  // namespace bigbatch
