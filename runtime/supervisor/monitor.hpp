// The supervisor's monitor: one thread that waits, and wakes the pool when something happened.
//
// It decides nothing. Each round the pool names the fds to watch (every worker's pidfd, and the
// control socket of each worker still starting) and the next deadline (a handshake, a restart,
// a task timeout); wait() returns when one of them is due or any thread called rouse(), and the
// pool acts on what is ready. Workers are started from this thread, so it lives as long as they
// do: PR_SET_PDEATHSIG follows the thread that started a child.
#pragma once

#include <poll.h>

#include <vector>

#include "ipc/clock.hpp"
#include "ipc/fd.hpp"

namespace ferry::supervisor {

class Monitor {
 public:
  Monitor();  // throws Error(system) when no eventfd can be made

  int fd() const noexcept { return wake_.get(); }  // for a forked child to close

  // Wakes the current or next wait() (any thread; async-signal-safe).
  void rouse() const noexcept;

  // Waits until an fd of `watch` is readable (its revents set), rouse() was called, or `until`
  // passes (at most 250 ms: a lost wake-up costs no more). EINTR is a wake-up.
  void wait(std::vector<pollfd>& watch, Clock::time_point until);

 private:
  UniqueFd wake_;
};

}  // namespace ferry::supervisor
