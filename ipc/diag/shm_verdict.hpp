// What may become of one segment in the shm directory: live, orphaned or unknown, and whether
// `ferry-shm clean --force` may remove it. One pure function of what the census saw
// (ipc/diag/shm_census.cpp gathers the facts from the directory and /proc), so each case is a test.
//
// A named segment is orphaned only when the pid in its name exited and no process that could
// have opened it holds or maps it. When some such process could not be inspected it is unknown.
// --force removes an unknown one only when what is missing is that inspection: its named owner
// is dead, no process seen holds it and nothing hands its name out (torch_shm_manager). That is
// safe for every process that holds it already (unlinking a name unmaps nothing and closes no
// fd), and unsafe only for a process that would open it by name later.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

enum class SegmentState : std::uint8_t {
  live,      // a live process holds or maps it, or the pid in its name is alive
  orphaned,  // the pid in its name exited and no process holds or maps it: safe to remove
  unknown,   // neither could be proven; the reason says what could not be read
};

// "live", "orphaned" or "unknown".
const char* segment_state_name(SegmentState s) noexcept;

// A live process whose /proc/<pid>/fd or maps could not be read.
struct UnreadableProcess {
  pid_t pid = 0;
  uid_t uid = 0;
  std::string command;  // "comm: cmdline", shortened; empty when neither could be read
};

// What the process taking the census may read in /proc.
struct ReaderRights {
  bool root = false;            // effective uid 0
  bool cap_sys_ptrace = false;  // CAP_SYS_PTRACE in the effective set
};

struct SegmentFacts {
  uid_t uid = 0;                // the file's owner
  mode_t mode = 0;              // the file's permission bits
  pid_t name_pid = 0;           // the pid in its name, 0 when there is none
  bool name_pid_alive = false;  // that pid exists (a pid we may not signal counts as alive)
  std::vector<pid_t> holders;   // live processes seen holding or mapping it
  bool torch = false;           // a torch_* name
  pid_t torch_manager = 0;      // a live torch_shm_manager (hands out torch_* names), or 0
  bool hidepid = false;         // /proc hides other users' processes
  std::vector<UnreadableProcess> unreadable;  // every live process that could not be read
  ReaderRights reader;
};

struct SegmentVerdict {
  SegmentState state = SegmentState::unknown;
  std::string reason;            // why, in words, naming pids and processes
  bool force_removable = false;  // unknown, but `clean --force` may remove it (see above)
};

SegmentVerdict judge_segment(const SegmentFacts& facts);

// Why `processes` could not be read by a reader with `reader`'s rights, naming them (pid and
// command), and what would let it read them: "run as root" only where that would help.
std::string unreadable_reason(const std::vector<UnreadableProcess>& processes,
                              const ReaderRights& reader);

}  // namespace ferry
