#include "ipc/diag/system_limits.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "ipc/proc_files.hpp"
#include "ipc/units.hpp"

namespace ferry::diag {
namespace {

using proc::read_u64;

// Below this, mlock()ed and RDMA-registered host memory runs out first (the usual default is
// 8 MiB).
constexpr std::uint64_t kMemlockComfort = std::uint64_t{64} << 20;

std::string show_limit(rlim_t v) {
  return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
}

MeasuredValue limit_value(rlim_t v) {
  return v == RLIM_INFINITY ? MeasuredValue(std::string("unlimited"))
                            : MeasuredValue(static_cast<std::uint64_t>(v));
}

}  // namespace

const char* compute_mode_name(int mode) {
  switch (mode) {
    case 0:
      return "default";
    case 1:
      return "exclusive_thread";
    case 2:
      return "prohibited";
    case 3:
      return "exclusive_process";
    default:
      return "unknown";
  }
}

CheckItem check_sysv(std::uint64_t need) {
  CheckItem item{"sysv_shm", Verdict::ok, "", "", {}};
  const auto shmmax = read_u64("/proc/sys/kernel/shmmax");
  const auto shmall = read_u64("/proc/sys/kernel/shmall");
  const auto shmmni = read_u64("/proc/sys/kernel/shmmni");
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  auto opt = [](const std::optional<std::uint64_t>& v) {
    return v ? MeasuredValue(*v) : MeasuredValue();
  };
  item.add("shmmax_bytes", opt(shmmax));
  item.add("shmall_pages", opt(shmall));
  item.add("shmmni", opt(shmmni));
  auto show = [](const std::optional<std::uint64_t>& v, bool bytes) {
    if (!v) return std::string("unreadable");
    if (*v >= (std::uint64_t{1} << 60)) return std::string("unlimited");
    return bytes ? format_bytes(*v) : std::to_string(*v);
  };
  // shmall is in pages; the product overflows for the "unlimited" default.
  std::optional<std::uint64_t> shmall_bytes;
  if (shmall) shmall_bytes = *shmall >= (std::uint64_t{1} << 48) ? *shmall : *shmall * page;
  item.summary = "kernel.shmmax " + show(shmmax, true) + ", shmall " + show(shmall_bytes, true) +
                 ", shmmni " + show(shmmni, false);
  if (!shmmax && !shmall && !shmmni) {
    item.summary = "kernel.shm* cannot be read: System V limits not checked";
    return item;
  }
  if ((shmmax && *shmmax < need) || (shmall_bytes && *shmall_bytes < need)) {
    item.verdict = Verdict::warn;
    item.summary += "; below the job's " + format_bytes(need);
    item.remedy =
        "ferry uses POSIX shared memory and is not bound by these, but System V users in the job "
        "are: sysctl -w kernel.shmmax=" +
        std::to_string(need) + " kernel.shmall=" + std::to_string((need + page - 1) / page) +
        " (docker run --sysctl ...)";
  }
  return item;
}

CheckItem check_open_files(std::uint64_t fds_need) {
  CheckItem item{"open_files", Verdict::ok, "", "", {}};
  struct rlimit rl {};
  item.add("needed", fds_need);
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    item.verdict = Verdict::warn;
    item.summary = std::string("cannot read RLIMIT_NOFILE: ") + std::strerror(errno);
    item.remedy = "check ulimit -n";
    return item;
  }
  item.add("soft", limit_value(rl.rlim_cur));
  item.add("hard", limit_value(rl.rlim_max));
  item.summary = "RLIMIT_NOFILE soft " + show_limit(rl.rlim_cur) + ", hard " +
                 show_limit(rl.rlim_max) + "; the planned job needs about " +
                 std::to_string(fds_need);
  const auto fits = [&](rlim_t v) { return v == RLIM_INFINITY || v >= fds_need; };
  if (!fits(rl.rlim_max)) {
    item.verdict = Verdict::fail;
    item.summary += ": the hard limit is too low";
    item.remedy = "raise the hard limit to at least " + std::to_string(fds_need) +
                  ": docker run --ulimit nofile=" + std::to_string(fds_need) + ":" +
                  std::to_string(fds_need) + ", or nofile in /etc/security/limits.conf";
  } else if (!fits(rl.rlim_cur)) {
    item.verdict = Verdict::warn;
    item.summary += ": the soft limit is too low";
    item.remedy = "raise the soft limit before starting: ulimit -n " + show_limit(rl.rlim_max);
  }
  return item;
}

