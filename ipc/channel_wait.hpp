// How a channel waits (internal): deadlines cut into slices, futex words that wakers bump and
// sleepers watch, and the throttle on the peer-death check.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "ipc/clock.hpp"
#include "ipc/spin_policy.hpp"

namespace ferry::ring {

// Waits are sliced so a waiter re-checks closing and peer death even if a wake is lost (a
// process killed between its commit and its wake never wakes anyone).
inline constexpr std::chrono::milliseconds kWaitSlice{100};

// "250 ms", for error texts.
std::string ms_text(std::chrono::milliseconds ms);

// Deadline arithmetic shared by push and pop; kForever (any negative timeout) never expires.
class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds timeout);
  bool passed() const;
  // How long the next wait may sleep: the time left, at most kWaitSlice.
  std::chrono::nanoseconds slice() const;

 private:
  bool forever_;
  Clock::time_point at_;
};

// Bumps `word` and wakes at most `count` of its sleepers, stamping `woken_ns` when it calls the
// kernel; no syscall while `waiters` counts none. Those it woke leave `waiters` at once.
void wake(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters,
          std::atomic<std::int64_t>* woken_ns,
          std::uint32_t count = std::numeric_limits<std::uint32_t>::max()) noexcept;

// Bumps `word` and wakes every sleeper on it (a closing channel).
void wake_all(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters) noexcept;

// Waits for `word` to move from `seen`: polls it for as long as `spin` allows, then sleeps in
// the kernel for at most `slice`. How soon the answer came teaches `spin` the next budget.
void wait_for_change(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters,
                     const std::atomic<std::int64_t>* woken_ns, std::uint32_t seen,
                     std::chrono::nanoseconds slice, SpinPolicy& spin) noexcept;

// True on every 64th call on this thread: how often a push or pop looks whether something
// periodic is due (a clock read), so that the common call pays a thread-local increment.
inline bool now_and_then() noexcept {
  static thread_local std::uint32_t calls = 0;
  return (++calls & 63) == 0;
}

// Throttles the /proc reads of the peer-death check. The first check comes after the first
// sleep, not before it: a waiter that a message wakes (the common case) never pays for one,
// which at a few syscalls each dominated a round trip; a dead peer is noticed one slice later.
class PeerCheck {
 public:
  // Whether to check now.
  bool due();

 private:
  bool started_ = false;
  Clock::time_point next_{};
};

}  // namespace ferry::ring
