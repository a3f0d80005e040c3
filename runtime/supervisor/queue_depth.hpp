// QueueDepth: how many tasks a worker may hold when the pool chooses (max_inflight_per_worker 0).
//
// A worker that runs out of tasks sleeps until the next arrives, and a submitter that finds no
// result waiting sleeps too: for short tasks those kernel wake-ups cost more than the task itself
// (a map of empty Python tasks on two cores: 75 us per task at a depth of 3, 29-59 at 16 to
// 64; empty C++ tasks through one worker, 4.54 us at 16 and 2.85 at 64). A deep queue keeps both
// sides busy. A shallow one keeps long tasks spread over the workers: a worker
// runs its queue in order, so a task queued behind a long one waits while another worker may idle.
//
// The rule, one pure function of the worker's history (`depth`): keep about kCover of work queued
// at each worker,
//   depth = clamp(ceil(kCover / typical), kMinDepth, kMaxDepth)
// where `typical` is a moving average (weight 1/4) of the worker's recent task times, each timed
// from when the worker could start it (its hand-over to an idle worker, or the result before
// it) to its result: the way there and back is part of what a queue has to cover. Before the
// first result the depth is kMinDepth, the fixed default's, and tasks of kCover / kMinDepth or
// longer keep it there: only short tasks queue deeper, and what waits behind a task that turns
// out long is at most about kCover of work. One slow task raises `typical` at once (weight 1/4
// of a long time), so a worker whose tasks turn long takes few at its next result.
// A second bound, on data: the queue holds about kDataCover of tensors (a task's inputs and its
// result, a moving average of weight 1/4 like the time's),
//   depth <= kDataCover / typical bytes,
// and the lower of the two rules wins, within [kMinDepth, kMaxDepth]. Tasks of megabytes are
// memory-bound: a queue 64 deep of 1 MiB squares holds 128 MiB a worker, and each input has left
// the caches by the time the worker reads it (ferry run --task square on two cores: 13.1k tasks/s
// at 64 deep, 16.0k at 16; 4 MiB results, 3.9k at 16 deep and 4.4k at 4; docs/benchmarks.md).
// It also keeps the shared memory a pool holds in flight to tens of megabytes a worker.
// The depth counts tasks; the room of a worker's queues (kRoomDepth tasks of the most tensors)
// bounds their records, which the task book keeps to (task_book.hpp, "room").
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "ipc/clock.hpp"

namespace ferry::supervisor {

class QueueDepth {
 public:
  static constexpr std::size_t kMinDepth = 3;
  static constexpr std::size_t kMaxDepth = 64;
  // The queues to a worker are sized for this many tasks of the most tensors each: deeper queues
  // are of smaller tasks, in the same room (task_book.hpp, "room").
  static constexpr std::size_t kRoomDepth = 16;
  static constexpr Clock::duration kCover = std::chrono::milliseconds(10);
  static constexpr std::uint64_t kDataCover = std::uint64_t{32} << 20;

  // The tasks a worker with this history may hold.
  std::size_t depth() const noexcept;
  // One task ended on the worker, `took` after it could start, having moved `bytes` of tensors
  // (its inputs and its result).
  void record(Clock::duration took, std::uint64_t bytes = 0) noexcept;

  std::optional<Clock::duration> typical() const noexcept { return typical_; }
  std::uint64_t typical_bytes() const noexcept { return typical_bytes_; }

 private:
  std::optional<Clock::duration> typical_;
  std::uint64_t typical_bytes_ = 0;
};

}  // namespace ferry::supervisor
