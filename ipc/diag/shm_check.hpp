// Will shared memory work here for the planned job? check_shm() measures what decides it (the
// shm filesystem, a real reservation, the memory cgroup, System V and fd limits, memlock, and
// optionally CUDA) and gives each a verdict and a one-line remedy. `ferry-shm check` prints it;
// the supervisor runs it at start-up so a job that cannot work fails before it starts, with the
// number that is wrong instead of a Bus error deep inside a worker.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ipc/cuda/devices.hpp"
#include "ipc/diag/check_item.hpp"
#include "ipc/error.hpp"

namespace ferry {

// The Errc that reports a failure of the check named `check` (a CheckItem's name), for a caller
// that turns a failed report into an Error: shm_dir -> shm_failed (no usable directory);
// shm_reserve, memory_cgroup, sysv_shm -> shm_exhausted (no room for the job's shared memory);
// open_files, memlock, cuda, and a name it does not know -> system (a limit or a device the job's
// system calls would run into).
Errc failure_code(const std::string& check) noexcept;

struct ShmCheckOptions {
  std::string dir;               // empty: default_segment_place(); set: segments in this directory
  std::uint64_t need_bytes = 0;  // 0: default_shm_need(workers)
  unsigned workers = 0;          // 0: default_workers()
  // Really reserve need_bytes (posix_fallocate in a nameless segment, released at once).
  bool reserve = true;
  // Include the CUDA probe. It creates a CUDA context, after which this process must not fork
  // workers: a supervisor that forks leaves it off (or runs the check in a child).
  bool cuda = false;
};

struct ShmReport {
  std::string dir;
  std::string backing;  // where the job's segments go: "memfd" or "dir" (segment_place.hpp)
  std::uint64_t need_bytes = 0;
  unsigned workers = 0;
  std::uint64_t fds_needed = 0;
  std::vector<CheckItem> items;
  std::optional<cuda::CudaStatus> cuda;  // present when the CUDA probe ran

  Verdict overall() const noexcept;  // the worst verdict of all items
  int exit_code() const noexcept;    // 0 ok, 1 warn, 2 fail: ferry-shm check's exit status
  const CheckItem* item(const std::string& name) const noexcept;  // nullptr when absent
};

// The number of workers `ferry run` starts by default: one per hardware thread.
unsigned default_workers() noexcept;

// The shared memory `ferry run` with `workers` workers takes before any tensor is bigger than an
// arena segment: each process (the supervisor and every worker) has an arena that starts with one
// segment (FERRY_ARENA_SEGMENT_MB, 64 MiB by default) and a lease ledger (FERRY_LEASE_SLOTS * 8
// bytes + 64, 512 KiB by default), so (workers + 1) * (segment + ledger). Queues (a few KiB) are
// left out. Throws Error(invalid_argument) when one of those variables is malformed.
std::uint64_t default_shm_need(unsigned workers);

// File descriptors the supervisor of `workers` workers holds open, with `need_bytes` of shared
// memory in its arena: 32 for itself (stdio, logs, libraries, its segment server's socket and
// connections, its ledger), 8 per worker (control socket, pidfd, the two queue segments, a
// segment fd being fetched, and slack), and one per arena segment it owns (owners keep segment
// fds to hand them to peers; receivers close theirs once mapped).
std::uint64_t fds_needed(unsigned workers, std::uint64_t need_bytes);

// Runs every check. Never throws for what it finds (a problem is an item with a verdict); throws
// Error(invalid_argument) only for malformed options or FERRY_* variables.
ShmReport check_shm(const ShmCheckOptions& options = {});

// The report as one JSON document (schema in docs/ferry-shm.md).
std::string to_json(const ShmReport& report, int indent = 2);

}  // namespace ferry