CheckItem check_memlock(bool have_gpus) {
  CheckItem item{"memlock", Verdict::ok, "", "", {}};
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
    item.summary = std::string("cannot read RLIMIT_MEMLOCK: ") + std::strerror(errno);
    return item;
  }
  item.add("soft", limit_value(rl.rlim_cur));
  item.add("hard", limit_value(rl.rlim_max));
  auto show = [](rlim_t v) { return v == RLIM_INFINITY ? "unlimited" : format_bytes(v); };
  item.summary = "RLIMIT_MEMLOCK soft " + show(rl.rlim_cur) + ", hard " + show(rl.rlim_max);
  if (have_gpus && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < kMemlockComfort) {
    item.verdict = Verdict::warn;
    item.summary += ": little room for pinned (mlock'ed or RDMA-registered) host memory";
    item.remedy = "ulimit -l unlimited (docker run --ulimit memlock=-1)";
  }
  return item;
}

CheckItem check_cuda(const cuda::CudaStatus& s) {
  CheckItem item{"cuda", Verdict::ok, "", "", {}};
  item.add("built_with_cuda", s.built_with_cuda);
  item.add("driver_present", s.driver_present);
  item.add("devices", static_cast<std::uint64_t>(s.devices.size()));
  if (s.devices.empty()) {
    // CPU-only use needs none of this, so its absence is not a failure.
    item.summary = s.error + "; CPU tensors are unaffected";
    return item;
  }
  std::vector<std::string> problems;
  std::vector<std::string> remedies;
  for (const auto& d : s.devices) {
    const std::string dev = "cuda:" + std::to_string(d.index);
    if (!d.kernel_ok) {
      item.verdict = Verdict::fail;
      problems.push_back(dev + " unusable (" + d.error + ")");
      remedies.push_back("check the driver and nvidia-smi for " + dev);
      continue;
    }
    if (d.compute_mode == 3 || d.compute_mode == 1) {
      item.verdict = std::max(item.verdict, Verdict::warn);
      problems.push_back(dev + " compute mode " + compute_mode_name(d.compute_mode) +
                         ": one process at a time");
      remedies.push_back("nvidia-smi -i " + std::to_string(d.index) +
                         " -c DEFAULT, or one worker per device");
    }
    if (!d.legacy_ipc || !d.ipc_events) {
      item.verdict = std::max(item.verdict, Verdict::warn);
      problems.push_back(dev + (d.legacy_ipc ? " has no IPC events" : " has no CUDA IPC") +
                         ": its tensors are copied");
    }
  }
  std::string peers;
  for (std::size_t i = 0; i < s.peer_access.size(); ++i) {
    for (std::size_t j = i + 1; j < s.peer_access.size(); ++j) {
      if (s.peer_access[i][j] && s.peer_access[j][i]) {
        peers += (peers.empty() ? "" : " ") + std::to_string(i) + "<->" + std::to_string(j);
      }
    }
  }
  item.summary = "driver " + std::to_string(s.driver_version / 1000) + "." +
                 std::to_string(s.driver_version % 1000 / 10) + ", " +
                 std::to_string(s.devices.size()) + " device(s)";
  if (s.devices.size() > 1) item.summary += ", peer access " + (peers.empty() ? "none" : peers);
  for (const auto& p : problems) item.summary += "; " + p;
  for (const auto& r : remedies) item.remedy += (item.remedy.empty() ? "" : "; ") + r;
  if (item.remedy.empty() && item.verdict != Verdict::ok) {
    item.remedy = "none needed for correctness: ferry copies where IPC is missing";
  }
  return item;
}

}  // namespace ferry::diag
