#include "ipc/channel_lock.hpp"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/spin_policy.hpp"

#if defined(__SANITIZE_THREAD__)
#define FERRY_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_UNDER_TSAN 1
#endif
#endif
#ifdef FERRY_UNDER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace ferry::ring {
namespace {

// The messages between head and tail, read from the first slot of each (its record count).
// Called with the lock held, after a previous owner died holding it.
void recount_messages(Header* h) noexcept {
  const auto* slots = reinterpret_cast<const std::byte*>(h) + kHeaderBytes;
  const std::uint64_t tail = h->tail.load(std::memory_order_relaxed);
  std::uint64_t at = h->head.load(std::memory_order_relaxed);
  std::uint32_t n = 0;
  while (at < tail) {
    std::uint32_t count = 0;
    std::memcpy(&count, slots + (at % h->capacity) * h->slot_size, sizeof count);
    if (count == 0) break;  // corrupt: pop reports it
    at += count;
    ++n;
  }
  h->messages.store(n, std::memory_order_relaxed);
}

// Takes `mutex` unless `slice` passes first (ETIMEDOUT). ThreadSanitizer must see the lock taken
// to see what it guards, and GCC 12's does not intercept pthread_mutex_clocklock (glibc 2.30),
// so under TSan the same robust mutex is taken by pthread_mutex_timedlock, which every TSan
// sees, against the wall clock: a clock step only stretches one slice, the deadline stays the
// steady clock's. TSan's timedlock records only a plain success, so a lock that comes with
// EOWNERDEAD (held all the same) is told to it.
int lock_for(pthread_mutex_t* mutex, std::chrono::nanoseconds slice) {
#ifdef FERRY_UNDER_TSAN
  constexpr clockid_t kClock = CLOCK_REALTIME;
#else
  constexpr clockid_t kClock = CLOCK_MONOTONIC;
#endif
  timespec until{};
  clock_gettime(kClock, &until);
  until.tv_nsec += static_cast<long>(slice.count());
  until.tv_sec += until.tv_nsec / 1'000'000'000;
  until.tv_nsec %= 1'000'000'000;
#ifdef FERRY_UNDER_TSAN
  const int rc = pthread_mutex_timedlock(mutex, &until);
  if (rc == EOWNERDEAD) {
    __tsan_mutex_pre_lock(mutex, __tsan_mutex_try_lock);
    __tsan_mutex_post_lock(mutex, __tsan_mutex_try_lock, 0);
  }
  return rc;
#else
  return pthread_mutex_clocklock(mutex, kClock, &until);
#endif
}

// Tries `mutex` for a moment before the caller sleeps on it: EBUSY when it stayed taken. Its
// holders keep it for a copy of a few records, far shorter than a futex sleep and the wake-up
// that ends it (several microseconds each on a small VM, and the holder pays for the wake-up
// too): a pool's caller, collector and worker met on it for every task. Not where this process
// has one CPU (FERRY_SPIN_US=0 says the same), where the holder cannot run while it is tried.
int try_briefly(pthread_mutex_t* mutex) noexcept {
  constexpr int kTries = 64;  // a few microseconds
  static const bool may_spin = [] {
    try {
      return SpinPolicy::ceiling_from_env().count() > 0;
    } catch (const Error&) {
      return false;  // a bad FERRY_SPIN_US is reported by the waits that read it
    }
  }();
  if (!may_spin) return EBUSY;
  for (int i = 0; i < kTries; ++i) {
    const int rc = pthread_mutex_trylock(mutex);
    if (rc != EBUSY) return rc;
    cpu_relax();
  }
  return EBUSY;
}

}  // namespace

Lock::Lock(Header* h, const Deadline& deadline, const char* op, std::chrono::milliseconds timeout)
    : mutex_(&h->mutex) {
  int rc = try_briefly(mutex_);
  while (rc == EBUSY || rc == ETIMEDOUT) {
    rc = lock_for(mutex_, kWaitSlice);
    if (rc != ETIMEDOUT) break;
    if (deadline.passed()) {
      throw Error(Errc::timeout, std::string(op) + " timed out after " + ms_text(timeout) +
                                     " waiting for the channel lock, which another process "
                                     "holds (a slow claim callback?); pass a longer timeout");
    }
  }
  if (rc == EOWNERDEAD) {
    ferry::log().debug("channel: a process died holding the ring lock; recovered");
    rc = pthread_mutex_consistent(mutex_);
    if (rc != 0) {
      pthread_mutex_unlock(mutex_);
      throw_errno(Errc::system, "pthread_mutex_consistent on the channel lock", rc);
    }
    recount_messages(h);
  } else if (rc == ENOTRECOVERABLE) {
    throw Error(Errc::system,
                "the channel lock is unrecoverable (a previous owner died and its recovery "
                "failed); create a new channel");
  } else if (rc != 0) {
    throw_errno(Errc::system, "pthread_mutex_clocklock on the channel lock", rc);
  }
}

Lock::~Lock() {
  if (int rc = pthread_mutex_unlock(mutex_); rc != 0) {
    ferry::log().error("channel: unlocking the ring lock failed: {}", std::strerror(rc));
  }
}

}  // namespace ferry::ring
