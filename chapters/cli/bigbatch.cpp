// bigbatch.cpp: the command-line program. `bigbatch train` trains the model of
// nn/model.hpp (or chapter 08's GPT) on a data set (train_command.hpp); `bigbatch plan` lists
// the plans whose step fits a memory budget (plan_command.hpp); `bigbatch generate` prints
// what a trained GPT writes after a prompt (generate_command.hpp). The flags are read, typed, in options.hpp.
//
// Exit codes: 0 success, 1 any other failure, 2 bad input (flags, data, files),
// 3 out of memory (the allocator's cap, --device-memory, or the device itself).
// Every error is one line on stderr that names the flag or file at fault.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>

#include "chapters/cli/generate_command.hpp"
#include "chapters/cli/options.hpp"
#include "chapters/cli/plan_command.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/cli/train_command.hpp"
#include "collectives/communicator.hpp"
#include "common/cpu_features.hpp"
#include "common/memory.hpp"

namespace {

constexpr const char* kExitCodes =
    "Exit codes: 0 success; 1 any other failure; 2 bad input (flags, data or files; "
    "nothing is trained); 3 out of memory (past --device-memory or the device's own: the "
    "machine's memory for the CPU); "
    "130 or 143 stopped by SIGINT or SIGTERM (after a snapshot, with --snapshot-dir).";

}  // namespace

int main(int argc, char** argv) {
  using namespace bigbatch;
  using namespace bigbatch::cli;
  CLI::App app{"bigbatch: large effective batches on one GPU"};
  app.require_subcommand(1);
  std::string cpu;  // the CPU paths the kernels may take (BIGBATCH_MAX_ISA hides some)
  try {
    cpu = cpu_description();
  } catch (const std::invalid_argument& e) {
    std::cerr << "bigbatch: " << e.what() << "\n";
    return kExitBadInput;
  }
  app.set_version_flag("--version", std::string("bigbatch ") + BIGBATCH_VERSION + "\nCPU: " + cpu);
  app.footer(kExitCodes);
  TrainOptions options;
  CLI::App* train = app.add_subcommand(
      "train", "train the residual MLP on a data set (--model gpt: the GPT on a text file)");
  train->footer(kExitCodes);
  add_train_flags(*train, options);
  add_plan_flags(*train, options);
  add_plan_choice_flag(*train, options);
  add_data_parallel_flags(*train, options);
  CLI::App* plan = app.add_subcommand(
      "plan", "list the plans (micro-batch, precision, checkpoint policy) whose step fits in "
              "--device-memory, with predicted peak and step time, fastest first; takes "
              "train's flags");
  plan->footer(kExitCodes);
  add_train_flags(*plan, options);
  add_plan_flags(*plan, options);
  add_device_model_flag(*plan, options);
  add_rank_plan_flags(*plan, options);
  plan->add_flag("--json", options.plan.json,
                 "print the answer as one JSON object instead of the table: batch, "
                 "budget_bytes, device, modelled (true under --device-model), calibration, "
                 "calibration_measured_now, cost_model, "
                 "weighed, feasible (every plan that fits, fastest first: micro_batch, "
                 "micro_batches, precision, loss_scale, checkpoint, recompute, peak_bytes, "
                 "peak_moment, seconds), and when nothing fits (exit code 3, the reason on "
                 "stderr) smallest (the plan of smallest peak) and fixed_bytes (what no plan "
                 "can trade away); with --ranks also ranks, zero, share (rank 0's samples, "
                 "which micro_batches split) and sum_seconds_fp32 and sum_seconds_16bit (the "
                 "modelled gradient sum in every plan's seconds; at --zero 2 that of one "
                 "micro-batch per step, and sum_seconds_per_further_micro_batch)");
  GenerateOptions generate_options;
  CLI::App* generate = app.add_subcommand(
      "generate", "print the text a GPT trained by `train --model gpt --save` writes after a "
                  "prompt");
  generate->footer(kExitCodes);
  add_generate_flags(*generate, generate_options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line naming the flag, not CLI11's two (the error, then a hint).
    const std::string command = plan->parsed()       ? " plan"
                                : train->parsed()    ? " train"
                                : generate->parsed() ? " generate"
                                                     : "";
    std::cerr << "bigbatch" << command << ": " << e.what() << " (see bigbatch" << command
              << " --help)\n";
    return kExitBadInput;
  }
  CLI::App* command = plan->parsed() ? plan : generate->parsed() ? generate : train;
  for (const CLI::Option* option : command->get_options()) {
    if (option->count() > 0) options.given.insert(option->get_name());
  }
  // Which process failed: "bigbatch train", or "bigbatch train (rank 1 of 2)" under MPI.
  const auto name = [command] {
    std::string text = "bigbatch " + command->get_name();
    if (const collectives::Communicator* world = collectives::Communicator::joined()) {
      text += " (rank " + std::to_string(world->rank()) + " of " +
              std::to_string(world->size()) + ")";
    }
    return text;
  };
  int code = kExitFailure;
  // Each message is one write: the ranks of a data-parallel run share the terminal.
  const auto say = [&name](const char* before, const std::exception& e) {
    std::cerr << (before + name() + ": " + e.what() + "\n");
  };
  try {
    if (command == generate) return run_generate(generate_options);
    return command == plan ? run_plan(options) : run_train(options);
  } catch (const UsageError& e) {
    say("", e);
    code = kExitBadInput;
  } catch (const NoPlanFits& e) {
    say("", e);
    code = kExitOutOfMemory;
  } catch (const OutOfMemoryError& e) {
    say("\n", e);
    code = kExitOutOfMemory;
  } catch (const std::bad_alloc&) {
    // Host memory outside the tracking allocator (a std::vector), refused under a ulimit
    // or by the system: out of memory too, though the size is not known here.
    std::cerr << ("\n" + name() + ": out of memory: the host refused an allocation (" +
                  "std::bad_alloc), under a limit such as ulimit -v or past the machine's\n");
    code = kExitOutOfMemory;
  } catch (const std::exception& e) {
    say("\n", e);
    code = kExitFailure;
  }
  // A failure on one rank of a data-parallel run ends every rank with its exit code: the
  // others may be waiting for this one in a collective, and would wait for ever.
  if (collectives::Communicator* world = collectives::Communicator::joined()) world->abort(code);
  return code;
}
