// Futex wait and wake on a 32-bit word in shared memory. Waits always carry a timeout so a
// caller can re-check its condition (and whether its peer is still alive) on a schedule.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ferry {

// Sleeps while *word == expected, for at most `timeout`. Returns on wake, timeout, a signal or
// a changed word; callers re-check their condition in every case. True only when a futex_wake
// woke it (and so counted it in what it returned).
bool futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) noexcept;

// Wakes every waiter on *word in any process; how many it woke.
std::uint32_t futex_wake_all(std::atomic<std::uint32_t>* word) noexcept;

// Wakes at most `count` waiters on *word in any process (those that waited longest first); how
// many it woke.
std::uint32_t futex_wake(std::atomic<std::uint32_t>* word, std::uint32_t count) noexcept;

}  // namespace ferry
