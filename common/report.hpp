// report.hpp: the self-checking report every chapter demo prints.
//
//   SelfCheck report("chapter 02");
//   report.section("Uneven micro-batches");
//   report.check(bitwise, "15 x 64 + 40 equals one batch of 1000, bit for bit");
//   return report.finish();   // prints PASSED/FAILED, returns the exit status
#pragma once

#include <cstdio>
#include <string>
#include <utility>

namespace bigbatch {

class SelfCheck {
 public:
  explicit SelfCheck(std::string name) : name_(std::move(name)) {}

  void section(const std::string& title) {
    std::printf("\n-- %s\n", title.c_str());
    std::fflush(stdout);
  }

  /// Prints the line with PASS or FAILED; remembers a failure.
  bool check(bool ok, const std::string& claim) {
    std::printf("   [%s] %s\n", ok ? "PASS" : "FAILED", claim.c_str());
    std::fflush(stdout);
    failures_ += ok ? 0 : 1;
    ++checks_;
    return ok;
  }

  /// Prints an informational line (a measurement, not a claim).
  void note(const std::string& text) { std::printf("   %s\n", text.c_str()); }

  /// Prints the verdict and returns the process exit status (0 when every check held).
  int finish() const {
    std::printf("\n%s: %s (%d of %d checks held)\n", name_.c_str(),
                failures_ == 0 ? "PASSED" : "FAILED", checks_ - failures_, checks_);
    return failures_ == 0 ? 0 : 1;
  }

 private:
  std::string name_;
  int checks_ = 0;
  int failures_ = 0;
};

}  // namespace bigbatch
