// How much memory a new shared-memory segment may still take. Its pages (memfd or tmpfs alike)
// are charged to the memory cgroup of the process that touches them first, and a reservation past
// the cgroup's limit does not fail: posix_fallocate wakes the OOM killer, which kills this process
// or another one of the container. So a segment is refused, with these numbers, before it is
// reserved when it cannot fit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ferry {

struct CgroupMemory {
  int version = 0;   // 1 or 2; 0: no memory cgroup found
  std::string path;  // the cgroup directory whose room is tightest (empty: none limited)
  // At that cgroup: its limit, what it uses (less the file cache it can drop, as the OOM killer
  // counts it) and the difference. Unset when no cgroup up the tree has a limit.
  std::optional<std::uint64_t> limit, usage, headroom;
  bool unreadable = false;  // a limit file could not be read: the room is not known
};

struct MemoryRoom {
  CgroupMemory cgroup;
  // The machine's: MemAvailable + SwapFree from /proc/meminfo. Unset when it cannot be read.
  std::optional<std::uint64_t> machine;
};

// Reads this process's memory cgroup (v1 or v2, every ancestor; the tightest wins) and
// /proc/meminfo. Never throws; what cannot be read stays unset. count_cache: count the inactive
// file cache as room, since the kernel drops it before it kills (reads memory.stat, the costliest
// file); without it the room is a lower bound, read in half the time.
MemoryRoom read_memory_room(bool count_cache = true);

struct SegmentRoom {
  std::uint64_t bytes = 0;
  bool cgroup = false;  // the memory cgroup's headroom is the tighter; else the machine's memory

  // "the memory cgroup" or "the machine", for messages.
  const char* limited_by() const noexcept { return cgroup ? "the memory cgroup" : "the machine"; }
};

// The bytes a new segment may take: the tighter of the cgroup's headroom and the machine's
// available memory, and which one it is. Unset when neither is known.
std::optional<SegmentRoom> segment_room(const MemoryRoom& room) noexcept;

}  // namespace ferry
