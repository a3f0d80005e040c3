#include "ipc/diag/shm_check.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "ipc/arena.hpp"
#include "ipc/diag/system_limits.hpp"
#include "ipc/error.hpp"
#include "ipc/ledger.hpp"
#include "ipc/memory_room.hpp"
#include "ipc/proc_files.hpp"
#include "ipc/segment.hpp"
#include "ipc/units.hpp"

namespace ferry {
namespace {

using diag::check_cuda;
using diag::check_memlock;
using diag::check_open_files;
using diag::check_sysv;
using diag::compute_mode_name;
using proc::exists;
using proc::slurp;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
// What docker, podman and containerd give a container's /dev/shm unless told otherwise.
constexpr std::uint64_t kContainerDefaultShm = 64 * kMiB;
constexpr long kTmpfsMagic = 0x01021994;

// Which container runtime this process seems to run under, or "" when none is evident. The
// markers are the ones the runtimes leave on purpose; the cgroup path catches the rest.
std::string container_kind() {
  if (std::getenv("KUBERNETES_SERVICE_HOST")) return "kubernetes";
  if (exists("/.dockerenv")) return "docker";
  if (exists("/run/.containerenv")) return "podman";
  if (auto cg = slurp("/proc/1/cgroup")) {
    if (cg->find("kubepods") != std::string::npos) return "kubernetes";
    if (cg->find("docker") != std::string::npos) return "docker";
    if (cg->find("libpod") != std::string::npos) return "podman";
    if (cg->find("containerd") != std::string::npos || cg->find("lxc") != std::string::npos) {
      return "container";
    }
  }
  return "";
}

// A size for --shm-size that fits `need` with room to spare, in docker's spelling ("2g").
std::string suggested_shm_size(std::uint64_t need) {
  const std::uint64_t gib = std::max<std::uint64_t>(1, (need * 2 + kGiB - 1) / kGiB);
  return std::to_string(gib) + "g";
}

std::string shm_remedy(const std::string& dir, std::uint64_t need) {
  return "give the container more shared memory: docker run --shm-size=" +
         suggested_shm_size(need) + " (at least " + format_bytes(need) +
         " for this job) or --ipc=host; Kubernetes: mount an emptyDir with medium: Memory at " +
         dir + "; or set FERRY_SHM_DIR to a larger tmpfs";
}

struct DirFacts {
  bool usable = false;  // exists, is a directory, and we may create files in it
  std::uint64_t free = 0;
};

CheckItem check_dir(const std::string& dir, std::uint64_t need, DirFacts* facts) {
  CheckItem item{"shm_dir", Verdict::ok, "", "", {}};
  item.add("path", dir);
  struct stat st {};
  const bool found = ::stat(dir.c_str(), &st) == 0;
  if (!found || !S_ISDIR(st.st_mode)) {
    item.verdict = Verdict::fail;
    item.summary = dir + " is not usable: " + (found ? "not a directory" : std::strerror(errno));
    item.remedy = "mount a tmpfs there (mount -t tmpfs -o size=" + suggested_shm_size(need) +
                  " tmpfs " + dir + "), or set FERRY_SHM_DIR to a writable tmpfs directory";
    return item;
  }
  const bool writable = ::access(dir.c_str(), W_OK | X_OK) == 0;
  struct statfs fs {};
  struct statvfs vfs {};
  const bool have_fs = ::statfs(dir.c_str(), &fs) == 0;
  const bool have_vfs = ::statvfs(dir.c_str(), &vfs) == 0;
  const bool tmpfs = have_fs && static_cast<long>(fs.f_type) == kTmpfsMagic;
  const std::string container = container_kind();
  item.add("tmpfs", have_fs ? MeasuredValue(tmpfs) : MeasuredValue());
  item.add("writable", writable);
  item.add("container", container);
  if (!have_vfs) {
    item.verdict = Verdict::fail;
    item.summary = "cannot read the size of " + dir + " (statvfs: " + std::strerror(errno) + ")";
    item.remedy = "set FERRY_SHM_DIR to a tmpfs directory that can be inspected";
    return item;
  }
  const std::uint64_t total = std::uint64_t{vfs.f_blocks} * vfs.f_frsize;
  const std::uint64_t avail = std::uint64_t{vfs.f_bavail} * vfs.f_frsize;
  const std::uint64_t used = total - std::uint64_t{vfs.f_bfree} * vfs.f_frsize;
  item.add("size_bytes", total);
  item.add("used_bytes", used);
  item.add("free_bytes", avail);
  facts->free = avail;
  facts->usable = writable;

  item.summary = std::string(tmpfs ? "tmpfs" : "not tmpfs") + ", size " + format_bytes(total) +
                 ", used " + format_bytes(used) + ", free " + format_bytes(avail);
  if (!container.empty()) item.summary += " (in a " + container + " container)";
  if (!writable) {
    item.verdict = Verdict::fail;
    item.summary += "; not writable by this user";
    item.remedy = "make " + dir + " writable (it is normally mode 1777), or set FERRY_SHM_DIR";
  } else if (total == kContainerDefaultShm && !container.empty()) {
    item.verdict = Verdict::warn;
    item.summary += "; 64 MiB is the container default";
    item.remedy = shm_remedy(dir, need);
  } else if (total < need) {
    item.verdict = Verdict::warn;
    item.summary += "; smaller than the " + format_bytes(need) + " this job needs";
    item.remedy = shm_remedy(dir, need);
  } else if (have_fs && !tmpfs) {
    item.verdict = Verdict::warn;
    item.summary += "; segments here are backed by disk, not memory";
    item.remedy = "set FERRY_SHM_DIR to a tmpfs directory (such as /dev/shm)";
  }
  return item;
}

// With memfd segments the directory holds none of ferry's memory: whatever limits it, the check
// stays ok and says so. torch.multiprocessing's own sharing still goes through it.
CheckItem check_dir_for(const SegmentPlace& place, std::uint64_t need, DirFacts* facts) {
  CheckItem item = check_dir(place.dir, need, facts);
  if (place.backing != SegmentBacking::memfd) return item;
  if (item.verdict != Verdict::ok) {
    item.verdict = Verdict::ok;
    item.remedy.clear();
    item.summary += " (for torch's own shared tensors)";
  }
  item.summary += "; unused by ferry, whose segments are memfds";
  return item;
}

struct CgroupFacts {
  std::optional<SegmentRoom> room;  // segment_room(): the cgroup's or the machine's, tighter
};

// The memory limit that applies to this process (ipc/memory_room.hpp): the tightest room over its
// cgroup and every ancestor, in cgroup v1 or v2. Shared-memory pages, memfd or tmpfs, are charged
// to the cgroup of the process that first touched them, so this bounds every segment whatever
// the size of /dev/shm.
CheckItem check_cgroup(std::uint64_t need, CgroupFacts* facts) {
  CheckItem item{"memory_cgroup", Verdict::ok, "", "", {}};
  const MemoryRoom room = read_memory_room();
  const CgroupMemory& cg = room.cgroup;
  facts->room = segment_room(room);
  item.add("machine_available_bytes",
           room.machine ? MeasuredValue(*room.machine) : MeasuredValue());
  const std::string machine =
      room.machine ? "; the machine has " + format_bytes(*room.machine) + " available" : "";
  if (cg.version == 0) {
    item.summary = "no memory cgroup: no limit beyond the machine's memory" + machine;
    return item;
  }
  item.add("cgroup_version", std::int64_t{cg.version});
  item.add("limit_bytes", cg.limit ? MeasuredValue(*cg.limit) : MeasuredValue());
  item.add("usage_bytes", cg.usage ? MeasuredValue(*cg.usage) : MeasuredValue());
  item.add("headroom_bytes", cg.headroom ? MeasuredValue(*cg.headroom) : MeasuredValue());
  if (!cg.headroom) {
    item.summary = (cg.unreadable ? "memory cgroup limit could not be read (permission denied)"
                                  : "no memory cgroup limit") +
                   machine;
    if (cg.unreadable) {
      item.verdict = Verdict::warn;
      item.remedy = "run as a user that can read the cgroup's memory files";
    }
    return item;
  }
  item.summary = "memory limit " + format_bytes(*cg.limit) + ", in use " + format_bytes(*cg.usage) +
                 ", " + format_bytes(*cg.headroom) + " left (shared memory counts against it)";
  if (*cg.headroom < need) {
    item.verdict = Verdict::fail;
    item.summary += "; the job's " + format_bytes(need) + " of shared memory would not fit";
    item.remedy = "raise the container's memory limit by at least " +
                  format_bytes(need - *cg.headroom) +
                  " (docker run --memory=...; Kubernetes: resources.limits.memory; an emptyDir "
                  "with medium: Memory counts against it too)";
  }
  return item;
}

CheckItem check_reserve(const SegmentPlace& place, std::uint64_t need, bool reserve,
                        const DirFacts& dir_facts, const CgroupFacts& cg) {
  CheckItem item{"shm_reserve", Verdict::ok, "", "", {}};
  const std::string& dir = place.dir;
  const bool memfd = place.backing == SegmentBacking::memfd;
  item.add("need_bytes", need);
  item.add("backing", std::string(backing_name(place.backing)));
  if (!memfd && !dir_facts.usable) {
    item.verdict = Verdict::fail;
    item.summary = "not attempted: " + dir + " is not usable (see shm_dir)";
    item.remedy = "fix shm_dir first";
    item.add("reserved", MeasuredValue());
    return item;
  }
  if (cg.room && cg.room->bytes < need) {
    // Reserving past the cgroup's limit could wake the OOM killer on some other process.
    item.verdict = Verdict::fail;
    item.summary = "not attempted: " + format_bytes(need) + " exceeds the " +
                   format_bytes(cg.room->bytes) + " " + cg.room->limited_by() +
                   " has left (see memory_cgroup)";
    item.remedy = "raise the memory limit, or run fewer workers (--workers)";
    item.add("reserved", MeasuredValue());
    return item;
  }
  if (!reserve) {
    item.add("reserved", MeasuredValue());
    if (memfd) {
      item.summary = "not attempted (estimate only): memfd segments, bounded by memory_cgroup";
      return item;
    }
    item.summary = "not attempted (estimate only): " + format_bytes(dir_facts.free) + " free, " +
                   format_bytes(need) + " needed";
    if (dir_facts.free < need) {
      item.verdict = Verdict::fail;
      item.remedy = shm_remedy(dir, need);
    }
    return item;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    // A real segment, made and reserved exactly as the arena makes its own, so a success here
    // means the job's first segments will fit; nameless, so nothing is left if we die meanwhile.
    Segment::create(static_cast<std::size_t>(need), place);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    item.add("reserved", true);
    item.add("reserve_ms", std::int64_t{ms});
    item.summary = "reserved " + format_bytes(need) + (memfd ? " in a memfd" : "") +
                   " with posix_fallocate in " + std::to_string(ms) + " ms and released it";
  } catch (const Error& e) {
    item.add("reserved", false);
    item.verdict = Verdict::fail;
    if (e.code() == Errc::shm_exhausted && memfd) {
      item.summary = e.detail().substr(0, e.detail().find(". Remedy:"));
      item.remedy = "raise the container's memory limit (docker run --memory=...)";
    } else if (e.code() == Errc::shm_exhausted) {
      item.summary = "cannot reserve " + format_bytes(need) + " (" + std::to_string(need) +
                     " bytes): " + format_bytes(dir_facts.free) + " free";
      item.remedy = shm_remedy(dir, need);
    } else {
      item.summary = e.detail();
      item.remedy = "set FERRY_SHM_DIR to a writable tmpfs directory";
    }
  }
  return item;
}

nlohmann::json value_json(const MeasuredValue& v) {
  return std::visit(
      [](const auto& x) -> nlohmann::json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return nullptr;
        } else {
          return x;
        }
      },
      v);
}

