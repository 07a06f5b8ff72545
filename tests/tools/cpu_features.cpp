// cpu_features: prints the instruction sets the CPU kernels may use on this machine
// (common/cpu_features.hpp: what the CPU has, less what BIGBATCH_MAX_ISA hides), on one
// line separated by spaces, as scripts/mutation-check.sh computes them; with --describe,
// the line the test logs print (the CPU model, the sets, what is hidden, and the path
// each kernel family takes).
//
// Usage: cpu_features [--describe]     exit 2 for a bad argument or BIGBATCH_MAX_ISA
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "common/cpu_features.hpp"
#include "kernels/cpu_paths.hpp"

int main(int argc, char** argv) {
  const bool describe = argc == 2 && std::string_view(argv[1]) == "--describe";
  if (argc > 2 || (argc == 2 && !describe)) {
    std::fprintf(stderr, "usage: %s [--describe]\n", argv[0]);
    return 2;
  }
  try {
    const std::string line =
        describe ? bigbatch::cpu_description() + "; " + bigbatch::cpu::cpu_paths_in_use()
                 : bigbatch::cpu_features_supported();
    std::printf("%s\n", line.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cpu_features: %s\n", error.what());
    return 2;
  }
  return 0;
}
