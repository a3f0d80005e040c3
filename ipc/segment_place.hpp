// Where a segment's memory lives. Both backings keep one contract (segment.hpp): nameless, so a
// process killed at any instant leaves nothing behind; passed to peers by fd; every byte reserved
// at creation.
// - memfd: memory from memfd_create(2). It is charged to the memory cgroup alone, so a container's
//   64 MiB /dev/shm cannot stop it. The default wherever the kernel allows memfd_create.
// - dir: an O_TMPFILE file in a tmpfs directory ($FERRY_SHM_DIR, else /dev/shm), bound by that
//   filesystem's size as well. The fallback, and the choice of whoever names a directory.
#pragma once

#include <string>

namespace ferry {

enum class SegmentBacking { memfd, dir };

const char* backing_name(SegmentBacking b) noexcept;  // "memfd" or "dir"

struct SegmentPlace {
  SegmentBacking backing = SegmentBacking::memfd;
  std::string dir;  // dir: where the files are made; memfd: the directory the fallback would use

  static SegmentPlace in_dir(std::string dir) { return {SegmentBacking::dir, std::move(dir)}; }
  // "a memfd" or "<dir>", for messages.
  std::string describe() const;
};

// The choice, pure. `requested` is FERRY_SHM_BACKING ("auto", "memfd" or "dir"); `dir_named`:
// FERRY_SHM_DIR is set; `memfd_works`: this kernel (and its seccomp filter) allows memfd_create.
// auto takes memfd unless a directory is named or memfd is refused; memfd when refused is
// Error(shm_failed) with the remedy.
SegmentBacking choose_backing(const std::string& requested, bool dir_named, bool memfd_works);

// Whether memfd_create works here; probed once per process.
bool memfd_works();

// The directory segments are created in with the dir backing: $FERRY_SHM_DIR if set, else
// /dev/shm. Throws Error(invalid_argument) when FERRY_SHM_DIR is not an absolute path.
std::string default_shm_dir();

// The place from FERRY_SHM_BACKING and FERRY_SHM_DIR (docs/environment.md). Throws
// Error(invalid_argument) for a malformed variable, and what choose_backing() throws.
SegmentPlace default_segment_place();

}  // namespace ferry
