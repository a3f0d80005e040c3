// Whether this machine can run ferry's GPU tests and benchmarks, asked without touching CUDA
// here: a process that initialised CUDA cannot fork children that use it, and both callers fork
// their receivers afterwards.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ipc/cuda/ipc_api.hpp"

namespace ferry::test {

// "" when there is a GPU and LibTorch can use it, else why not. Asked in a forked child.
inline std::string gpu_unavailable() {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) return "fork failed";
  if (child == 0) {
    const char* why = !at::hasCUDA()              ? "this LibTorch was built without CUDA"
                      : !ferry::cuda::available() ? "no CUDA device (or driver) on this machine"
                                                  : "";
    (void)!::write(fds[1], why, std::char_traits<char>::length(why));
    ::_exit(0);
  }
  ::close(fds[1]);
  char buf[256];
  const ssize_t n = ::read(fds[0], buf, sizeof buf);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
}

}  // namespace ferry::test

// Ends a GPU test's process as skipped, printing why, where this machine cannot run it: 77 is
// what ctest reads as "Skipped" (SKIP_RETURN_CODE in test/CMakeLists.txt, test_util.hpp's kSkip).
#define REQUIRE_GPU()                                             \
  do {                                                            \
    const std::string why_ = ::ferry::test::gpu_unavailable();    \
    if (!why_.empty()) {                                          \
      std::fprintf(stderr, "SKIP: GPU test: %s\n", why_.c_str()); \
      std::fflush(nullptr);                                       \
      std::_Exit(77);                                             \
    }                                                             \
  } while (0)
