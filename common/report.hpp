// report.hpp: the self-checking report every chapter demo prints.
//
//   SelfCheck report("chapter 02");
//   report.section("Uneven micro-batches");
//   report.check(bitwise, "15 x 64 + 40 equals one batch of 1000, bit for bit");
//   return report.finish();   // prints PASSED/FAILED, returns the exit status
//
// and the command line every demo takes: --quick (the CTest setting) and, for a demo that
// draws a figure, --write-data FILE (parse_demo_options, write_demo_data).
#pragma once

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "common/json.hpp"

namespace bigbatch {

/// Counts a demo's checks, prints each with its verdict, and turns the result into the
/// process exit status (see the example above).
class SelfCheck {
 public:
  /// A report named `name` (printed with the verdict) with no checks yet.
  explicit SelfCheck(std::string name) : name_(std::move(name)) {}

  /// Prints a heading that starts a new group of checks.
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

/// A demo's command-line options, filled by parse_demo_options().
struct DemoOptions {
  bool quick = false;     ///< --quick: the CTest setting (smaller and faster)
  std::string data_file;  ///< --write-data FILE: the figure's data, as JSON
};

/// Parses a demo's arguments into `options`. On --help or an unknown argument prints
/// "usage: PROGRAM [--quick] [--write-data FILE]" and `about`, and returns the exit status
/// to end with (0 for --help, 2 otherwise); returns std::nullopt to go on.
inline std::optional<int> parse_demo_options(int argc, char** argv, const std::string& about,
                                             DemoOptions& options) {
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--write-data" && a + 1 < argc) {
      options.data_file = argv[++a];
    } else {
      std::printf("usage: %s [--quick] [--write-data FILE]\n%s\n", argv[0], about.c_str());
      return arg == "--help" ? 0 : 2;
    }
  }
  return std::nullopt;
}

/// Writes `data` to the --write-data file when one was given; false (with a message on
/// stderr) when it cannot be written.
inline bool write_demo_data(const DemoOptions& options, const Json& data) {
  if (options.data_file.empty()) return true;
  std::ofstream out(options.data_file);
  out << data.dump() << "\n";
  if (!out) std::fprintf(stderr, "cannot write %s\n", options.data_file.c_str());
  return static_cast<bool>(out);
}

}  // namespace bigbatch
