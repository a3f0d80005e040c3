// The restart policy, case by case: how a failed start is read, and what follows it.
#include "runtime/supervisor/restart_policy.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../catch.hpp"

#include "ipc/error.hpp"

namespace ferry::supervisor {
namespace {

using namespace std::chrono_literals;

// A real wait status: a child that ends the way `end` makes it.
template <class F>
int status_of(F end) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    end();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

}  // namespace

TEST_CASE("restart policy: a signal from outside is 'killed', the worker's own end 'crashed'") {
  CHECK(classify_exit(status_of([] { ::raise(SIGKILL); })) == StartFault::killed);
  CHECK(classify_exit(status_of([] {
          ::signal(SIGTERM, SIG_DFL);  // Catch2's handler would catch it and print a failure
          ::raise(SIGTERM);
        })) == StartFault::killed);
  CHECK(classify_exit(status_of([] { ::_exit(3); })) == StartFault::crashed);
  CHECK(classify_exit(status_of([] { ::_exit(0); })) == StartFault::crashed);
  CHECK(classify_exit(status_of([] {
          ::signal(SIGSEGV, SIG_DFL);
          ::raise(SIGSEGV);
        })) == StartFault::crashed);
  CHECK(classify_exit(status_of([] {
          ::signal(SIGABRT, SIG_DFL);
          ::raise(SIGABRT);
        })) == StartFault::crashed);
}

TEST_CASE("restart policy: a refusal gives up at once") {
  StartHistory h;
  const auto d = after_failed_start(RestartPolicy{}, h, StartFault::refused);
  CHECK(d.give_up);
  CHECK_THAT(d.why, Catch::Contains("refused"));
}

TEST_CASE("restart policy: crashes are retried with a doubling back-off, then given up") {
  RestartPolicy p;
  p.max_start_crashes = 3;
  p.backoff = 50ms;
  StartHistory h;
  auto d = after_failed_start(p, h, StartFault::crashed);
  CHECK_FALSE(d.give_up);
  CHECK(d.delay == 50ms);
  d = after_failed_start(p, h, StartFault::crashed);
  CHECK_FALSE(d.give_up);
  CHECK(d.delay == 100ms);
  d = after_failed_start(p, h, StartFault::crashed);
  CHECK(d.give_up);
  CHECK_THAT(d.why, Catch::Contains("3 failed starts in a row by its own fault"));
}

TEST_CASE("restart policy: kills from outside do not count as crashes, but have a limit") {
  RestartPolicy p;
  p.max_failed_starts = 6;
  p.max_start_crashes = 2;
  p.backoff = 10ms;
  p.backoff_max = 40ms;
  StartHistory h;
  std::vector<std::chrono::milliseconds> delays;
  for (int i = 0; i < 5; ++i) {
    const auto d = after_failed_start(p, h, StartFault::killed);
    REQUIRE_FALSE(d.give_up);
    delays.push_back(d.delay);
  }
  CHECK(delays == std::vector<std::chrono::milliseconds>{10ms, 20ms, 40ms, 40ms, 40ms});
  CHECK(h.crashed == 0);
  const auto d = after_failed_start(p, h, StartFault::killed);
  CHECK(d.give_up);
  CHECK_THAT(d.why, Catch::Contains("6 failed starts in a row"));
}

TEST_CASE("restart policy: one crash among kills is not yet a give-up") {
  RestartPolicy p;
  p.max_start_crashes = 2;
  StartHistory h;
  CHECK_FALSE(after_failed_start(p, h, StartFault::killed).give_up);
  CHECK_FALSE(after_failed_start(p, h, StartFault::crashed).give_up);
  CHECK_FALSE(after_failed_start(p, h, StartFault::killed).give_up);
  CHECK(after_failed_start(p, h, StartFault::crashed).give_up);
}

TEST_CASE("restart policy: limits out of range are errors naming the field") {
  RestartPolicy p;
  p.max_start_crashes = 0;
  CHECK_THROWS_WITH(validate(p), Catch::Contains("restart.max_start_crashes = 0"));
  p = {};
  p.backoff = -1ms;
  CHECK_THROWS_WITH(validate(p), Catch::Contains("restart.backoff"));
  p = {};
  p.backoff_max = 10ms;  // below backoff (50 ms)
  CHECK_THROWS_WITH(validate(p), Catch::Contains("restart.backoff_max"));
  CHECK_NOTHROW(validate(RestartPolicy{}));
}

}  // namespace ferry::supervisor
