// LocalSlot: a worker process of this machine as a slot (slot.hpp): its hand-overs go on the
// process's task queue as tensor messages behind an int64 envelope (worker_protocol.hpp).
//
// Its public fields are the board's (under the board's lock): the monitor thread
// (worker_fleet.hpp) opens and closes it as its process starts and ends; any thread may ask for
// a kill. What the process holds of the tasks' preludes (prelude_book.hpp) is the slot's own,
// under its send lock: the sends that tell the process what to keep (those of tasks with a
// prelude) go one at a time, in the order the book planned them; other sends take no lock.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/prelude.hpp"
#include "runtime/supervisor/prelude_book.hpp"
#include "runtime/supervisor/slot.hpp"
#include "runtime/tensor_queue.hpp"

namespace ferry::supervisor {

class LocalSlot : public Slot {
 public:
  using Slot::Slot;

  // A full queue for 10 s is stuck (the queues are sized never to fill); a closed queue or a
  // dead reader is gone (its exit hands the task back); any other failure is refused.
  Delivery send(const HandOver& h, std::unique_lock<std::mutex>& lock) override;

  // Opens the slot on a new process's task queue, which holds no prelude yet.
  void open(TensorQueue queue) {
    tasks = std::move(queue);
    ++process_;
  }

  std::optional<TensorQueue> tasks;  // while the worker takes tasks
  std::string kill_request;          // a collector or dispatcher asks the monitor to kill it
  bool started_once = false;         // later starts are restarts...
  bool retired = false;              // ...but those after a retirement (tasks per life)

 private:
  std::uint64_t process_ = 0;  // which process the queue is: bumped by open()

  std::mutex send_mu_;
  PreludeBook preludes_{kPreludesPerWorker};
  std::uint64_t book_process_ = 0;  // the process preludes_ is about
};

}  // namespace ferry::supervisor
