// Helpers for tests that cross real process boundaries.
#pragma once

#include <dirent.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "catch.hpp"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ferry::test {

// Exit code a child uses to say "skipped" (it printed why).
inline constexpr int kSkip = 77;

// Whether this is a ThreadSanitizer build (`make tsan`). TSan cannot follow a fork from a process
// with threads whose child starts threads of its own: GCC 12's aborts the child ("dup thread with
// used id"), later ones stop checking it. Tests that need no fork in particular spawn instead.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kUnderTsan = true;
#else
inline constexpr bool kUnderTsan = false;
#endif
#else
inline constexpr bool kUnderTsan = false;
#endif

// Runs `fn` in a forked child that dies with the test process. The child exits 0 when fn
// returns, 1 when it throws (printing what), or with the code fn passed to _exit itself.
inline pid_t fork_child(const std::function<void()>& fn) {
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(3);
  try {
    fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %d failed: %s\n", static_cast<int>(::getpid()), e.what());
    ::_exit(1);
  } catch (...) {
    ::_exit(2);
  }
  ::_exit(0);
}

// Waits for `pid`; kills it and fails the test if it outlives `timeout`. Returns its exit code,
// or 128 + signal when a signal ended it.
inline int wait_child(pid_t pid, std::chrono::seconds timeout = std::chrono::seconds(120)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL("child " << pid << " hung past " << timeout.count() << " s and was killed");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs `fn` in a child and requires it to succeed; a child that skipped makes the test pass
// with a visible note.
inline void in_child(const std::function<void()>& fn) {
  const int code = wait_child(fork_child(fn));
  if (code == kSkip) {
    WARN("skipped in the child (reason printed above)");
    return;
  }
  REQUIRE(code == 0);
}

// The names in /dev/shm that segments of these processes have (ferry-<pid>-<n>). A test checks
// these, never the whole folder: other tests and programs come and go there beside it (CUDA's
// cuda.shm.*, torch's torch_*, Python's sem.mp-* on a GPU machine).
inline std::set<std::string> shm_names_of(const std::vector<pid_t>& pids) {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      for (pid_t p : pids)
        if (name.rfind("ferry-" + std::to_string(p) + "-", 0) == 0) names.insert(name);
    }
    ::closedir(d);
  }
  return names;
}

// Whether a path /proc shows for an fd or a mapping is one of ferry's segments: a nameless file in
// `shm_dir` ("/dev/shm/#1234 (deleted)") or a memfd ("/memfd:ferry-segment (deleted)").
inline bool is_segment_path(const std::string& path, const std::string& shm_dir) {
  return path.rfind(shm_dir + "/", 0) == 0 || path.rfind("/memfd:ferry-segment", 0) == 0;
}

// Where a private_tmpfs() child's segments go: into that tmpfs (FERRY_SHM_BACKING=dir, the
// fallback a small /dev/shm can fill), or memfds (the default, which it cannot).
enum class SegmentsIn { tmpfs, memfd };

// In a (single-threaded) child: replaces /dev/shm, in a private mount namespace, with a tmpfs of
// `bytes` (a container's small /dev/shm, nothing changed outside the child) and returns its
// path, or exits the child with kSkip when this machine does not allow it. With
// SegmentsIn::tmpfs, ferry's segments are made there.
inline std::string private_tmpfs(std::size_t bytes, SegmentsIn segments = SegmentsIn::tmpfs) {
  if (segments == SegmentsIn::tmpfs) ::setenv("FERRY_SHM_BACKING", "dir", 1);
  if (::unshare(CLONE_NEWNS) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    std::fprintf(stderr, "SKIP: cannot make a private mount namespace here (%s); needs root\n",
                 std::strerror(errno));
    ::_exit(kSkip);
  }
  const std::string opts = "size=" + std::to_string(bytes);
  if (::mount("tmpfs", "/dev/shm", "tmpfs", 0, opts.c_str()) != 0) {
    std::fprintf(stderr, "SKIP: cannot mount a tmpfs (%s)\n", std::strerror(errno));
    ::_exit(kSkip);
  }
  return "/dev/shm";
}

