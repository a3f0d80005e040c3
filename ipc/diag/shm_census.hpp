// What lives in the shm directory, who owns it, and what can safely go.
//
// Named files come from the directory: ferry's `ferry-<pid>-<n>` (its fallback where O_TMPFILE
// is missing, normally unlinked at once), PyTorch's `torch_<pid>_<random>[_<n>]` (its
// file_system strategy and CUDA ref-counter files), and anything else. Segments without a name
// (ferry's O_TMPFILE ones and memfds, unlinked PyTorch ones) are found through the processes
// holding them: the links in /proc/<pid>/fd and the files in /proc/<pid>/maps. ferry's memfds
// (`memfd:ferry-segment`) are in no directory; they are listed with every directory, since their
// memory is the job's too, and can never be orphaned. A named segment is orphaned only
// when that can be proven: the pid in its name has exited, and no live process holds or maps it
// among all the processes that could have it open. When some of those cannot be inspected
// (another user's processes, a process that is not dumpable, /proc mounted with hidepid) it is
// "unknown", never guessed; the decision is ipc/diag/shm_verdict.hpp's.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ipc/diag/shm_verdict.hpp"

namespace ferry {

struct ShmSegment {
  std::string name;             // as in the directory; a nameless one as /proc shows it, e.g. "#41"
  std::string kind;             // "ferry", "torch" or "other"
  bool named = false;           // reachable by name in the directory (can leak)
  bool memfd = false;           // one of ferry's memfds: in no directory, gone with its last holder
  std::uint64_t size = 0;       // st_size; 0 when it could not be read (only mapped, never held)
  std::uint64_t allocated = 0;  // bytes really taken from the tmpfs (st_blocks * 512)
  std::uint64_t inode = 0;
  std::int64_t mtime = 0;  // seconds since the epoch; 0 when unknown
  uid_t uid = 0;
  pid_t name_pid = 0;          // the pid written in the name, 0 when there is none
  std::vector<pid_t> holders;  // live processes that hold it open or map it
  SegmentState state = SegmentState::unknown;
  std::string reason;            // why that state, in words
  bool force_removable = false;  // unknown, but clean with force removes it (shm_verdict.hpp)
};

struct ShmCensus {
  std::string dir;
  std::vector<ShmSegment> segments;  // named ones first, each group by name
  // Processes whose fds or maps could not be read, so whatever they hold is not seen.
  std::vector<pid_t> unreadable;
  std::string unreadable_reason;  // why they could not be read, naming them; empty when none
  bool hidepid = false;           // /proc hides other users' processes from us
};

// Lists the segments in `dir` (empty: default_shm_dir()), those of it that live processes
// hold or map, and ferry's memfds, each classified. Reads only; needs no privileges (it says what
// it could not see).
ShmCensus take_shm_census(const std::string& dir = "");

struct ShmCleanOptions {
  std::string dir;                     // empty: default_shm_dir()
  std::chrono::seconds older_than{0};  // only segments not modified for this long
  bool dry_run = false;                // report what would go, remove nothing
  // Also remove unknown segments whose named creator is dead and that no process seen holds:
  // unknown only because some process could not be inspected (see shm_verdict.hpp).
  bool force = false;
};

struct ShmCleanResult {
  std::vector<ShmSegment> removed;  // (or that would be, on a dry run)
  std::uint64_t bytes_freed = 0;    // their allocated bytes
  std::vector<std::string> errors;  // segments that could not be removed, and why
  std::vector<ShmSegment> kept;     // ferry's and torch's named segments left as unknown
};

// Removes the orphaned segments of a fresh census (with force, the force-removable unknown ones
// too), re-checking each just before unlinking it; never a live one. Never throws for one
// segment's failure (see errors).
ShmCleanResult clean_shm(const ShmCleanOptions& options = {});

// The census as one JSON document (schema in docs/ferry-shm.md). `include_other`: also list
// segments that are neither ferry's nor torch's.
std::string to_json(const ShmCensus& census, bool include_other = false, int indent = 2);

}  // namespace ferry
