#include "tools/stop_signals.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "ipc/error.hpp"

namespace ferry::tools {
namespace {

std::atomic<int> g_signal{0};
int g_wake[2] = {-1, -1};  // a pipe: the handler writes, the signal thread reads

constexpr int kStopSignals[] = {SIGINT, SIGTERM};

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
  return set;
}

// Async-signal-safe: an atomic and a write to a non-blocking pipe, errno kept.
void record(int sig) {
  const int saved = errno;
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  const char byte = 1;
  (void)!::write(g_wake[1], &byte, 1);
  errno = saved;
}

}  // namespace

void catch_stop_signals() {
  if (::pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw_errno(Errc::system, "pipe2 for the stop signals", errno);
  }
  const sigset_t set = stop_set();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  struct sigaction sa {};
  sa.sa_handler = record;
  sa.sa_flags = SA_RESTART;
  sigfillset(&sa.sa_mask);
  for (int sig : kStopSignals) ::sigaction(sig, &sa, nullptr);
}

int stop_signal() noexcept {
  return g_signal.load();
}

StopSignalThread::StopSignalThread(std::function<void()> on_stop)
    : release_(::eventfd(0, EFD_CLOEXEC)) {
  if (release_ < 0) throw_errno(Errc::system, "eventfd for the stop signal thread", errno);
  thread_ = std::thread([this, on_stop = std::move(on_stop)] {
    // The one thread of ferry's with the signals unblocked: a signal pending since main()
    // blocked them is delivered here now.
    const sigset_t set = stop_set();
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    pollfd fds[2] = {{g_wake[0], POLLIN, 0}, {release_, POLLIN, 0}};
    for (;;) {
      if (g_signal.load() != 0) {
        ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
        on_stop();
        return;
      }
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (fds[1].revents != 0) return;  // released: the caller finished
      char drain[16];
      while (::read(g_wake[0], drain, sizeof drain) > 0) {
      }
    }
  });
}

StopSignalThread::~StopSignalThread() {
  const std::uint64_t one = 1;
  (void)!::write(release_, &one, sizeof one);
  thread_.join();
  ::close(release_);
}

}  // namespace ferry::tools
