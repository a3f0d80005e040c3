// LocalSlot: a worker process of this machine as a slot (slot.hpp): its hand-overs go on the
// process's task queue as tensor messages behind an int64 envelope (worker_protocol.hpp).
//
// Its fields are the board's (under the board's lock): the monitor thread (worker_fleet.hpp)
// opens and closes it as its process starts and ends; any thread may ask for a kill.
#pragma once

#include <optional>
#include <string>

#include "runtime/supervisor/slot.hpp"
#include "runtime/tensor_queue.hpp"

namespace ferry::supervisor {

class LocalSlot : public Slot {
 public:
  using Slot::Slot;

  // A full queue for 10 s is stuck (the queues are sized never to fill); a closed queue or a
  // dead reader is gone (its exit hands the task back); any other failure is refused.
  Delivery send(const HandOver& h, std::unique_lock<std::mutex>& lock) override;

  std::optional<TensorQueue> tasks;  // while the worker takes tasks
  std::string kill_request;          // a collector or dispatcher asks the monitor to kill it
  bool started_once = false;         // later starts are restarts
};

}  // namespace ferry::supervisor
