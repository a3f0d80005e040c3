#include "ipc/memory_room.hpp"

#include <cerrno>
#include <exception>
#include <sstream>

#include "ipc/proc_files.hpp"

namespace ferry {
namespace {

using proc::exists;
using proc::read_u64;
using proc::slurp;

// cgroup v1 spells "no limit" as a page-rounded LONG_MAX; v2 as "max".
constexpr std::uint64_t kNoLimit = std::uint64_t{1} << 60;

// The value of `key` in a "key value" file such as memory.stat or /proc/meminfo.
std::optional<std::uint64_t> field(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.compare(0, key.size(), key) != 0 || line.size() <= key.size()) continue;
    const char next = line[key.size()];
    if (next != ' ' && next != ':' && next != '\t') continue;
    try {
      return static_cast<std::uint64_t>(std::stoull(line.substr(key.size() + 1)));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

struct CgroupPaths {
  bool v1 = false, v2 = false;
  std::string v1_path, v2_path;
};

CgroupPaths cgroup_paths(const std::string& self) {
  CgroupPaths p;
  std::istringstream lines(self);
  for (std::string line; std::getline(lines, line);) {
    const auto a = line.find(':');
    const auto b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      p.v2 = true;
      p.v2_path = path;
    }
    std::istringstream names(controllers);
    for (std::string c; std::getline(names, c, ',');) {
      if (c == "memory") {
        p.v1 = true;
        p.v1_path = path;
      }
    }
  }
  return p;
}

// Where each cgroup version keeps what is read here.
struct CgroupFiles {
  int version;
  const char* base;
  const char* limit;
  const char* usage;
  const char* inactive;  // the inactive file cache's key in memory.stat
};
constexpr CgroupFiles kV1{1, "/sys/fs/cgroup/memory", "memory.limit_in_bytes",
                          "memory.usage_in_bytes", "total_inactive_file"};
constexpr CgroupFiles kV2{2, "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"};

CgroupMemory read_cgroup(bool count_cache) {
  CgroupMemory cg;
  const auto self = slurp("/proc/self/cgroup");
  if (!self) return cg;
  const CgroupPaths p = cgroup_paths(*self);
  const bool v2 = !p.v1 && p.v2 && exists("/sys/fs/cgroup/cgroup.controllers");
  if (!p.v1 && !v2) return cg;
  const CgroupFiles& files = p.v1 ? kV1 : kV2;
  cg.version = files.version;
  const std::string base = files.base;
  const std::string path = p.v1 ? p.v1_path : p.v2_path;
  // Inside a container with its own cgroup namespace the path may not exist as written; the
  // container's own cgroup is then mounted at the base.
  std::string dir = base + (path == "/" ? "" : path);
  if (!exists(dir)) dir = base;
  for (;;) {
    const auto limit_text = slurp(dir + "/" + files.limit);
    if (!limit_text && errno == EACCES) cg.unreadable = true;
    const auto limit = limit_text ? read_u64(dir + "/" + files.limit) : std::nullopt;
    if (limit && *limit < kNoLimit) {
      std::uint64_t used = read_u64(dir + "/" + files.usage).value_or(0);
      // Clean file cache is dropped before anything is killed, so it is room too.
      if (const auto stat = count_cache ? slurp(dir + "/memory.stat") : std::nullopt) {
        const std::uint64_t inactive = field(*stat, files.inactive).value_or(0);
        used = used > inactive ? used - inactive : 0;
      }
      const std::uint64_t room = *limit > used ? *limit - used : 0;
      if (!cg.headroom || room < *cg.headroom) {
        cg.headroom = room;
        cg.limit = limit;
        cg.usage = used;
        cg.path = dir;
      }
    }
    if (dir.size() <= base.size()) break;
    dir = dir.substr(0, dir.rfind('/'));
  }
  return cg;
}

}  // namespace

MemoryRoom read_memory_room(bool count_cache) {
  MemoryRoom room;
  room.cgroup = read_cgroup(count_cache);
  if (const auto meminfo = slurp("/proc/meminfo")) {
    const auto available = field(*meminfo, "MemAvailable");
    if (available) room.machine = (*available + field(*meminfo, "SwapFree").value_or(0)) * 1024;
  }
  return room;
}

std::optional<SegmentRoom> segment_room(const MemoryRoom& room) noexcept {
  const auto& cg = room.cgroup.headroom;
  if (cg && (!room.machine || *cg <= *room.machine)) return SegmentRoom{*cg, true};
  if (room.machine) return SegmentRoom{*room.machine, false};
  return std::nullopt;
}

}  // namespace ferry
