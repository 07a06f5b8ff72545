// The instruction sets the CPU kernels may use (common/cpu_features.hpp), and
// scripts/mutation-check.sh's reading of the same CPU, which decides the plants it skips:
// BIGBATCH_MAX_ISA hides what it says under both readings, a bad value is refused by
// both, and an entry that needs a hidden set is listed as SKIPPED with the reason.
//
// The variable is read once per process, so each reading under another value runs in a
// child process: tests/tools/cpu_features, or the script.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "common/cpu_features.hpp"
#include "tests/temp_files.hpp"

namespace bigbatch {
namespace {

struct Output {
  std::string text;  ///< stdout, and stderr where the command asks for it
  int status = -1;   ///< the exit status
};

/// Runs `command` through sh with BIGBATCH_MAX_ISA set to `level`.
Output run_with_max_isa(const std::string& level, const std::string& command) {
  const std::string line = "BIGBATCH_MAX_ISA='" + level + "' " + command;
  FILE* pipe = ::popen(line.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << line;
  Output out;
  if (pipe == nullptr) return out;
  std::array<char, 512> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) out.text += buffer.data();
  const int status = ::pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (!out.text.empty() && out.text.back() == '\n') out.text.pop_back();
  return out;
}

const std::string kTool = BIGBATCH_CPU_FEATURES_TOOL;
const std::string kScript = std::string("bash ") + BIGBATCH_MUTATION_CHECK;

/// What the kernels may use under `level`, by the tool.
std::string kernels_view(const std::string& level) {
  const Output out = run_with_max_isa(level, kTool);
  EXPECT_EQ(out.status, 0) << "cpu_features under '" << level << "': " << out.text;
  return out.text;
}

TEST(CpuFeatures, NothingIsGrantedThatTheCpuLacks) {
  for (const CpuFeature feature : kAllCpuFeatures) {
    if (cpu_supports(feature)) {
      EXPECT_TRUE(cpu_has(feature)) << cpu_feature_name(feature);
    }
  }
  std::printf("this CPU has:");
  for (const CpuFeature feature : kAllCpuFeatures) {
    if (cpu_has(feature)) std::printf(" %s", std::string(cpu_feature_name(feature)).c_str());
  }
  std::printf("\n");
}

TEST(CpuFeatures, EachLevelHidesTheSetsAboveIt) {
  std::string every;  // what the CPU has, in the enum's order
  std::string up_to_avx2;
  for (const CpuFeature feature : kAllCpuFeatures) {
    if (!cpu_has(feature)) continue;
    const std::string name(cpu_feature_name(feature));
    every += (every.empty() ? "" : " ") + name;
    if (name.rfind("avx512", 0) != 0) up_to_avx2 += (up_to_avx2.empty() ? "" : " ") + name;
  }
  EXPECT_EQ(kernels_view(""), every);
  EXPECT_EQ(kernels_view("avx512"), every);
  EXPECT_EQ(kernels_view("avx2"), up_to_avx2);
  EXPECT_EQ(kernels_view("baseline"), "");
}

TEST(CpuFeatures, TheDescriptionSaysWhatIsHidden) {
  const Output out = run_with_max_isa("avx2", kTool + " --describe");
  ASSERT_EQ(out.status, 0) << out.text;
  EXPECT_EQ(out.text.rfind(cpu_model_name() + "; kernels may use: ", 0), 0u) << out.text;
  if (cpu_has(CpuFeature::avx512f)) {
    EXPECT_NE(out.text.find("(BIGBATCH_MAX_ISA=avx2 hides avx512f"), std::string::npos) << out.text;
  }
  EXPECT_NE(run_with_max_isa("baseline", kTool + " --describe")
                .text.find("kernels may use: x86-64 baseline only"),
            std::string::npos);
}

TEST(CpuFeatures, EveryKernelFamilyTakesThePathItsLevelAllows) {
  // Each level's paths, where the CPU has what they need (the GEMM's AVX-512 path needs
  // only F, the vector loops F, BW, DQ and VL).
  const bool avx2 = cpu_has(CpuFeature::avx2) && cpu_has(CpuFeature::fma) &&
                    cpu_has(CpuFeature::f16c);
  const bool avx512 = avx2 && cpu_has(CpuFeature::avx512f) &&
                      cpu_has(CpuFeature::avx512bw) && cpu_has(CpuFeature::avx512dq) &&
                      cpu_has(CpuFeature::avx512vl);
  const std::string baseline =
      "GEMM portable, optimizer portable, vector loops x86-64 baseline (SSE2)";
  const auto paths_under = [](const std::string& level) {
    const Output out = run_with_max_isa(level, kTool + " --describe");
    EXPECT_EQ(out.status, 0) << out.text;
    const auto at = out.text.find("; GEMM ");
    return at == std::string::npos ? out.text : out.text.substr(at + 2);
  };
  EXPECT_EQ(paths_under("baseline"), baseline);
  if (avx2) {
    EXPECT_EQ(paths_under("avx2"), "GEMM avx2, optimizer avx2, vector loops AVX2");
  }
  if (avx512) {
    EXPECT_EQ(paths_under("avx512"), "GEMM avx512, optimizer avx2, vector loops AVX-512");
  }
}

TEST(CpuFeatures, MutationCheckReadsTheCpuAsTheKernelsDo) {
  for (const std::string level : {"", "avx512", "avx2", "baseline"}) {
    const Output script = run_with_max_isa(level, kScript + " --cpu-features");
    EXPECT_EQ(script.status, 0) << script.text;
    EXPECT_EQ(script.text, kernels_view(level)) << "BIGBATCH_MAX_ISA='" << level << "'";
  }
}

TEST(CpuFeatures, BothRefuseALevelTheyDoNotKnow) {
  const std::string message = "BIGBATCH_MAX_ISA must be avx512, avx2 or baseline, got 'sse9'";
  for (const std::string& command : {kTool, kScript + " --cpu-features"}) {
    const Output out = run_with_max_isa("sse9", command + " 2>&1");
    EXPECT_EQ(out.status, 2) << command;
    EXPECT_NE(out.text.find(message), std::string::npos) << command << ": " << out.text;
  }
}

TEST(CpuFeatures, AnEntryNeedingAHiddenSetIsListedAsSkipped) {
  const testing::TemporaryPath list("mutations.txt");
  testing::write_file(list.str(),
                      "id: needs-avx512\nfile: kernels/gemm_cpu_avx512.cpp\n"
                      "description: a plant in AVX-512 code\noriginal: a\nreplacement: b\n"
                      "needs: avx512f\n\n"
                      "id: needs-nothing\nfile: kernels/gemm.cpp\n"
                      "description: a plant in portable code\noriginal: a\nreplacement: b\n");
  const std::string list_command = kScript + " --mutations " + list.str() + " --list";
  const Output hidden = run_with_max_isa("avx2", list_command);
  ASSERT_EQ(hidden.status, 0) << hidden.text;
  const std::string has = kernels_view("avx2");
  EXPECT_NE(hidden.text.find("SKIPPED (needs avx512f; this CPU has " +
                             (has.empty() ? std::string("none of") : has)),
            std::string::npos)
      << hidden.text;
  EXPECT_NE(hidden.text.find("\n2 mutation(s), 1 skipped on this CPU"), std::string::npos)
      << hidden.text;
  if (cpu_has(CpuFeature::avx512f)) {
    const Output granted = run_with_max_isa("avx512", list_command);
    EXPECT_EQ(granted.text.find("SKIPPED"), std::string::npos) << granted.text;
    EXPECT_NE(granted.text.find("\n2 mutation(s), 0 skipped on this CPU"), std::string::npos)
        << granted.text;
  }
}

TEST(CpuFeatures, AnUnknownSetInNeedsIsAnErrorOfTheList) {
  const testing::TemporaryPath list("mutations.txt");
  testing::write_file(list.str(),
                      "id: bad\nfile: f\ndescription: d\noriginal: a\nreplacement: b\n"
                      "needs: avx1024\n");
  const Output out = run_with_max_isa("", kScript + " --mutations " + list.str() + " --list 2>&1");
  EXPECT_EQ(out.status, 2);
  EXPECT_NE(out.text.find("entry 'bad' needs 'avx1024'"), std::string::npos) << out.text;
}

}  // namespace
}  // namespace bigbatch
