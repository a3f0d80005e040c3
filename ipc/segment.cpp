#include "ipc/segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/memory_room.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"
#include "ipc/units.hpp"

namespace ferry {
namespace {

// A nameless file in `dir`. O_TMPFILE leaves no name to leak at any instant; the named fallback
// (for filesystems without O_TMPFILE) unlinks straight after creation.
UniqueFd create_nameless(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return UniqueFd(fd);
  int err = errno;
  if (err != EOPNOTSUPP && err != EISDIR && err != EINVAL) {
    throw_errno(Errc::shm_failed,
                "cannot create a shared-memory segment in '" + dir +
                    "' (set FERRY_SHM_DIR to a writable tmpfs directory)",
                err);
  }
  static std::atomic<unsigned> counter{0};
  std::string name =
      "ferry-" + std::to_string(current_pid()) + "-" + std::to_string(counter.fetch_add(1));
  if (dir == "/dev/shm") {
    fd = ::shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) ::shm_unlink(("/" + name).c_str());
  } else {
    std::string path = dir + "/" + name;
    fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) ::unlink(path.c_str());
  }
  if (fd < 0) {
    throw_errno(Errc::shm_failed, "cannot create a shared-memory segment in '" + dir + "'", errno);
  }
  return UniqueFd(fd);
}

UniqueFd create_memfd() {
  const int fd = ::memfd_create("ferry-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    throw_errno(Errc::shm_failed,
                "cannot create a shared-memory segment (memfd_create); set FERRY_SHM_BACKING=dir "
                "to use files in FERRY_SHM_DIR or /dev/shm instead",
                errno);
  }
  return UniqueFd(fd);
}

std::string room_text(const SegmentRoom& room, const MemoryRoom& r) {
  if (!room.cgroup) return format_bytes(room.bytes) + " of the machine's memory is available";
  return "the memory cgroup has " + format_bytes(room.bytes) + " left of its " +
         format_bytes(*r.cgroup.limit) + " limit";
}

// Reading the room takes a few hundred microseconds of /proc and /sys: worth it before a
// reservation that could wake the OOM killer, not for a queue's or a ledger's small segments,
// which weigh no more than any other allocation of the process.
constexpr std::size_t kRoomChecked = std::size_t{4} << 20;

// Past the memory cgroup's limit, posix_fallocate does not fail: the OOM killer answers. So what
// cannot fit is refused before it is reserved.
void check_memory_room(const SegmentPlace& place, std::size_t size) {
  if (size < kRoomChecked) return;
  // The quick reading's room is a lower bound; only what does not fit it is looked at closer.
  MemoryRoom r = read_memory_room(false);
  auto room = segment_room(r);
  if (!room || size <= room->bytes) return;
  r = read_memory_room(true);
  room = segment_room(r);
  if (!room || size <= room->bytes) return;
  throw Error(Errc::shm_exhausted,
              "cannot reserve " + format_bytes(size) + " (" + std::to_string(size) +
                  " bytes) of shared memory in " + place.describe() + ": " + room_text(*room, r) +
                  ". Remedy: raise the container's memory limit (docker run --memory=...; "
                  "Kubernetes: resources.limits.memory), free memory, or use smaller or fewer "
                  "tensors in flight");
}

[[noreturn]] void throw_exhausted(const SegmentPlace& place, std::size_t size, int err) {
  if (place.backing == SegmentBacking::memfd) {
    throw Error(Errc::shm_exhausted,
                "cannot reserve " + format_bytes(size) + " (" + std::to_string(size) +
                    " bytes) of shared memory in a memfd (" + std::strerror(err) +
                    "). Remedy: raise the container's memory limit (docker run --memory=...), or "
                    "free memory");
  }
  const std::string& dir = place.dir;
  struct statvfs vfs {};
  std::string free_part = "free space unknown";
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    const std::uint64_t total = std::uint64_t{vfs.f_blocks} * vfs.f_frsize;
    const std::uint64_t avail = std::uint64_t{vfs.f_bavail} * vfs.f_frsize;
    free_part = format_bytes(avail) + " free of " + format_bytes(total);
  }
  throw Error(Errc::shm_exhausted,
              "cannot reserve " + format_bytes(size) + " (" + std::to_string(size) +
                  " bytes) of shared memory in " + dir + ": " + free_part + " (" +
                  std::strerror(err) +
                  "). Remedy: give the container more shared memory (docker run --shm-size=8g, "
                  "or --ipc=host; Kubernetes: mount a memory-backed emptyDir at /dev/shm), free "
                  "what other jobs left behind, or set FERRY_SHM_DIR to a larger tmpfs");
}

}  // namespace

