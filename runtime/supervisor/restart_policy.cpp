#include "runtime/supervisor/restart_policy.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>

#include "ipc/error.hpp"

namespace ferry::supervisor {

const char* fault_name(StartFault f) noexcept {
  switch (f) {
    case StartFault::killed:
      return "killed";
    case StartFault::crashed:
      return "crashed";
    case StartFault::refused:
      return "refused";
  }
  return "?";
}

StartFault classify_exit(int wait_status) noexcept {
  if (!WIFSIGNALED(wait_status)) return StartFault::crashed;  // it chose its exit code
  switch (WTERMSIG(wait_status)) {
    // Signals a process rarely sends itself: somebody else ended it.
    case SIGKILL:
    case SIGTERM:
    case SIGINT:
    case SIGHUP:
      return StartFault::killed;
    default:  // SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL...: its own fault
      return StartFault::crashed;
  }
}

RestartDecision after_failed_start(const RestartPolicy& p, StartHistory& h, StartFault f) {
  ++h.failed;
  if (f == StartFault::crashed) ++h.crashed;
  RestartDecision d;
  if (f == StartFault::refused) {
    d.give_up = true;
    d.why = "it refused to start, and would again";
  } else if (h.crashed >= p.max_start_crashes) {
    d.give_up = true;
    d.why = std::to_string(h.crashed) + " failed starts in a row by its own fault";
  } else if (h.failed >= p.max_failed_starts) {
    d.give_up = true;
    d.why = std::to_string(h.failed) + " failed starts in a row";
  }
  if (d.give_up) return d;
  // 1x, 2x, 4x... the base, capped; the shift is bounded so it cannot overflow.
  const int doublings = std::min(h.failed - 1, 20);
  d.delay =
      std::min(p.backoff_max, std::chrono::milliseconds(p.backoff.count() * (1LL << doublings)));
  d.why = "retrying in " + std::to_string(d.delay.count()) + " ms (" + std::to_string(h.failed) +
          " failed start(s) in a row)";
  return d;
}

void validate(const RestartPolicy& p) {
  auto bad = [](const std::string& field, long long v, const std::string& accepted) {
    throw Error(Errc::invalid_argument,
                "restart." + field + " = " + std::to_string(v) + " is out of range; " + accepted);
  };
  if (p.max_failed_starts < 1 || p.max_failed_starts > 1000) {
    bad("max_failed_starts", p.max_failed_starts, "use 1..1000");
  }
  if (p.max_start_crashes < 1 || p.max_start_crashes > 1000) {
    bad("max_start_crashes", p.max_start_crashes, "use 1..1000");
  }
  if (p.backoff.count() < 0 || p.backoff.count() > 3600000) {
    bad("backoff (ms)", p.backoff.count(), "use 0..3600000");
  }
  if (p.backoff_max < p.backoff || p.backoff_max.count() > 3600000) {
    bad("backoff_max (ms)", p.backoff_max.count(), "use backoff..3600000");
  }
}

}  // namespace ferry::supervisor
