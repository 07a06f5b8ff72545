// gtest_main.cpp: the main() of every GoogleTest program here. It is GoogleTest's own,
// plus one line at the start of a run that names the CPU, the instruction sets the
// kernels may use (common/cpu_features.hpp) and the path each kernel family takes, so
// that every test's log says which CPU paths it ran: a run under BIGBATCH_MAX_ISA=avx2
// says so.
#include <gtest/gtest.h>

#include <cstdio>

#include "common/cpu_features.hpp"
#include "kernels/cpu_paths.hpp"

namespace {

/// Prints the CPU line when the tests start (not when they are only listed: CTest's
/// discovery reads that listing).
class CpuReport : public ::testing::Environment {
 public:
  void SetUp() override {
    std::printf("CPU: %s; %s\n", bigbatch::cpu_description().c_str(),
                bigbatch::cpu::cpu_paths_in_use().c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new CpuReport);  // GoogleTest owns it
  return RUN_ALL_TESTS();
}
