#include "runtime/worker_launch.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "ipc/cuda/fork_safety.hpp"
#include "ipc/env.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"

extern char** environ;

namespace ferry {
namespace {

std::atomic<detail::WorkerEntry> g_entry{nullptr};
std::mutex g_dir_mu;
std::string g_library_dir;

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string self_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  return dir_of(std::string(buf, static_cast<std::size_t>(n)));
}

// What a worker starts with, whether forked or spawned: default dispositions for the signals a
// supervisor's own handlers (a test framework's crash handler, a CLI's SIGTERM handler) would
// otherwise catch in the child, so a crash ends the worker and its supervisor sees the signal.
constexpr int kDefaultSignals[] = {SIGINT, SIGTERM, SIGPIPE, SIGHUP,  SIGCHLD, SIGSEGV,
                                   SIGBUS, SIGFPE,  SIGILL,  SIGABRT, SIGQUIT};

[[noreturn]] void run_forked_child(int control, const std::vector<int>& close_in_child,
                                   pid_t parent) {
  for (int fd : close_in_child) ::close(fd);
  for (int sig : kDefaultSignals) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(120);  // the supervisor died before the line above
  // _exit, never exit: the parent's atexit handlers and static destructors are not ours to run.
  ::_exit(g_entry.load()(control));
}

pid_t fork_worker(int control, const std::vector<int>& close_in_child) {
  if (!g_entry.load()) {
    throw Error(Errc::invalid_argument,
                "start=fork runs the worker loop in a child of this program, but this program "
                "does not link the worker library (ferry::worker); link it, or use start=spawn");
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno(Errc::system, "fork of a worker", errno);
  if (pid == 0) run_forked_child(control, close_in_child, parent);
  return pid;
}

pid_t spawn_worker(int control, const std::string& executable,
                   const std::vector<std::string>& args) {
  // The control socket becomes a low, predictable fd without FD_CLOEXEC in the child only.
  const int target = control == 3 ? 4 : 3;
  const std::string target_arg = std::to_string(target);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, control, target);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The supervisor's signal mask and dispositions are its own business; a worker starts clean.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : kDefaultSignals) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<const char*> argv{executable.c_str()};
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.insert(argv.end(), {"--ferry-control-fd", target_arg.c_str(), nullptr});
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, executable.c_str(), &actions, &attr,
                                const_cast<char* const*>(argv.data()), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    throw_errno(Errc::invalid_argument,
                "cannot spawn worker executable '" + executable +
                    "' (set PoolOptions::worker_executable, ferry run --worker, or FERRY_WORKER)",
                err);
  }
  return pid;
}

}  // namespace

const char* start_name(Start s) noexcept {
  switch (s) {
    case Start::Auto:
      return "auto";
    case Start::Fork:
      return "fork";
    case Start::Spawn:
      return "spawn";
  }
  return "?";
}

Start parse_start(const std::string& s) {
  if (s == "auto") return Start::Auto;
  if (s == "fork") return Start::Fork;
  if (s == "spawn") return Start::Spawn;
  throw Error(Errc::invalid_argument, "start method '" + s + "' is not one of auto, fork, spawn");
}

Start resolve_start(Start requested) {
  if (requested == Start::Spawn) return Start::Spawn;
  const bool cuda = cuda::initialised();
  if (requested == Start::Auto) return cuda ? Start::Spawn : Start::Fork;
  if (cuda) {
    throw Error(Errc::invalid_argument,
                "start=fork refused: CUDA is already initialised in this process, and a forked "
                "child cannot use it (its first CUDA call would fail or hang); use start=spawn "
                "(ferry run --start spawn), or auto, which picks spawn by itself");
  }
  return Start::Fork;
}

LaunchedWorker launch_worker(Start how, int control, const std::string& executable,
                             const std::vector<int>& close_in_child,
                             const std::vector<std::string>& args) {
  LaunchedWorker w;
  w.how = how;
  w.pid = how == Start::Fork ? fork_worker(control, close_in_child)
                             : spawn_worker(control, executable, args);
  try {
    w.pidfd = open_pidfd(w.pid);
  } catch (...) {
    ::kill(w.pid, SIGKILL);
    throw;
  }
  log().debug("started worker pid {} by {}", w.pid, start_name(how));
  return w;
}

std::string find_worker_executable(const std::string& requested) {
  if (!requested.empty()) return requested;
  if (std::string env = env::text("FERRY_WORKER", ""); !env.empty()) return env;
  std::vector<std::string> tried;
  {
    std::lock_guard<std::mutex> lock(g_dir_mu);
    if (!g_library_dir.empty()) {
      tried.push_back(g_library_dir + "/ferry-worker");
      tried.push_back(g_library_dir + "/../bin/ferry-worker");
      tried.push_back(g_library_dir + "/../../bin/ferry-worker");  // lib/<multiarch>/ on Debian
    }
  }
  if (std::string self = self_dir(); !self.empty()) tried.push_back(self + "/ferry-worker");
  std::string list;
  for (const auto& p : tried) {
    if (::access(p.c_str(), X_OK) == 0) return p;
    list += (list.empty() ? "" : ", ") + p;
  }
  throw Error(Errc::invalid_argument,
              "no ferry-worker executable found (tried " + (list.empty() ? "nothing" : list) +
                  "); install ferry, or name one with PoolOptions::worker_executable, "
                  "ferry run --worker PATH, or FERRY_WORKER");
}

namespace detail {
void register_worker_library(WorkerEntry entry, const std::string& library_dir) {
  g_entry.store(entry);
  std::lock_guard<std::mutex> lock(g_dir_mu);
  g_library_dir = library_dir;
}
}  // namespace detail

}  // namespace ferry
