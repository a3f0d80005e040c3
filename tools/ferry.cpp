// ferry: the supervisor binary. `ferry run` starts a pool of workers, streams batches through a
// task, and reports throughput, latency, per-worker counts and how many bytes moved zero-copy.
//
// Exit codes: 0 every task succeeded; 1 some tasks failed (the rest ran); 2 bad arguments or
// input; 3 the pool could not start or broke; 128+N interrupted by signal N (SIGINT 130,
// SIGTERM 143) after a clean shutdown.
//
// This file is the command line's shape; what it reads is in ferry_inputs (--input's tensors in
// task_inputs), what `ferry run` does in ferry_run, what it reports in ferry_report, and the parts
// across hosts in ferry_hosts.
#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <cstdio>

#include "ipc/log.hpp"
#include "ipc/version.hpp"
#include "tools/ferry_hosts.hpp"
#include "tools/ferry_inputs.hpp"
#include "tools/ferry_run.hpp"
#include "tools/stop_signals.hpp"

using namespace ferry::tools;

int main(int argc, char** argv) {
  catch_stop_signals();  // before anything here can start a thread
  CLI::App app{"ferry: run PyTorch work on a pool of worker processes, tensors moved zero-copy"};
  app.require_subcommand(1);
  app.set_version_flag("--version", ferry::version());
  RunArgs a;
  add_run_command(app, a);
  CLI::App* host_cmd = add_host_command(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kOk : kBadInput;
  }
  try {
    settle_run_args(a);
    if (host_cmd->parsed()) return host(a);
    // Under torchrun, srun or env:// variables, rank 0 runs the job and the others serve it.
    a.launch = launch_of(a);
    if (a.launch && !a.launch->is_head()) return host(a);
    return run(a);
  } catch (const LaunchFailure& e) {
    std::fprintf(stderr, "ferry: %s\n", e.what());
    return kBroken;
  } catch (const BadInput& e) {
    std::fprintf(stderr, "ferry: %s\n", e.what());
    return kBadInput;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // already "ferry: <code>: ..."
    return kBroken;
  } catch (const c10::Error& e) {  // LibTorch's backtrace is for FERRY_LOG=debug
    ferry::log().debug("{}", e.what());
    std::fprintf(stderr, "ferry: %s\n", e.what_without_backtrace());
    return kBroken;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: %s\n", e.what());
    return kBroken;
  }
}
