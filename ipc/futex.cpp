#include "ipc/futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <ctime>

namespace ferry {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t),
              "futex words must be plain 32-bit integers");

bool futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) noexcept {
  if (timeout.count() <= 0) return false;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  // Not FUTEX_PRIVATE: the word is shared between processes.
  // 0 is a FUTEX_WAKE's doing; a timeout, a signal or a changed word fail with their errno.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts,
                   nullptr, 0) == 0;
}

std::uint32_t futex_wake(std::atomic<std::uint32_t>* word, std::uint32_t count) noexcept {
  const int n = static_cast<int>(std::min<std::uint32_t>(count, INT_MAX));
  const long woken = ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, n,
                               nullptr, nullptr, 0);
  return woken > 0 ? static_cast<std::uint32_t>(woken) : 0;
}

std::uint32_t futex_wake_all(std::atomic<std::uint32_t>* word) noexcept {
  return futex_wake(word, INT_MAX);
}

}  // namespace ferry