// A fresh memory cgroup below this process's own, limited to `limit` bytes: its directory, or
// "" (with the reason in *why) where cgroups cannot be made here. The caller removes it
// (rmdir) once the processes it moved there have exited.
inline std::string make_memory_cgroup(std::uint64_t limit, std::string* why) {
  std::ifstream self("/proc/self/cgroup");
  std::string line, v1, v2;
  bool have_v1 = false, have_v2 = false;
  while (std::getline(self, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    std::stringstream names(controllers);
    for (std::string c; std::getline(names, c, ',');) {
      if (c == "memory") {
        have_v1 = true;
        v1 = path;
      }
    }
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      have_v2 = true;
      v2 = path;
    }
  }
  std::string dir, limit_file;
  if (have_v1) {
    dir = "/sys/fs/cgroup/memory" + (v1 == "/" ? "" : v1);
    limit_file = "memory.limit_in_bytes";
  } else if (have_v2) {
    dir = "/sys/fs/cgroup" + (v2 == "/" ? "" : v2);
    limit_file = "memory.max";
  } else {
    *why = "no memory cgroup";
    return "";
  }
  dir += "/ferry-shm-test-" + std::to_string(::getpid());
  if (::mkdir(dir.c_str(), 0755) != 0) {
    *why = "cannot create " + dir + ": " + std::strerror(errno);
    return "";
  }
  std::ofstream(dir + "/" + limit_file) << limit;
  std::ifstream check(dir + "/" + limit_file);
  std::uint64_t got = 0;
  if (!(check >> got) || got != limit) {
    ::rmdir(dir.c_str());
    *why = "cannot set a memory limit in " + dir;
    return "";
  }
  return dir;
}

// Runs `fn` in a forked child moved into a fresh memory cgroup of `limit` bytes, then removes
// the cgroup. Where no cgroup can be made here, or the child exits with kSkip, the test passes
// with a visible note; any other exit but 0 fails it (a SIGKILL from the OOM killer among them).
inline void in_memory_cgroup(std::uint64_t limit, const std::function<void()>& fn) {
  std::string why;
  const std::string cg = make_memory_cgroup(limit, &why);
  if (cg.empty()) {
    WARN("SKIP: " << why);
    return;
  }
  const int code = wait_child(fork_child([&] {
    std::ofstream(cg + "/cgroup.procs") << ::getpid();
    fn();
  }));
  // The child has exited, so the cgroup is empty and can go.
  for (int i = 0; i < 100 && ::rmdir(cg.c_str()) != 0; ++i) ::usleep(10000);
  if (code == kSkip) {
    WARN("skipped in the child (reason printed above)");
    return;
  }
  REQUIRE(code == 0);
}

}  // namespace ferry::test

namespace ferry::test {

// In a (single-threaded) child: runs `fn` as pid 1 of new pid and mount namespaces with their
// own /proc and a tmpfs of `shm_bytes` at /dev/shm, like a container, so /proc shows the test's
// processes only. Exits the calling child with fn's outcome (0, 1 when it throws, or its own
// _exit code), or with kSkip when this machine does not allow namespaces.
[[noreturn]] inline void run_in_private_container(std::size_t shm_bytes,
                                                  const std::function<void()>& fn) {
  if (::unshare(CLONE_NEWNS | CLONE_NEWPID) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    std::fprintf(stderr,
                 "SKIP: cannot make private pid and mount namespaces here (%s); needs "
                 "root\n",
                 std::strerror(errno));
    ::_exit(kSkip);
  }
  std::fflush(nullptr);
  const pid_t init = ::fork();
  if (init == 0) {
    if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
      std::fprintf(stderr, "SKIP: cannot mount /proc in a pid namespace (%s)\n",
                   std::strerror(errno));
      ::_exit(kSkip);
    }
    private_tmpfs(shm_bytes);  // already in a private mount namespace: this mounts only
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "container init failed: %s\n", e.what());
      ::_exit(1);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  int status = 0;
  if (init < 0 || ::waitpid(init, &status, 0) != init) ::_exit(4);
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

}  // namespace ferry::test

namespace ferry::test {

// In a (single-threaded) child: takes CAP_SYS_PTRACE from this process and from everything it
// starts or executes (bounding, permitted and effective sets), as container runtimes do. Root
// then cannot read the /proc/<pid>/fd or maps of a process that is not dumpable. Exits the child
// with kSkip when the capability cannot be dropped.
inline void drop_cap_sys_ptrace() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  const unsigned bit = 1u << (CAP_SYS_PTRACE % 32);
  if (::prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0) != 0 ||
      ::syscall(SYS_capget, &header, data) != 0) {
    std::fprintf(stderr, "SKIP: cannot drop CAP_SYS_PTRACE (%s)\n", std::strerror(errno));
    ::_exit(kSkip);
  }
  data[CAP_SYS_PTRACE / 32].effective &= ~bit;
  data[CAP_SYS_PTRACE / 32].permitted &= ~bit;
  data[CAP_SYS_PTRACE / 32].inheritable &= ~bit;
  if (::syscall(SYS_capset, &header, data) != 0) {
    std::fprintf(stderr, "SKIP: cannot drop CAP_SYS_PTRACE (%s)\n", std::strerror(errno));
    ::_exit(kSkip);
  }
}

}  // namespace ferry::test
