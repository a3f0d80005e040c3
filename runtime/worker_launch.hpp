// How a worker process comes to be: `fork` (this program goes on in a child and runs the worker
// loop) or `spawn` (posix_spawn of a worker executable). Either way the child's one link to its
// supervisor is its end of the control socket; everything else arrives through it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "ipc/fd.hpp"

namespace ferry {

enum class Start { Auto, Fork, Spawn };
const char* start_name(Start s) noexcept;
// "auto", "fork" or "spawn"; throws Error(invalid_argument) naming the bad value otherwise.
Start parse_start(const std::string& s);

// The method to use now. Auto is fork while CUDA is uninitialised in this process, spawn after.
// Fork after CUDA init throws Error(invalid_argument) saying to use spawn: a forked child cannot
// use CUDA, and would fail far from the cause.
Start resolve_start(Start requested);

struct LaunchedWorker {
  pid_t pid = -1;
  UniqueFd pidfd;  // readable once the worker exits
  Start how = Start::Spawn;
};

// Starts a worker whose end of the control socket is `control` (closed here afterwards by the
// caller). Fork: the child first closes `close_in_child` (the supervisor's other fds), then runs
// the worker loop and _exits. Spawn: `executable` gets `control` as its only extra fd, and
// runs as `executable args... --ferry-control-fd N`.
// Call from a thread that lives as long as the worker: PR_SET_PDEATHSIG fires when the thread
// that started a child exits, not only when its process does.
LaunchedWorker launch_worker(Start how, int control, const std::string& executable,
                             const std::vector<int>& close_in_child,
                             const std::vector<std::string>& args = {});

// The worker executable for spawn: `requested` when given, else $FERRY_WORKER, else the
// `ferry-worker` beside libferry_worker (build tree) or in ../bin (install), else beside this
// program. Throws Error(invalid_argument) listing what it tried and how to choose one.
std::string find_worker_executable(const std::string& requested);

namespace detail {
// What a forked child runs (returns its exit code). libferry_worker registers it when loaded,
// with its own directory for find_worker_executable(); runtime cannot depend on workers.
using WorkerEntry = int (*)(int control_fd);
void register_worker_library(WorkerEntry entry, const std::string& library_dir);
}  // namespace detail

}  // namespace ferry
