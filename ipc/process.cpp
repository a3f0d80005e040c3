#include "ipc/process.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "ipc/error.hpp"

namespace ferry {
namespace {

std::atomic<pid_t> g_pid{0};
std::atomic<std::uint64_t> g_token{0};

void reset_after_fork() noexcept {
  g_pid.store(0);
  g_token.store(0);
}

[[maybe_unused]] const int g_atfork = [] {
  return pthread_atfork(nullptr, nullptr, reset_after_fork);
}();

}  // namespace

pid_t current_pid() noexcept {
  pid_t p = g_pid.load(std::memory_order_relaxed);
  if (p == 0) {
    p = ::getpid();
    g_pid.store(p, std::memory_order_relaxed);
  }
  return p;
}

std::uint64_t process_token() noexcept {
  std::uint64_t t = g_token.load(std::memory_order_relaxed);
  while (t == 0) {
    if (::getrandom(&t, sizeof t, 0) != static_cast<ssize_t>(sizeof t)) {
      t = (static_cast<std::uint64_t>(::getpid()) << 32) ^
          static_cast<std::uint64_t>(::time(nullptr));
    }
    std::uint64_t zero = 0;
    if (!g_token.compare_exchange_strong(zero, t)) t = zero;
  }
  return t;
}

bool process_alive(pid_t pid) noexcept {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // kill() succeeds on zombies; /proc/<pid>/stat's state field tells them apart.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the command name may itself contain ')'
  if (!paren || paren[1] != ' ') return true;
  char state = paren[2];
  return state != 'Z' && state != 'X';
}

UniqueFd open_pidfd(pid_t pid) {
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    throw_errno(Errc::system,
                "pidfd_open(" + std::to_string(pid) + ") (ferry needs Linux 5.3 or newer)", errno);
  }
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return UniqueFd(static_cast<int>(fd));
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = ::sigabbrev_np(sig);
    std::string s =
        "killed by " + (abbrev ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig));
    if (WCOREDUMP(status)) s += " (core dumped)";
    return s;
  }
  return "ended with wait status " + std::to_string(status);
}

std::string describe_exit(pid_t pid) {
  siginfo_t info{};
  if (pid <= 0 ||
      ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid) {
    return "exited";
  }
  switch (info.si_code) {
    case CLD_EXITED:
      return describe_wait_status(W_EXITCODE(info.si_status, 0));
    case CLD_KILLED:
      return describe_wait_status(info.si_status);
    case CLD_DUMPED:
      return describe_wait_status(info.si_status | WCOREFLAG);
    default:
      return "exited";
  }
}

}  // namespace ferry
