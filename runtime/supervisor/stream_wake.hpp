// StreamWake: whether a result that has just come in wakes a stream's consumer (a thread waiting
// in Pool::Results::next()) now, or waits for the results after it.
//
// Waking a thread goes through the kernel, and where every core runs a worker the woken consumer
// preempts one of them: on the 2-vCPU VM a stream of 1 ms TorchScript tasks spent about a quarter
// of a core in the supervisor, a third of it the consumer woken for every result to take it and
// hand over the next input (docs/benchmarks.md, issue 54). The consumer has something to do at
// once only when the pool's window of tasks needs refilling before the workers run dry, or when
// the stream is ending; otherwise the results gather and it takes them together, after one
// wake-up, while the workers still hold half a window of queued tasks.
//
// The rule, one pure function of the stream's state (`wake_now`): wake the consumer
// - when the stream has no inputs left to hand over (its last results come back as they come);
// - when the tasks in flight (handed over, no result yet) are at most half the window;
// - when results come in slowly: the typical gap between two is kHold or more, or there is no
//   gap yet (the first result), so nothing is held behind a long task;
// - when the oldest result not yet taken came in kHold ago or more;
// - when the consumer, if asleep, went to sleep for good (until woken), not for kHold;
// and otherwise not. `sleep_limit` is its other half: a consumer that goes to sleep while results
// may be held sleeps at most kHold, so a held result waits about kHold at most even when no other
// result comes to wake the consumer.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>

#include "ipc/clock.hpp"

namespace ferry::supervisor {

struct StreamState {
  std::size_t in_flight = 0;                    // handed over, no result yet
  std::size_t window = 0;                       // the most the pool takes at once (Pool capacity)
  bool inputs_left = false;                     // inputs not yet handed over
  std::optional<Clock::duration> typical_gap;   // between results coming in; none before two
  std::optional<Clock::duration> oldest_ready;  // how long the oldest result not taken has waited
  bool consumer_looks_again = false;  // the consumer, if asleep, looks again within kHold itself
};

class StreamWake {
 public:
  static constexpr Clock::duration kHold = std::chrono::milliseconds(2);

  // Whether the result that has just come in (counted in `s`) wakes the consumer now.
  static bool wake_now(const StreamState& s) noexcept;
  // How long a consumer going to sleep now may sleep before it looks again; nullopt: until woken.
  static std::optional<Clock::duration> sleep_limit(const StreamState& s) noexcept;

  // One result came in at `at`: updates the typical gap (a moving average, weight 1/4).
  void record_arrival(Clock::time_point at) noexcept;
  std::optional<Clock::duration> typical_gap() const noexcept { return typical_gap_; }

 private:
  static bool may_hold(const StreamState& s) noexcept;
  std::optional<Clock::time_point> last_;
  std::optional<Clock::duration> typical_gap_;
};

}  // namespace ferry::supervisor
