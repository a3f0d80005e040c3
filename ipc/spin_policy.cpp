#include "ipc/spin_policy.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "ipc/env.hpp"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

// A long wait counts as this many ceilings: enough to stop spinning at once, little enough that a
// few quick answers start it again.
constexpr std::int64_t kLongWaitCap = 8;

int online_cpus() noexcept {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

}  // namespace

SpinPolicy::SpinPolicy(nanoseconds ceiling) noexcept
    : ceiling_(std::max(ceiling, nanoseconds(0))), typical_ns_(ceiling_.count()) {}

nanoseconds SpinPolicy::ceiling_from_env() {
  const long long us = env::integer(
      "FERRY_SPIN_US",
      std::chrono::duration_cast<std::chrono::microseconds>(kDefaultCeiling).count(), 0, 10'000);
  // With one CPU the peer this process waits for cannot run while it spins.
  return online_cpus() < 2 ? nanoseconds(0) : nanoseconds(std::chrono::microseconds(us));
}

nanoseconds SpinPolicy::budget() const noexcept {
  const nanoseconds typical = this->typical();
  if (ceiling_.count() == 0 || typical > ceiling_) return nanoseconds(0);
  return std::min(std::max(2 * typical, kMinSpin), ceiling_);
}

void SpinPolicy::record(nanoseconds waited) noexcept {
  const std::int64_t cap = kLongWaitCap * std::max(ceiling_, kMinSpin).count();
  const std::int64_t w = std::clamp<std::int64_t>(waited.count(), 0, cap);
  const std::int64_t t = typical_ns_.load(std::memory_order_relaxed);
  typical_ns_.store(t + (w - t) / 4, std::memory_order_relaxed);
}

nanoseconds answered_after(Clock::time_point start, Clock::time_point woken_at,
                           Clock::time_point end) noexcept {
  if (woken_at < start || woken_at > end) return end - start;
  return woken_at - start;
}

bool spin_until_changed(const std::atomic<std::uint32_t>& word, std::uint32_t seen,
                        nanoseconds budget, bool yielding) noexcept {
  if (budget.count() <= 0) return false;
  const Clock::time_point until = Clock::now() + budget;
  for (;;) {
    // A clock read costs about as much as a few dozen polls: read it every 16.
    for (int i = 0; i < 16; ++i) {
      if (word.load(std::memory_order_acquire) != seen) return true;
      cpu_relax();
    }
    if (Clock::now() >= until) return word.load(std::memory_order_acquire) != seen;
    if (yielding) ::sched_yield();
  }
}

}  // namespace ferry
