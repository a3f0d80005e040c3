// LocalSlot: a worker process of this machine as a slot (slot.hpp): its hand-overs go on the
// process's task queue as tensor messages behind an int64 envelope (worker_protocol.hpp).
//
// Its public fields are the board's (under the board's lock): the monitor thread
// (worker_fleet.hpp) opens and closes it as its process starts and ends; any thread may ask for
// a kill. What the process holds of the tasks' preludes (prelude_book.hpp) is the slot's own,
// under its send lock: the sends that tell the process what to keep (those of tasks with a
// prelude) go one at a time, in the order the book planned them; other sends take no lock.
//
// Its results are taken from the process's result queue by the slot's collector thread, or by
// a caller waiting in Pool::call for its own task there, so that a call at a time costs one
// hand-off each way and no thread between (CollectorGate).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/prelude.hpp"
#include "runtime/supervisor/prelude_book.hpp"
#include "runtime/supervisor/slot.hpp"
#include "runtime/tensor_queue.hpp"

namespace ferry::supervisor {

// Who takes a worker's results. The collector thread sleeps at the gate while every task handed
// to the worker is awaited by its caller (TaskBook::needs_collector); those callers take the
// results themselves, holding `turn`. A hand-over of another task, or a caller that gives up
// waiting, wakes it. `parked` and `closing` are the board's (under its lock); `turn` is held by
// whoever receives from the queue and ends what it received, so the monitor, once it has joined
// the collector, takes `turn` to know that no caller still holds a result of the dead process.
struct CollectorGate {
  std::mutex turn;
  std::condition_variable wake;
  bool parked = false;   // the collector sleeps at the gate
  bool closing = false;  // its process is being reaped: the collector drains and ends
};

class LocalSlot : public Slot {
 public:
  using Slot::Slot;

  // A full queue for 10 s is stuck (the queues are sized never to fill); a closed queue or a
  // dead reader is gone (its exit hands the task back); any other failure is refused.
  Delivery send(const HandOver& h, std::unique_lock<std::mutex>& lock) override;

  // Opens the slot on a new process's task and result queues; the first holds no prelude yet.
  void open(TensorQueue task_queue, TensorQueue result_queue) {
    tasks = std::move(task_queue);
    results = std::move(result_queue);
    ++process_;
  }

  std::optional<TensorQueue> tasks;    // while the worker takes tasks
  std::optional<TensorQueue> results;  // the same: for callers that take their own results
  CollectorGate gate;
  std::string kill_request;   // a collector or dispatcher asks the monitor to kill it
  bool started_once = false;  // later starts are restarts...
  bool retired = false;       // ...but those after a retirement (tasks per life)

 private:
  std::uint64_t process_ = 0;  // which process the queue is: bumped by open()

  std::mutex send_mu_;
  PreludeBook preludes_{kPreludesPerWorker};
  std::uint64_t book_process_ = 0;  // the process preludes_ is about
};

}  // namespace ferry::supervisor
