#include "ipc/cuda/identity.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <mutex>
#include <tuple>

#include "ipc/process.hpp"

namespace ferry::cuda {
namespace {

std::array<std::uint8_t, 16> read_boot_id() {
  std::array<std::uint8_t, 16> id{};
  std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f == nullptr) return id;
  // "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": 32 hex digits, dashes skipped.
  int c;
  std::size_t nibble = 0;
  while ((c = std::fgetc(f)) != EOF && nibble < 32) {
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) continue;
    id[nibble / 2] = static_cast<std::uint8_t>(id[nibble / 2] | (nibble % 2 ? v : v << 4));
    ++nibble;
  }
  std::fclose(f);
  return id;
}

std::uint64_t pid_ns_of(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

}  // namespace

bool ProcessIdentity::operator<(const ProcessIdentity& o) const noexcept {
  return std::tie(pid, pid_ns, boot_id) < std::tie(o.pid, o.pid_ns, o.boot_id);
}

std::string ProcessIdentity::str() const {
  return "pid " + std::to_string(pid) + " (pid ns " + std::to_string(pid_ns) + ")";
}

const ProcessIdentity& this_process() noexcept {
  static std::mutex mu;
  static ProcessIdentity id;
  std::lock_guard<std::mutex> lock(mu);
  if (id.pid != current_pid()) {
    static const std::array<std::uint8_t, 16> boot = read_boot_id();
    id.pid = current_pid();
    id.pid_ns = pid_ns_of("/proc/self/ns/pid");
    id.boot_id = boot;
  }
  return id;
}

}  // namespace ferry::cuda
