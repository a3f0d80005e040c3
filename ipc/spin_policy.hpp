// SpinPolicy: how long a waiter polls its futex word before it sleeps on it.
//
// A wake-up through the kernel costs the waker a futex_wake call and the sleeper a context
// switch and the scheduler's latency, several microseconds each, which is most of a round trip
// between two processes. A waiter that polls instead is never counted as asleep, so its peer
// makes no call either. Polling burns a core, though, so it pays only when the answer comes
// within the spin: the policy learns how long this waiter's waits take and spins only when they
// are short.
//
// The rule, one pure function of the history (`budget`):
// - `typical` is a moving average of recent waits (weight 1/4), each counted as at most 8x the
//   ceiling, so one long idle wait turns spinning off and a handful of quick answers turn it on;
// - while `typical` is at most the ceiling, the budget is twice `typical`, at least kMinSpin and
//   at most the ceiling: a spin that ends just short costs a sleep, which is recorded as a longer
//   wait and widens the next budget;
// - past the ceiling the budget is 0: an idle waiter sleeps at once and costs no CPU;
// - a ceiling of 0 (FERRY_SPIN_US=0, or a machine with one CPU, where the spinner would only
//   delay the peer it waits for) never spins.
// A wait that slept is counted until its waker's wake-up call (`answered_after`), not until the
// sleeper ran again: the sleeper's own wake-up says nothing about how fast the peer answers. Were
// it counted, two peers whose wake-ups each take most of the ceiling would each see waits of two
// wake-ups, over the ceiling, and both stay asleep for good although either answers at once.
//
// A yielding policy gives the core away between polls (sched_yield): a thread that needs it and
// waits on this core's queue runs first, and with none the call returns at once. It is for waits
// among more busy threads than cores, such as a pool's (caller, dispatcher, collector and
// workers): on two cores an empty task in flight went from 6.6-8.1 µs to 3.1-5.5 µs with two
// workers, and a Python apply() at a time from 78-82 µs to 18 µs. It is off by default: yielding
// in every wait cost a plain queue's round trip between two Python processes 0.5-10 µs
// (docs/benchmarks.md, issue 44's third session).
//
// One policy per waiting role and channel in a process. Threads share it: its one word is read
// and written relaxed, so concurrent records may lose one another, which only skews a guess.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ferry {

class SpinPolicy {
 public:
  static constexpr std::chrono::nanoseconds kDefaultCeiling{std::chrono::microseconds(100)};
  static constexpr std::chrono::nanoseconds kMinSpin{std::chrono::microseconds(2)};

  // `ceiling`: the longest spin; 0 never spins.
  explicit SpinPolicy(std::chrono::nanoseconds ceiling) noexcept;
  // The ceiling from FERRY_SPIN_US (microseconds, 0 to 10000; default 100), 0 where this process
  // may run on one CPU only. Throws Error(invalid_argument) naming a bad value.
  static std::chrono::nanoseconds ceiling_from_env();

  // How long to poll before sleeping, given the waits recorded so far.
  std::chrono::nanoseconds budget() const noexcept;
  // One wait, from its start to the word changing (spun or slept), or to a slice ending.
  void record(std::chrono::nanoseconds waited) noexcept;

  std::chrono::nanoseconds ceiling() const noexcept { return ceiling_; }
  // Whether polls give the core away between checks (see above).
  void set_yielding(bool on) noexcept { yielding_.store(on, std::memory_order_relaxed); }
  bool yielding() const noexcept { return yielding_.load(std::memory_order_relaxed); }
  std::chrono::nanoseconds typical() const noexcept {
    return std::chrono::nanoseconds(typical_ns_.load(std::memory_order_relaxed));
  }

 private:
  const std::chrono::nanoseconds ceiling_;
  // Starts at the ceiling: a fresh waiter spins, as a peer that answers at once is the case that
  // most needs it, and one sleep tells it otherwise.
  std::atomic<std::int64_t> typical_ns_;
  std::atomic<bool> yielding_{false};
};

// Tells the CPU this thread is polling (x86 pause, arm yield): the poll costs its sibling
// hyperthread and the memory bus less.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

// How long a wait that slept took to be answered: from `start` to `woken_at`, the time its waker
// stamped when it called the kernel to wake the sleepers, when that stamp falls within the wait;
// the whole wait, to `end`, when it does not (a stamp of an earlier wake-up, a slice that ended
// with no wake-up, a clock that differs between the processes).
std::chrono::nanoseconds answered_after(std::chrono::steady_clock::time_point start,
                                        std::chrono::steady_clock::time_point woken_at,
                                        std::chrono::steady_clock::time_point end) noexcept;

// Polls `word` until it differs from `seen` or `budget` has passed; true if it changed. With
// `yielding`, the core is given away between rounds of polls.
bool spin_until_changed(const std::atomic<std::uint32_t>& word, std::uint32_t seen,
                        std::chrono::nanoseconds budget, bool yielding = false) noexcept;

}  // namespace ferry
