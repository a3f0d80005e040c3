// The board: what the supervisor's rooms share, under its one lock. The rooms are the
// dispatcher (dispatcher.hpp, any thread), the result collector (result_collector.hpp, a
// collector thread per worker process and the remote side's threads), the worker fleet
// (worker_fleet.hpp, the monitor thread) and the remote slots (remote_slots.hpp, the remote
// side's threads); runtime/pool.cpp wires them together.
//
// The rules every room keeps:
// - the task book, the slots' published state and the pool's life change only under `mu`, and
//   a change others wait for (room, drain progress) notifies `changed`;
// - a task's end (its `done`) runs outside the lock: take the tasks out under it, end them after;
// - only the monitor thread starts, kills and reaps processes; another thread that wants a kill
//   asks for it (request_kill) and rouses the monitor.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ipc/adaptive_mutex.hpp"
#include "runtime/supervisor/local_slot.hpp"
#include "runtime/supervisor/monitor.hpp"
#include "runtime/supervisor/pool_life.hpp"
#include "runtime/supervisor/pool_stats.hpp"
#include "runtime/supervisor/slot.hpp"
#include "runtime/supervisor/task_book.hpp"

namespace ferry::supervisor {

struct Board {
  // `here` slots for this machine's workers (numbered 0..here-1, as in the book), each task queue
  // with room for `records_per_worker` records of tasks (TaskBook).
  Board(int here, int per_worker, int max_retries, std::uint64_t tasks_per_life,
        std::size_t records_per_worker);

  mutable AdaptiveMutex mu;         // its sections are short: tried before a taker sleeps
  std::condition_variable changed;  // room for submitters, drain progress for close()
  TaskBook book;
  // Every slot, by its number in the book: this machine's workers first, then the hosts as they
  // join. Never shrinks, so a Slot* stays valid outside the lock.
  std::vector<std::unique_ptr<Slot>> slots;
  std::vector<LocalSlot*> here;  // slots[0..here.size()) as what they are
  std::vector<std::string> task_names;
  std::uint64_t next_submission = 0;
  PoolLife life;      // starting, running, closing, stopping, closed (pool_life.hpp)
  std::string fatal;  // no worker can run: why
  PoolStats totals;   // input tallies
  Monitor monitor;    // the monitor thread waits on it; rouse() wakes it

  bool is_stopping() const;

  // Asks the monitor to kill worker `w` of this machine (from a collector or a dispatcher); it
  // takes no more hand-overs. A second request, or one for a worker not taking tasks, is ignored.
  void request_kill(int w, const std::string& why);

  // Under `mu`, after a change that may leave worker `w` of this machine with a task no caller
  // awaits (a hand-over, a caller that stopped waiting): wakes its collector where it sleeps at
  // the gate (local_slot.hpp). Any other slot is left alone.
  void rouse_collector(int w);

  // Ends every task with `why` and refuses new ones: no worker can run. `device` names where
  // the last failure was, or is empty.
  void fail_every_task(const std::string& why, const std::string& device);
};

// Ends `t` (outside the board's lock): its inputs go, its `done` runs.
void end_task(Task& t, std::exception_ptr error, Tensors outputs = {}, int worker = -1);

// Ends the tasks a lost slot's worker_lost() returned (their retries spent).
void end_lost(const std::vector<TaskPtr>& ended, const std::string& device);

}  // namespace ferry::supervisor
