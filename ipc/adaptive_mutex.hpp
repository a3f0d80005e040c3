// AdaptiveMutex: a std::mutex that tries itself for a moment before its taker sleeps on it.
//
// A std::mutex taken while held puts its taker to sleep in the kernel at once, and its holder
// pays a futex wake-up on the way out: several microseconds each on a small VM, where the
// critical sections it guards (a pool's task book, a stream's results) take a fraction of one.
// A pool's caller and collector threads met on such locks for every task. glibc's adaptive kind
// spins a bounded number of tries first; elsewhere this is a plain std::mutex. It is one: a
// std::lock_guard, a std::unique_lock and a std::condition_variable take it as one.
#pragma once

#include <pthread.h>

#include <mutex>

namespace ferry {

class AdaptiveMutex : public std::mutex {
 public:
  AdaptiveMutex() noexcept {
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    // Not yet used by anyone: made again as the adaptive kind, in place.
    pthread_mutexattr_t attr;
    if (pthread_mutexattr_init(&attr) == 0) {
      if (pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP) == 0) {
        pthread_mutex_init(native_handle(), &attr);
      }
      pthread_mutexattr_destroy(&attr);
    }
#endif
  }
};

}  // namespace ferry