nlohmann::json cuda_json(const cuda::CudaStatus& s) {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& d : s.devices) {
    devices.push_back(
        {{"index", d.index},
         {"name", d.name},
         {"uuid", d.uuid},
         {"compute_capability", std::to_string(d.major) + "." + std::to_string(d.minor)},
         {"total_memory_bytes", d.total_memory},
         {"unified_addressing", d.unified_addressing},
         {"integrated", d.integrated},
         {"compute_mode", compute_mode_name(d.compute_mode)},
         {"legacy_ipc", d.legacy_ipc},
         {"ipc_events", d.ipc_events},
         {"kernel_ok", d.kernel_ok},
         {"error", d.error}});
  }
  nlohmann::json peers = nlohmann::json::array();
  for (const auto& row : s.peer_access) {
    nlohmann::json r = nlohmann::json::array();
    for (bool b : row) r.push_back(b);
    peers.push_back(r);
  }
  return {{"built_with_cuda", s.built_with_cuda},
          {"driver_present", s.driver_present},
          {"driver_version", s.driver_version},
          {"runtime_version", s.runtime_version},
          {"error", s.error},
          {"devices", devices},
          {"peer_access", peers}};
}

}  // namespace

Errc failure_code(const std::string& check) noexcept {
  if (check == "shm_dir") return Errc::shm_failed;
  if (check == "shm_reserve" || check == "memory_cgroup" || check == "sysv_shm") {
    return Errc::shm_exhausted;
  }
  return Errc::system;
}

