#include "chapters/cli/stop_signals.hpp"

#include <csignal>

namespace bigbatch::cli {
namespace {

volatile std::sig_atomic_t g_received = 0;

extern "C" void record_stop(int signal) {
  g_received = signal;
  std::signal(signal, SIG_DFL);  // a second one stops at once
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  std::signal(SIGINT, record_stop);
  std::signal(SIGTERM, record_stop);
}

StopSignals::~StopSignals() {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

int StopSignals::received() { return g_received; }

}  // namespace bigbatch::cli
