#include "ipc/segment_place.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include "ipc/env.hpp"
#include "ipc/error.hpp"

namespace ferry {

const char* backing_name(SegmentBacking b) noexcept {
  return b == SegmentBacking::memfd ? "memfd" : "dir";
}

std::string SegmentPlace::describe() const {
  return backing == SegmentBacking::memfd ? "a memfd" : dir;
}

SegmentBacking choose_backing(const std::string& requested, bool dir_named, bool memfd_works) {
  if (requested == "dir") return SegmentBacking::dir;
  if (requested == "memfd") {
    if (memfd_works) return SegmentBacking::memfd;
    throw Error(Errc::shm_failed,
                "FERRY_SHM_BACKING=memfd, but this kernel (or its seccomp filter) refuses "
                "memfd_create. Remedy: unset FERRY_SHM_BACKING to fall back to files in "
                "FERRY_SHM_DIR or /dev/shm");
  }
  if (requested != "auto" && !requested.empty()) {
    throw Error(Errc::invalid_argument,
                "FERRY_SHM_BACKING='" + requested + "': expected auto, memfd or dir");
  }
  return memfd_works && !dir_named ? SegmentBacking::memfd : SegmentBacking::dir;
}

bool memfd_works() {
  // ENOSYS before Linux 3.17; EPERM or ENOSYS where a seccomp filter forbids it.
  static const bool works = [] {
    const int fd = ::memfd_create("ferry-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }();
  return works;
}

std::string default_shm_dir() {
  return env::absolute_path("FERRY_SHM_DIR", "/dev/shm");
}

SegmentPlace default_segment_place() {
  SegmentPlace place;
  place.dir = default_shm_dir();
  const std::string requested = env::choice("FERRY_SHM_BACKING", "auto", {"auto", "memfd", "dir"});
  const bool dir_named = !env::text("FERRY_SHM_DIR", "").empty();
  // memfd_works() is only probed when it could matter.
  const bool memfd = requested != "dir" && !(requested == "auto" && dir_named) && memfd_works();
  place.backing = choose_backing(requested, dir_named, memfd);
  return place;
}

}  // namespace ferry