std::shared_ptr<Segment> Segment::create(std::size_t size, const SegmentPlace& place) {
  if (size == 0) throw Error(Errc::invalid_argument, "a segment of 0 bytes was asked for");
  check_memory_room(place, size);
  const bool memfd = place.backing == SegmentBacking::memfd;
  UniqueFd fd = memfd ? create_memfd() : create_nameless(place.dir);
  // posix_fallocate returns the error instead of setting errno; EINTR can come from a signal
  // arriving during a large reservation, so it is retried.
  int rc;
  do {
    rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
  } while (rc == EINTR);
  if (rc == ENOSPC || rc == EFBIG || rc == ENOMEM) throw_exhausted(place, size, rc);
  if (rc != 0) {
    throw_errno(Errc::shm_failed,
                "cannot reserve " + format_bytes(size) + " in " + place.describe(), rc);
  }
  // A peer that shrank the file would turn every other mapping's access past the end into a
  // SIGBUS; sealed, it cannot.
  if (memfd && ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw_errno(Errc::shm_failed, "cannot seal a memfd segment", errno);
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    throw_errno(Errc::shm_failed, "cannot map a segment of " + format_bytes(size), errno);
  }
  detail::bump(detail::counters().segments_created);
  log().debug("segment created: {} in {} (fd {})", format_bytes(size), place.describe(), fd.get());
  return std::shared_ptr<Segment>(
      new Segment(std::move(fd), static_cast<std::byte*>(p), size, place));
}

bool Segment::release_pages(std::uint64_t offset, std::uint64_t length) noexcept {
  if (length == 0) return true;
  // The mapping's pages go with the file's: every process that maps it sees the hole.
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(length)) == 0) {
    return true;
  }
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    log().debug("segment: pages cannot be given back in {}: {}", place_.describe(),
                std::strerror(errno));
  }
  return false;
}

void Segment::reserve_pages(std::uint64_t offset, std::uint64_t length) {
  if (length == 0) return;
  check_memory_room(place_, static_cast<std::size_t>(length));
  int rc;
  do {
    rc = ::posix_fallocate(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(length));
  } while (rc == EINTR);
  if (rc == ENOSPC || rc == EFBIG || rc == ENOMEM) {
    throw_exhausted(place_, static_cast<std::size_t>(length), rc);
  }
  if (rc != 0) {
    throw_errno(Errc::shm_failed,
                "cannot reserve " + format_bytes(length) + " again in " + place_.describe(), rc);
  }
}

std::shared_ptr<Segment> Segment::attach(UniqueFd fd, std::size_t expected_size, bool keep_fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno(Errc::shm_failed, "fstat of a segment fd", errno);
  const auto actual = static_cast<std::size_t>(st.st_size);
  if (actual == 0 || (expected_size != 0 && actual != expected_size)) {
    throw Error(Errc::shm_failed, "segment fd has " + std::to_string(actual) +
                                      " bytes, the record says " + std::to_string(expected_size));
  }
  void* p = ::mmap(nullptr, actual, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    throw_errno(Errc::shm_failed, "cannot map a peer's segment of " + format_bytes(actual), errno);
  }
  if (!keep_fd) fd.reset();
  return std::shared_ptr<Segment>(new Segment(std::move(fd), static_cast<std::byte*>(p), actual));
}

Segment::~Segment() {
  ::munmap(data_, size_);
}

}  // namespace ferry
