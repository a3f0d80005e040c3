// The CUDA transport's background threads (internal): the sender's reaper and the receiver's
// closer, both detached, both stopped at exit.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdlib>

#include "ipc/process.hpp"

namespace ferry::detail {

// How often each thread checks that the processes it depends on are alive.
inline constexpr auto kOwnerCheck = std::chrono::milliseconds(100);

// Set at exit: the background threads stop touching LibTorch and CUDA while they are torn down.
inline std::atomic<bool> g_cuda_threads_exiting{false};

// Registers, once per process (a forked child again), the exit handler that sets the flag.
inline void stop_threads_at_exit() {
  static std::atomic<pid_t> registered{0};
  const pid_t me = current_pid();
  if (registered.exchange(me) != me) std::atexit([] { g_cuda_threads_exiting = true; });
}

}  // namespace ferry::detail
