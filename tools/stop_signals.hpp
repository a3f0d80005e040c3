// SIGINT and SIGTERM to a supervisor (`ferry run`, `ferry host`) stop it cleanly: one thread of
// ferry's acts on the signal (closes the pool, so workers are stopped and reaped), whichever
// thread the kernel hands it to. Blocking the signals in main() is not enough on its own: threads
// started before main() (a library's constructor) or by code that unblocks them (a GPU driver's)
// may take a process-directed signal, and its default action would end the process with workers
// and no message left behind. So a handler records the signal and wakes the one thread that acts.
#pragma once

#include <functional>
#include <thread>

namespace ferry::tools {

// Call first thing in main(), before anything starts a thread: blocks SIGINT and SIGTERM in this
// thread (every thread it starts inherits that) and installs the recording handler.
void catch_stop_signals();

// The signal that arrived first (SIGINT or SIGTERM), 0 while none has.
int stop_signal() noexcept;

// Calls `on_stop` on a thread of its own once a stop signal arrives (at once if one came
// earlier); it is the thread that takes the signals from then on. Released and joined when it
// goes out of scope, signal or not.
class StopSignalThread {
 public:
  explicit StopSignalThread(std::function<void()> on_stop);
  ~StopSignalThread();
  StopSignalThread(const StopSignalThread&) = delete;
  StopSignalThread& operator=(const StopSignalThread&) = delete;

 private:
  int release_ = -1;  // an eventfd: written by the destructor
  std::thread thread_;
};

}  // namespace ferry::tools
