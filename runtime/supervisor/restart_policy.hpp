// When a worker slot starts a new process, and when it gives up: the one decision, for the first
// start and every later one alike (docs/supervisor.md, "Restarts").
//
// A start is the span from launch to the worker's handshake. It can end badly three ways, and
// they are not equally telling:
//   killed   a signal from outside (SIGKILL, SIGTERM, SIGINT, SIGHUP: a user, the OOM killer, a
//            test's kill loop) ended it: the worker did nothing wrong, so it is tried again;
//   crashed  it died or exited by itself (an exit code, SIGSEGV, SIGABRT...) or never answered:
//            perhaps a passing cause, so it is tried again, a few times;
//   refused  it answered and said no (protocol version, device, task list), or could not be
//            launched at all: that answer will not change, so the slot is given up at once.
// Retries wait a back-off that doubles with each failure in a row, so a slot that keeps failing
// costs little; a worker that handshakes resets the count.
#pragma once

#include <chrono>
#include <string>

namespace ferry {

// The limits of the policy (PoolOptions::restart; ferry run --max-failed-starts and friends).
struct RestartPolicy {
  int max_failed_starts = 10;  // failed starts in a row, any cause, before the slot is given up
  int max_start_crashes = 3;   // of those, by the worker's own fault (crashed), before giving up
  std::chrono::milliseconds backoff{50};        // wait before the retry after one failure
  std::chrono::milliseconds backoff_max{2000};  // the doubling stops here
};

namespace supervisor {

enum class StartFault { killed, crashed, refused };
const char* fault_name(StartFault f) noexcept;

// How a start ended by the worker's process ending, from its wait status.
StartFault classify_exit(int wait_status) noexcept;

// Failed starts of one slot since its last successful handshake.
struct StartHistory {
  int failed = 0;   // in a row, any cause
  int crashed = 0;  // in a row, by the worker's own fault
};

struct RestartDecision {
  bool give_up = false;
  std::chrono::milliseconds delay{0};  // before the next start, when not giving up
  std::string why;                     // for the log and the error: "3 crashes in a row"
};

// After a failed start: retry after a back-off, or give up. `h` is updated.
RestartDecision after_failed_start(const RestartPolicy& p, StartHistory& h, StartFault f);

// Throws Error(invalid_argument) naming the field when a limit is out of range.
void validate(const RestartPolicy& p);

}  // namespace supervisor
}  // namespace ferry
