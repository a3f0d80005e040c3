// The task book: which tasks a pool has taken, where each one is, and how each one ends.
//
// Pure bookkeeping (no processes, threads or I/O; the caller holds a lock around every call and
// carries out what the calls return). It owns the rules that make a pool trustworthy:
//   admission   at most capacity() tasks are open (admitted, not ended): submit() waits on full();
//   depth       a worker holds at most its limit: fixed, or chosen from its task times
//               (queue_depth.hpp), and capacity() is the sum of the limits;
//   room        with records_per_worker, a worker's handed tasks take at most that many records
//               of its task queue (a task: its envelope, inputs and prelude), so a hand-over never
//               finds the queue full: a deep queue of small tasks fits where a few of the largest
//               fill it, and the sender (a collector among them) never waits on a worker;
//   order       pending tasks go out oldest first; a task lost with its worker goes back to the
//               front, to another worker when there is one;
//   retries     a task lost on 1 + max_retries hand-overs fails with the last loss as its reason;
//   lives       with tasks_per_life, a worker's process is handed that many tasks at most; once
//               their results are in, life_spent() says to replace it (maxtasksperchild);
//   exactly once every admitted task leaves the book once, by complete(), a failure list, or
//               take_all(); a result for an attempt that is no longer current is stale;
//   collection  a worker's results need the pool's collector thread while some task handed to
//               it is not awaited, that is no caller takes its result itself (Pool::call):
//               needs_collector().
// A task's life:
//   admit --> pending --next_hand_over--> handed(worker, attempt)
//   handed --complete--> ended (result or the worker's task error)
//   handed --worker_lost--> pending (retry)  |  ended (retries spent)
//   handed --hand_over_failed--> ended (its inputs could not travel)
//   any --take_all--> ended (close, or no worker left)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ipc/clock.hpp"
#include "runtime/prelude.hpp"
#include "runtime/supervisor/queue_depth.hpp"
#include "runtime/tensor_queue.hpp"  // Tensors

namespace ferry::supervisor {

using TaskId = std::uint64_t;

struct Task {
  // Given at admission.
  std::string name;
  std::uint32_t task_index = 0;  // in the workers' task list
  std::size_t index = 0;         // position in the caller's inputs, or submission number
  Tensors inputs;                // kept until the task ends: a retry sends them again
  PreludePtr prelude;            // what it shares with other tasks, sent once per worker; or null
  // Called once, when the task ends, outside the book (the caller carries it out).
  std::function<void(Task&, std::exception_ptr error, Tensors outputs, int worker)> done;
  // Kept by the book.
  TaskId id = 0;
  Clock::time_point admitted;
  std::uint32_t attempts = 0;  // hand-overs so far
  int worker = -1;             // where the current attempt is; -1 while pending
  int last_worker = -1;        // where the last attempt was lost: avoided for the retry
  std::string lost_because;    // the last loss, in words
  // Kept by the pool: how its inputs travelled was counted (at the first send that went through).
  bool inputs_tallied = false;
  // Records its hand-over takes in a task queue at most: the envelope, the inputs, the prelude
  // (attached at a worker's first task of it, counted every time). Set by admit().
  std::size_t records = 0;
  // Bytes of its inputs' tensors (the prelude left out: a worker keeps it). Set by admit().
  std::uint64_t input_bytes = 0;
  // Its caller takes its result from the worker itself (Pool::call): set before admit(),
  // cleared by stop_awaiting().
  bool awaited = false;
};
using TaskPtr = std::shared_ptr<Task>;

struct HandOver {
  TaskPtr task;
  int worker = -1;
  std::uint32_t attempt = 0;
  bool first = false;  // the task's first hand-over (its inputs are tallied once)
};

struct WorkerCounts {
  std::uint64_t done = 0, failed = 0, lost = 0;
};

class TaskBook {
 public:
  // `per_worker` tasks at most in each worker, or 0: as many as QueueDepth chooses for it.
  // `tasks_per_life` hand-overs at most to each process of a worker here, or 0: no end.
  // `records_per_worker`: the records of a worker's handed tasks at most (its task queue's room),
  // or 0: no bound. Workers added later (hosts) have none.
  TaskBook(int workers, int per_worker, int max_retries, std::uint64_t tasks_per_life = 0,
           std::size_t records_per_worker = 0);

  // The records a task's hand-over takes at most (Task::records).
  static std::size_t records_of(const Task& t) noexcept;

  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t open() const noexcept { return open_.size(); }
  bool full() const noexcept { return open_.size() >= capacity_; }
  bool empty() const noexcept { return open_.empty(); }

  // Takes a task (the caller waited for !full()); gives it its id.
  TaskId admit(TaskPtr task, Clock::time_point now);

  // Whether `worker` takes hand-overs (a worker is open once it handshook, closed when it is
  // going). A closed worker keeps its tasks until worker_lost() or complete().
  void set_open(int worker, bool open);

