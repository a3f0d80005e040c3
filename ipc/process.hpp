// Facts about processes that the lease ledger and the channels rely on.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "ipc/fd.hpp"

namespace ferry {

// True while `pid` names a process that has not exited. A zombie (exited, not yet reaped) counts
// as dead: its memory and leases are gone even though kill(pid, 0) still succeeds.
bool process_alive(pid_t pid) noexcept;

// This process's pid, cached and refreshed after fork.
pid_t current_pid() noexcept;

// A random 64-bit token chosen once per process (and again in a forked child): with the pid it
// names a process unambiguously in records, sockets and caches.
std::uint64_t process_token() noexcept;

// A pidfd for child `pid` (readable once it exits), so a supervisor notices a death at once
// with poll() instead of a heartbeat. Throws Error(system) where the kernel lacks pidfd_open.
UniqueFd open_pidfd(pid_t pid);

// A wait status in words: "exited with code 3", "killed by SIGKILL", "killed by SIGSEGV
// (core dumped)".
std::string describe_wait_status(int status);

// How process `pid`, which has exited, ended: its wait status in words where it is an unreaped
// child of this process (looked at without reaping it), else "exited" (only a parent can know
// more, and only until it reaps).
std::string describe_exit(pid_t pid);

}  // namespace ferry
