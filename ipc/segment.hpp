// Segment: one region of POSIX shared memory, mapped once in this process.
//
// Created nameless (a memfd, or O_TMPFILE in the shm directory, with shm_open + immediate unlink
// where O_TMPFILE is unsupported: segment_place.hpp), so a process killed at any instant leaves
// nothing behind: the memory lives exactly as long as some process holds its fd or a mapping.
// Peers get the fd by SCM_RIGHTS. Every byte is reserved with posix_fallocate at creation, so a
// full filesystem or a memory cgroup without room is an Error(shm_exhausted) now, instead of a
// SIGBUS on first touch or the OOM killer later. A memfd is sealed against growing and
// shrinking, so no peer can truncate it under the others' mappings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ipc/fd.hpp"
#include "ipc/segment_place.hpp"

namespace ferry {

class Segment {
 public:
  // Creates and maps a segment of `size` bytes at `place` with every byte reserved. Throws
  // Error(shm_exhausted) naming the bytes asked, the bytes free and the remedy when it won't fit:
  // the filesystem's room, and for either backing the memory cgroup's (memory_room.hpp).
  static std::shared_ptr<Segment> create(std::size_t size,
                                         const SegmentPlace& place = default_segment_place());

  // Maps a segment from an fd received from its owner. `expected_size` (0: take the file's size)
  // is checked against the file so a truncated or wrong fd is an error, not a later SIGBUS.
  // keep_fd: keep the fd open (to pass it on); otherwise it is closed once mapped.
  static std::shared_ptr<Segment> attach(UniqueFd fd, std::size_t expected_size = 0,
                                         bool keep_fd = false);

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  int fd() const noexcept { return fd_.get(); }  // -1 once closed after mapping

  // Gives the pages of [offset, offset + length) (whole pages, both ends page-aligned) back to
  // the system: every mapping, in every process, reads zeros there until they are written again.
  // Only its creator calls it, on bytes nobody uses. False where the file cannot (logged once).
  bool release_pages(std::uint64_t offset, std::uint64_t length) noexcept;
  // Reserves those pages again, as create() reserved the whole segment, before they are used:
  // throws Error(shm_exhausted) naming the sizes and the remedy when they no longer fit.
  void reserve_pages(std::uint64_t offset, std::uint64_t length);

  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

 private:
  Segment(UniqueFd fd, std::byte* data, std::size_t size, SegmentPlace place = {}) noexcept
      : fd_(std::move(fd)), data_(data), size_(size), place_(std::move(place)) {}
  UniqueFd fd_;
  std::byte* data_;
  std::size_t size_;
  SegmentPlace place_;  // where create() made it: what a failed reserve_pages() names
};

}  // namespace ferry
