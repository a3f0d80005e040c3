// A worker process's life: the handshake on its control socket, then tasks from its queue until
// the supervisor closes the queue (exit 0) or is gone (exit 4). A forked worker runs this in the
// child; a spawned one runs it from worker_main().
#pragma once

namespace ferry {

// Exit codes of a worker process.
inline constexpr int kWorkerStopped = 0;         // the supervisor closed its queue
inline constexpr int kWorkerFailed = 1;          // an unexpected error (message on stderr)
inline constexpr int kWorkerUsage = 2;           // started by hand, or with bad arguments
inline constexpr int kWorkerRefused = 3;         // the handshake failed (message on stderr)
inline constexpr int kWorkerSupervisorGone = 4;  // its supervisor exited

// Runs the worker on an inherited control socket; returns the exit code.
int run_worker(int control_fd);

// main() of a worker executable: `PROGRAM --ferry-control-fd N` (as a supervisor starts it) or
// `PROGRAM --list-tasks`. A custom worker is this plus its own FERRY_TASKs:
//   int main(int argc, char** argv) { return ferry::worker_main(argc, argv); }
int worker_main(int argc, char** argv);

}  // namespace ferry
