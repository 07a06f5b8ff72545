// cpu_features.hpp: which x86 instruction sets the CPU kernels may use.
//
// Every CPU path that needs an instruction set beyond the x86-64 baseline asks
// cpu_supports() before it runs. The environment variable BIGBATCH_MAX_ISA hides the
// instruction sets above a level, as if the CPU lacked them, for the whole process:
//
//   BIGBATCH_MAX_ISA=avx512    nothing hidden (the default)
//   BIGBATCH_MAX_ISA=avx2      AVX-512 hidden: what a CPU with AVX2 + FMA + F16C runs
//   BIGBATCH_MAX_ISA=baseline  AVX2, FMA and F16C hidden too: SSE2 code only
//
// The variable is read once, at the first question asked; any other value is refused then
// with std::invalid_argument.
//
// Why and how: docs/internals.md#commoncpu_featureshpp
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace bigbatch {

/// The instruction sets some CPU path needs.
enum class CpuFeature { avx2, fma, f16c, avx512f, avx512bw, avx512dq, avx512vl };

/// Every CpuFeature, in the order of the enum.
inline constexpr std::array<CpuFeature, 7> kAllCpuFeatures = {
    CpuFeature::avx2,     CpuFeature::fma,      CpuFeature::f16c,    CpuFeature::avx512f,
    CpuFeature::avx512bw, CpuFeature::avx512dq, CpuFeature::avx512vl};

/// The feature's name as /proc/cpuinfo spells it ("avx2", "avx512f", ...).
std::string_view cpu_feature_name(CpuFeature feature);

/// True when the CPU (and the OS) supports `feature`, whatever BIGBATCH_MAX_ISA says.
bool cpu_has(CpuFeature feature);

/// True when the CPU supports `feature` and BIGBATCH_MAX_ISA does not hide it: the
/// question every dispatcher asks. Throws std::invalid_argument for a bad BIGBATCH_MAX_ISA.
bool cpu_supports(CpuFeature feature);

/// The features cpu_supports() grants, by name, separated by spaces ("avx2 fma f16c").
std::string cpu_features_supported();

/// The CPU's model name from /proc/cpuinfo, or "unknown CPU" where there is none.
std::string cpu_model_name();

/// One line for logs: the model, the features the kernels may use and, when
/// BIGBATCH_MAX_ISA hides some, which ones, e.g.
/// "AMD EPYC; kernels may use: avx2 fma f16c (BIGBATCH_MAX_ISA=avx2 hides avx512f ...)".
std::string cpu_description();

}  // namespace bigbatch