  // A new process of `worker` (a local one) starts its life: its hand-overs count from 0.
  void begin_life(int worker);
  // Whether `worker`'s process has been handed its tasks_per_life and every result is in: it
  // takes no more hand-overs, and is to be replaced.
  bool life_spent(int worker) const;

  // A worker that comes later (a host joining a running pool), closed until set_open, with room
  // for `limit` tasks: the book's capacity grows by that much. It keeps its own time limits, so
  // overdue() leaves it out. Returns its number.
  int add_worker(std::size_t limit);
  // A worker gone for good (a lost host): closed, and its room taken out of the capacity. Its
  // tasks must have been handed back by worker_lost() first.
  void retire(int worker);
  std::size_t workers() const noexcept { return workers_.size(); }

  // The next hand-over: the oldest pending task to the least loaded open worker with room,
  // avoiding the worker it was last lost on when another has room. nullopt: nothing to do now.
  std::optional<HandOver> next_hand_over(Clock::time_point now);

  // A result (ok or the task's own failure) for `attempt` of `id` from `worker`, of
  // `result_bytes` of tensors: the task, now ended, or null when that attempt is no longer
  // current (the result is stale).
  TaskPtr complete(int worker, TaskId id, std::uint32_t attempt, bool ok, Clock::time_point now,
                   std::uint64_t result_bytes = 0);

  // The hand-over could not be sent (its inputs cannot travel): the task ends, returned, unless
  // it is no longer that attempt (then null).
  TaskPtr hand_over_failed(const HandOver& h);

  // `worker` is gone with its tasks: each goes back to the front of the queue for a retry, or
  // ends when its retries are spent (returned, oldest first, with lost_because set).
  std::vector<TaskPtr> worker_lost(int worker, const std::string& reason);

  // Ends every open task (returned in admission order) and empties the book.
  std::vector<TaskPtr> take_all();

  // Whether `worker` holds a task whose result no caller takes itself: its collector must run.
  bool needs_collector(int worker) const {
    const Worker& w = workers_.at(worker);
    return w.handed.size() > w.awaited;
  }
  // Task `id`'s caller stops taking its result itself (it gave up waiting): the collector takes
  // it. Returns the worker it is handed to, or -1 (pending, ended, or not awaited).
  int stop_awaiting(TaskId id);

  // Workers whose oldest task has run past `limit` (measured from when it could start: the
  // worker runs its queue in order), with that task.
  std::vector<std::pair<int, TaskPtr>> overdue(Clock::time_point now,
                                               std::chrono::milliseconds limit) const;
  // When the next overdue() falls due, if any task runs.
  std::optional<Clock::time_point> next_deadline(std::chrono::milliseconds limit) const;

  std::size_t load(int worker) const { return workers_.at(worker).handed.size(); }
  std::size_t records(int worker) const { return workers_.at(worker).records; }
  std::size_t limit(int worker) const { return workers_.at(worker).limit; }
  const WorkerCounts& counts(int worker) const { return workers_.at(worker).counts; }
  std::uint64_t retried() const noexcept { return retried_; }
  std::uint64_t admitted() const noexcept { return admitted_; }
  std::uint64_t completed() const noexcept { return completed_; }
  std::uint64_t failed() const noexcept { return failed_; }  // every ending but a good result

 private:
  struct Worker {
    bool open = false;
    std::size_t limit = 0;            // tasks handed to it at most
    std::optional<QueueDepth> depth;  // chooses `limit`, where the pool does
    bool timed = true;                // overdue() looks at it; false for a host, which also
                                      // has no lives here (its own pool counts them)
    std::uint64_t given = 0;          // hand-overs to the current process (tasks_per_life_)
    std::deque<TaskId> handed;        // in hand-over order: it runs them in that order
    std::size_t records = 0;          // of the tasks in `handed`
    std::size_t awaited = 0;          // of the tasks in `handed`, those awaited
    std::size_t record_room = 0;      // records at most; 0: no bound
    Clock::time_point head_since;     // when handed.front() could start
    WorkerCounts counts;
  };
  TaskPtr end(TaskId id);  // out of the book
  // Task `t` is no longer handed to `w`: the counts of what it holds there drop.
  static void unhand(Worker& w, const Task& t) noexcept {
    w.records -= std::min(w.records, t.records);
    if (t.awaited && w.awaited > 0) --w.awaited;
  }

  bool life_ended(const Worker& w) const noexcept {
    return tasks_per_life_ != 0 && w.timed && w.given >= tasks_per_life_;
  }

  std::size_t capacity_;
  std::uint32_t max_retries_;
  std::uint64_t tasks_per_life_;
  std::vector<Worker> workers_;
  std::unordered_map<TaskId, TaskPtr> open_;
  std::deque<TaskPtr> pending_;
  TaskId next_id_ = 1;
  std::uint64_t retried_ = 0, admitted_ = 0, completed_ = 0, failed_ = 0;
};

}  // namespace ferry::supervisor
