// ferry-test-worker: a custom worker executable (built-in tasks plus test/workers/test_tasks.cpp),
// built the way docs/embedding.md tells users to build theirs.
//
// For the supervisor's restart tests it can also misbehave at start-up, by plan: when
// FERRY_TEST_START_PLAN names a file, each start takes that file's first line and acts on it:
//   kill      SIGKILL itself (what a kill from outside looks like to the supervisor)
//   crash     print a message and exit with code 3 (a start that fails by its own fault)
//   sleep:MS  wait MS milliseconds, then start (a slow start)
//   ok, or no line left: start normally.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "ipc/env.hpp"
#include "workers/worker_loop.hpp"

namespace {

std::string next_step(const char* path) {
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return "ok";
  ::flock(fd, LOCK_EX);  // the pool starts several workers at once
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
    all.append(buf, static_cast<std::size_t>(n));
  const auto nl = all.find('\n');
  const std::string step = all.substr(0, nl);
  const std::string rest = nl == std::string::npos ? "" : all.substr(nl + 1);
  // A plan not rewritten would replay this step at every later start, and the test would fail on
  // some count far from the cause: stop here, saying why.
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, rest.data(), rest.size(), 0) != static_cast<ssize_t>(rest.size())) {
    std::perror("ferry-test-worker: cannot rewrite FERRY_TEST_START_PLAN");
    std::exit(4);
  }
  ::close(fd);  // releases the lock
  return step.empty() ? "ok" : step;
}

}  // namespace

int main(int argc, char** argv) {
  if (const std::string plan = ferry::env::text("FERRY_TEST_START_PLAN", ""); !plan.empty()) {
    const std::string step = next_step(plan.c_str());
    if (step == "kill") ::raise(SIGKILL);
    if (step == "crash") {
      std::fprintf(stderr, "ferry-test-worker: crashing at start, as planned\n");
      return 3;
    }
    if (step.rfind("sleep:", 0) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(step.c_str() + 6)));
    }
  }
  return ferry::worker_main(argc, argv);
}