Verdict ShmReport::overall() const noexcept {
  Verdict worst = Verdict::ok;
  for (const auto& i : items) worst = std::max(worst, i.verdict);
  return worst;
}

int ShmReport::exit_code() const noexcept {
  return static_cast<int>(overall());
}

const CheckItem* ShmReport::item(const std::string& name) const noexcept {
  for (const auto& i : items) {
    if (i.name == name) return &i;
  }
  return nullptr;
}

unsigned default_workers() noexcept {
  return std::max(1u, std::thread::hardware_concurrency());
}

std::uint64_t default_shm_need(unsigned workers) {
  const Arena::Options o = Arena::options_from_env();
  return (std::uint64_t{workers} + 1) * (o.segment_size + Ledger::segment_bytes(o.lease_slots));
}

std::uint64_t fds_needed(unsigned workers, std::uint64_t need_bytes) {
  constexpr std::uint64_t kSupervisorBase = 32;
  constexpr std::uint64_t kPerWorker = 8;
  const std::uint64_t segment = Arena::options_from_env().segment_size;
  return kSupervisorBase + kPerWorker * workers + (need_bytes + segment - 1) / segment;
}

ShmReport check_shm(const ShmCheckOptions& options) {
  ShmReport r;
  const SegmentPlace place =
      options.dir.empty() ? default_segment_place() : SegmentPlace::in_dir(options.dir);
  r.dir = place.dir;
  r.backing = backing_name(place.backing);
  r.workers = options.workers ? options.workers : default_workers();
  r.need_bytes = options.need_bytes ? options.need_bytes : default_shm_need(r.workers);
  r.fds_needed = fds_needed(r.workers, r.need_bytes);

  DirFacts dir_facts;
  CgroupFacts cg;
  r.items.push_back(check_dir_for(place, r.need_bytes, &dir_facts));
  CheckItem cgroup = check_cgroup(r.need_bytes, &cg);
  r.items.push_back(check_reserve(place, r.need_bytes, options.reserve, dir_facts, cg));
  r.items.push_back(std::move(cgroup));
  r.items.push_back(check_sysv(r.need_bytes));
  r.items.push_back(check_open_files(r.fds_needed));
  if (options.cuda) r.cuda = cuda::probe();
  r.items.push_back(check_memlock(r.cuda && !r.cuda->devices.empty()));
  if (r.cuda) r.items.push_back(check_cuda(*r.cuda));
  return r;
}

std::string to_json(const ShmReport& report, int indent) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& i : report.items) {
    nlohmann::json values = nlohmann::json::object();
    for (const auto& m : i.values) values[m.key] = value_json(m.value);
    checks.push_back({{"name", i.name},
                      {"verdict", verdict_name(i.verdict)},
                      {"summary", i.summary},
                      {"remedy", i.remedy},
                      {"values", values}});
  }
  nlohmann::json doc = {{"schema", "ferry-shm-check/1"},
                        {"dir", report.dir},
                        {"backing", report.backing},
                        {"need_bytes", report.need_bytes},
                        {"workers", report.workers},
                        {"fds_needed", report.fds_needed},
                        {"verdict", verdict_name(report.overall())},
                        {"exit_code", report.exit_code()},
                        {"checks", checks},
                        {"cuda", report.cuda ? cuda_json(*report.cuda) : nlohmann::json()}};
  return doc.dump(indent);
}

}  // namespace ferry
