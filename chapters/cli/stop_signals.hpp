// stop_signals.hpp: SIGINT and SIGTERM as a request to stop cleanly. While a StopSignals
// lives, the first of them is recorded, and the work stops at its next check (a training
// run after its step, with a snapshot; generate after the byte it is writing); a second
// stops the process at once, as it would without one.
#pragma once

namespace bigbatch::cli {

/// Catches SIGINT and SIGTERM from its construction to its destruction (see above).
class StopSignals {
 public:
  StopSignals();   ///< catches both; none received yet
  ~StopSignals();  ///< their default actions back
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// The signal that asked to stop (SIGINT or SIGTERM), 0 while none has.
  static int received();
};

}  // namespace bigbatch::cli
