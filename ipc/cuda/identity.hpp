// Who a process is, in a way that survives pid reuse and containers: the pid, the inode of its
// pid namespace and the boot id. The import cache keys peers by this, never by the pid alone.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>

namespace ferry::cuda {

struct ProcessIdentity {
  pid_t pid = 0;
  std::uint64_t pid_ns = 0;                // inode of /proc/<pid>/ns/pid
  std::array<std::uint8_t, 16> boot_id{};  // /proc/sys/kernel/random/boot_id
  bool operator==(const ProcessIdentity& o) const noexcept {
    return pid == o.pid && pid_ns == o.pid_ns && boot_id == o.boot_id;
  }
  bool operator!=(const ProcessIdentity& o) const noexcept { return !(*this == o); }
  bool operator<(const ProcessIdentity& o) const noexcept;
  std::string str() const;  // "pid 123 (ns 4026531836)"
};

// This process's identity (read once, refreshed after fork).
const ProcessIdentity& this_process() noexcept;

}  // namespace ferry::cuda
