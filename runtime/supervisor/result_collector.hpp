// The result collector: ends tasks with what came back from their slots.
//
// Runs on a collector thread per worker process here (on_result, from WorkerProcess's result
// queue) and on the remote side's threads (finished). A result is matched to the book under the
// board's lock; one for an attempt that is no longer current is stale and dropped (its task was
// cancelled, or timed out and retried). The task's end runs outside the lock, then the
// dispatcher fills the room it left. Nothing here throws: a message it cannot read is reported
// back, for the worker to be killed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/supervisor/board.hpp"
#include "runtime/supervisor/dispatcher.hpp"

namespace ferry::supervisor {

class ResultCollector {
 public:
  ResultCollector(Board& board, Dispatcher& dispatcher) : board_(board), dispatcher_(dispatcher) {}

  // A result message from worker `w` here: envelope, then the outputs or the error's text and
  // detail. Also
  // folds the worker's transfer tallies into its stats. Returns why the worker must be killed,
  // when the message is malformed.
  std::optional<std::string> on_result(int w, Tensors message);

  // A result from remote slot `slot`: its outputs, or (ok false) the task's error in words, with
  // its detail as the one uint8 tensor of `outputs` when there is one.
  void finished(int slot, std::uint64_t task, std::uint32_t attempt, bool ok, Tensors outputs,
                const std::string& error);

 private:
  // Ends `t`, which slot `w` on `device` (pid: its process, -1 elsewhere) finished, then
  // dispatches.
  void settle(supervisor::Task& t, int w, bool ok, Tensors outputs, const std::string& error,
              const std::string& device, pid_t pid, const std::string& detail);

  Board& board_;
  Dispatcher& dispatcher_;
};

}  // namespace ferry::supervisor
