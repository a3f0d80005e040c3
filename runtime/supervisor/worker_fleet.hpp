// The worker fleet: this machine's worker processes, one WorkerProcess per local slot, kept
// running by the monitor thread.
//
// run() is the monitor thread's whole life, and only it starts, kills and reaps processes
// (PR_SET_PDEATHSIG follows the thread that started a child). Each round it waits on the
// monitor (monitor.hpp) for a death, a start-up answer, a deadline or a rouse, then acts on all
// of it: finishes starts and opens their slots, carries out the restart policy's answer to a
// failed start, hands a dead worker's tasks back (after its collector delivered every earlier
// result), kills what was asked for or ran past task_timeout, retires a process that ran its
// tasks per life (its exit starts a fresh one), and restarts what is due. Nothing
// escapes the thread: an exception becomes the pool's error (every task fails with it).
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ipc/error.hpp"
#include "runtime/supervisor/board.hpp"
#include "runtime/supervisor/dispatcher.hpp"
#include "runtime/supervisor/restart_policy.hpp"
#include "runtime/supervisor/result_collector.hpp"
#include "runtime/supervisor/worker_process.hpp"

namespace ferry::supervisor {

struct FleetOptions {
  LaunchSpec spec;
  RestartPolicy restart;
  std::chrono::milliseconds task_timeout{0};  // 0: none
  std::chrono::milliseconds stop_timeout{5000};
};

class WorkerFleet {
 public:
  // One worker (not yet started) per device, with its LocalSlot on the board, which must have
  // no slots yet.
  WorkerFleet(Board& board, Dispatcher& dispatcher, ResultCollector& collector,
              const std::vector<std::string>& devices);

  // Set before run(): the spec is shared by every start.
  FleetOptions& options() noexcept { return opt_; }
  const std::vector<std::unique_ptr<WorkerProcess>>& workers() const noexcept { return workers_; }
  std::size_t size() const noexcept { return workers_.size(); }

  // The monitor thread: starts every worker and tells `started` once all are ready (or why the
  // pool cannot start), keeps them running until the board is stopping, then stops and reaps
  // them.
  void run(std::promise<void> started);

 private:
  void launch(int w);
  void finish_start(int w);
  void start_failed(int w, const StartFailure& f);
  void exited(int w);
  void kill_due();
  void retire_due();
  void round();
  void stop_workers();

  Board& board_;
  Dispatcher& dispatcher_;
  ResultCollector& collector_;
  FleetOptions opt_;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;  // the monitor thread's alone
  std::optional<Error> startup_error_;                   // the monitor thread's alone
  std::vector<std::string> held_retries_;                // the same: retries before the start
};

}  // namespace ferry::supervisor
