#include "ipc/channel_wait.hpp"

#include <algorithm>

#include "ipc/futex.hpp"

namespace ferry::ring {
namespace {

// Checking peers reads /proc, so a busy waiter does it at most this often.
constexpr std::chrono::milliseconds kPeerCheckInterval{100};

// A sleeper counts itself in `waiters`; the one that ends its sleep takes it out of the count:
// its waker, by the number the kernel says it woke, or the sleeper itself when its sleep ended
// otherwise (a slice's end, a signal, a word that had already moved). So a woken sleeper that has
// not run yet (on a busy machine, for a while) is no longer counted, and the messages pushed in
// the meantime make no futex call each to wake it again: on two cores those calls were half the
// futex calls of a pool of empty tasks. A process killed between the kernel's wake and its
// subtraction leaves the count too high, which costs spare wakes, never a lost one.
void sleep_on(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters,
              std::uint32_t seen, std::chrono::nanoseconds slice) noexcept {
  waiters->fetch_add(1, std::memory_order_seq_cst);
  if (!futex_wait(word, seen, slice)) waiters->fetch_sub(1, std::memory_order_seq_cst);
}

void uncount(std::atomic<std::uint32_t>* waiters, std::uint32_t woken) noexcept {
  if (woken != 0) waiters->fetch_sub(woken, std::memory_order_seq_cst);
}

}  // namespace

std::string ms_text(std::chrono::milliseconds ms) {
  return std::to_string(ms.count()) + " ms";
}

Deadline::Deadline(std::chrono::milliseconds timeout)
    : forever_(timeout.count() < 0),
      at_(Clock::now() + std::max(timeout, std::chrono::milliseconds(0))) {}

bool Deadline::passed() const {
  return !forever_ && Clock::now() >= at_;
}

std::chrono::nanoseconds Deadline::slice() const {
  if (forever_) return kWaitSlice;
  return std::clamp<std::chrono::nanoseconds>(at_ - Clock::now(), std::chrono::nanoseconds(0),
                                              kWaitSlice);
}

// The waker bumps the word then reads the waiter count; the waiter counts itself then lets the
// kernel compare the word. Both sequentially consistent, so either the waker sees the waiter or
// the waiter sees the new word and does not sleep. `count` waiters at most are woken: producers
// waiting for room get as many as the records a pop freed (more could not all fit; waking every
// one made many producers, the fan-in layout, fight over each slot: with 8, 1.5x the messages/s
// and a third of the p99 this way). A woken producer that finds too little room sleeps again at
// the back of the queue, so the next pop wakes another; a woken one that dies costs the others
// at most one wait slice.
// The stamp is written only on the way into the kernel: a waiter found polling measures its own
// wait, so the path without sleepers reads no clock.
void wake(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters,
          std::atomic<std::int64_t>* woken_ns, std::uint32_t count) noexcept {
  word->fetch_add(1, std::memory_order_seq_cst);
  if (waiters->load(std::memory_order_seq_cst) != 0) {
    woken_ns->store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    uncount(waiters, futex_wake(word, count));
  }
}

void wake_all(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters) noexcept {
  word->fetch_add(1, std::memory_order_seq_cst);
  uncount(waiters, futex_wake_all(word));
}

// A waiter found while polling is not counted asleep, so its waker makes no futex call either.
void wait_for_change(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters,
                     const std::atomic<std::int64_t>* woken_ns, std::uint32_t seen,
                     std::chrono::nanoseconds slice, SpinPolicy& spin) noexcept {
  const Clock::time_point start = Clock::now();
  if (spin_until_changed(*word, seen, std::min(spin.budget(), slice), spin.yielding())) {
    spin.record(Clock::now() - start);
    return;
  }
  sleep_on(word, waiters, seen, slice);
  const Clock::time_point woken_at{Clock::duration(woken_ns->load(std::memory_order_acquire))};
  spin.record(answered_after(start, woken_at, Clock::now()));
}

bool PeerCheck::due() {
  auto now = Clock::now();
  if (!started_) {
    started_ = true;
    next_ = now;
    return false;
  }
  if (now < next_) return false;
  next_ = now + kPeerCheckInterval;
  return true;
}

}  // namespace ferry::ring
