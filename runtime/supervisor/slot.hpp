// A slot: one place the pool hands tasks to, as the dispatcher sees it. A worker process here
// (LocalSlot, worker_fleet.hpp) and a host's share of a job spread over several machines
// (RemoteSlot, remote_slots.hpp) are both slots, so the dispatcher sends whatever the task book
// hands over the same way, and only the slot knows how its hand-overs travel and what a failed
// send means.
//
// The contract: send() is called with the board's lock held (board.hpp); it copies what it needs
// of its own state, releases the lock, then sends (which may block on a full queue or a link),
// and says how it went. It throws nothing but what the transport throws that is not an Error.
#pragma once

#include <mutex>
#include <optional>
#include <string>

#include "ipc/error.hpp"
#include "ipc/stats.hpp"  // TransferCounts
#include "runtime/supervisor/pool_stats.hpp"
#include "runtime/supervisor/task_book.hpp"

namespace ferry::supervisor {

// How a hand-over went.
struct Delivery {
  enum class Kind {
    sent,     // on its way
    gone,     // the slot is going: its loss hands the task back for a retry
    stuck,    // the slot takes nothing more (its queue stayed full): kill it, for `why`
    refused,  // the inputs cannot travel (bad tensor, no shared memory left): the task fails
              // with `error`, the slot goes on
  };
  Kind kind = Kind::sent;
  // sent: how the inputs travelled, where the pool counts it (a worker here; a host's link
  // copies everything and is not counted). The task's envelope is not among them.
  std::optional<TransferCounts> inputs;
  bool prelude_attached = false;  // sent: the task's prelude went with it (WorkerStats)
  std::string why;                // stuck
  std::optional<Error> error;     // refused
};

class Slot {
 public:
  explicit Slot(WorkerStats s) : stats(std::move(s)) {}
  virtual ~Slot() = default;

  // Sends hand-over `h`; `lock` holds the board's lock on entry and is released on return.
  virtual Delivery send(const HandOver& h, std::unique_lock<std::mutex>& lock) = 0;

  // What Pool::stats() shows of it, kept up to date under the board's lock (the task counts
  // come from the task book).
  WorkerStats stats;

  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
};

}  // namespace ferry::supervisor
