#include "runtime/supervisor/dispatcher.hpp"

#include <algorithm>

#include "ipc/names.hpp"
#include "runtime/supervisor/transfer_tally.hpp"
#include "runtime/task_error.hpp"
#include "runtime/worker_protocol.hpp"

namespace ferry::supervisor {

void Dispatcher::submit(const TaskPtr& task, std::optional<std::size_t> index,
                        std::chrono::milliseconds timeout) {
  const std::string& name = task->name;
  const std::size_t prelude = task->prelude ? task->prelude->tensors.size() : 0;
  if (task->inputs.size() + prelude > protocol::kMaxTensorsPerTask) {
    throw Error(Errc::invalid_argument,
                "task '" + name + "' was given " + std::to_string(task->inputs.size()) +
                    " tensors" +
                    (prelude ? " and a prelude of " + std::to_string(prelude) : std::string()) +
                    "; a task takes at most " + std::to_string(protocol::kMaxTensorsPerTask) +
                    " with its prelude (stack or batch them)");
  }
  {
    Board& b = board_;
    std::unique_lock<std::mutex> lock(b.mu);
    const auto it = std::find(b.task_names.begin(), b.task_names.end(), name);
    if (it == b.task_names.end()) {
      throw Error(Errc::invalid_argument,
                  "no task '" + name + "' in the workers (they have: " + join_names(b.task_names) +
                      "); register it with FERRY_TASK in the worker");
    }
    task->task_index = static_cast<std::uint32_t>(it - b.task_names.begin());
    auto admissible = [&] { return b.life.closing() || !b.fatal.empty() || !b.book.full(); };
    if (timeout.count() < 0) {
      b.changed.wait(lock, admissible);
    } else if (!b.changed.wait_for(lock, timeout, admissible)) {
      throw Error(Errc::timeout, "the pool stayed full (" + std::to_string(b.book.capacity()) +
                                     " tasks in flight) for " + std::to_string(timeout.count()) +
                                     " ms");
    }
    if (b.life.closing())
      throw Error(Errc::closed, "the pool is closed; task '" + name + "' not run");
    if (!b.fatal.empty()) throw Error(Errc::worker_lost, b.fatal);
    task->index = index ? *index : b.next_submission++;
    b.book.admit(task, Clock::now());
  }
  dispatch();
}

void Dispatcher::dispatch() {
  Board& b = board_;
  for (;;) {
    std::unique_lock<std::mutex> lock(b.mu);
    const std::optional<HandOver> h = b.book.next_hand_over(Clock::now());
    if (!h) return;
    b.rouse_collector(h->worker);  // the result of a task no caller awaits is the collector's
    Slot& slot = *b.slots[h->worker];
    const std::string device = slot.stats.device;
    const bool tally = !h->task->inputs_tallied;  // one hand-over of a task at a time
    const Delivery d = slot.send(*h, lock);       // unlocks
    switch (d.kind) {
      case Delivery::Kind::sent:
        // Inputs as submitted: counted once, at the first send that went through.
        if ((tally && d.inputs) || d.prelude_attached) {
          std::lock_guard<std::mutex> relock(b.mu);
          if (d.prelude_attached) ++b.slots[h->worker]->stats.preludes_sent;
          if (tally && d.inputs) {
            h->task->inputs_tallied = true;
            add_transfer_counts(b.totals, *d.inputs);
          }
        }
        break;
      case Delivery::Kind::gone:
        break;  // the slot is going; its loss hands the task back for a retry
      case Delivery::Kind::stuck:
        b.request_kill(h->worker, d.why);
        break;
      case Delivery::Kind::refused:
        hand_over_failed(*h, *d.error, device);
        break;
    }
  }
}

void Dispatcher::hand_over_failed(const HandOver& h, const Error& e, const std::string& device) {
  TaskPtr t;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    t = board_.book.hand_over_failed(h);
    board_.changed.notify_all();
  }
  if (t) {
    end_task(*t, std::make_exception_ptr(
                     TaskError(e.code(), t->name, t->index, -1, device, -1,
                               "its inputs could not be handed to a worker: " + e.detail())));
  }
}

}  // namespace ferry::supervisor
