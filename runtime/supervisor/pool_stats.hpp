// What a pool tells of itself (Pool::stats()): per slot, and for the pool as a whole. Kept
// apart from pool.hpp so the supervisor's rooms (runtime/supervisor/) keep these counters
// without depending on the API they sit under.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

struct WorkerStats {
  int id = 0;
  std::string device;              // a remote slot: "host NAME (its devices)"
  bool remote = false;             // a host's slot (PoolOptions::remote), not a process here
  pid_t pid = -1;                  // current process, -1 while restarting
  std::string start;               // "fork" or "spawn"
  std::uint64_t tasks_done = 0;    // results delivered
  std::uint64_t tasks_failed = 0;  // tasks that threw here
  std::uint64_t tasks_lost = 0;    // in flight when it died (retried or failed)
  std::uint64_t restarts = 0;      // after a crash, a kill or a failed start
  std::uint64_t replaced = 0;      // processes retired after max_tasks_per_worker tasks
  std::uint64_t timeouts = 0;      // kills for a task past task_timeout
  // Preludes sent with a task (runtime/prelude.hpp): once per prelude per process, more only
  // when it had to forget one for want of room, or a host's (whose link carries one each time).
  std::uint64_t preludes_sent = 0;
  std::string last_exit;  // how its last process ended, its last failed start, a host's loss
  bool given_up = false;  // its starts kept failing, or its host was lost: the pool goes on
  std::size_t limit = 0;  // tasks it may hold now (max_inflight_per_worker, or the pool's
                          // choice; a host's room)
  // Results sent back by this worker's processes (all of them, across restarts), as each
  // send reported it (TensorQueue::send).
  std::uint64_t tensors_zero_copy = 0, bytes_zero_copy = 0;
  std::uint64_t tensors_copied = 0, bytes_copied = 0;
};

struct PoolStats {
  std::vector<WorkerStats> workers;
  std::uint64_t submitted = 0, completed = 0, failed = 0, retried = 0;
  // Inputs as they first travelled to a worker (TensorQueue::send's report): shared in place
  // (arena tensors, CUDA tensors the worker opens by handle) or copied once.
  std::uint64_t input_tensors_zero_copy = 0, input_bytes_zero_copy = 0;
  std::uint64_t input_tensors_copied = 0, input_bytes_copied = 0;
  // Results taken from a worker by the caller that waited for them (Pool::call), not by a pool
  // thread.
  std::uint64_t results_taken_by_callers = 0;
};

}  // namespace ferry
