// The ring lock (internal): the robust process-shared mutex in a channel's header, which every
// push, pop and custody call holds while it reads or commits the ring.
#pragma once

#include <pthread.h>

#include <chrono>

#include "ipc/channel_layout.hpp"
#include "ipc/channel_wait.hpp"

namespace ferry::ring {

// Holds the ring mutex; a previous owner's death is repaired on the way in, which is sound
// because an owner that dies before its commit store has changed nothing a reader can see.
//
// The lock is taken in timed slices, not with a plain pthread_mutex_lock: an unlock wakes a
// single waiter and clears the waiters bit, so if that waiter is SIGKILLed before it takes the
// lock, and another process takes and releases it meanwhile, the remaining waiters are never
// woken. A sliced wait turns that lost wake-up into a delay of at most one slice.
class Lock {
 public:
  // Takes `h`'s lock before `deadline`, else throws Error(timeout) naming `op` and `timeout`.
  Lock(Header* h, const Deadline& deadline, const char* op, std::chrono::milliseconds timeout);
  ~Lock();
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  pthread_mutex_t* mutex_;
};

}  // namespace ferry::ring
