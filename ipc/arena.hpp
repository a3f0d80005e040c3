// Arena: this process's shared memory, carved into blocks for tensors.
//
// Segments are added as the arena grows (default 64 MiB each; a larger request gets a segment of
// its own) and kept for the arena's life, so receivers map each one once. Blocks are 64-byte
// aligned, 4 KiB aligned from 1 MiB up; freed blocks coalesce and are reused. The arena also
// owns the lease ledger through which receivers give blocks back.
//
// Memory goes back: the whole pages of a free range that has lain unused for `idle` (5 s,
// FERRY_ARENA_IDLE_MS) are given back to the system (a hole punched in the segment, which every
// mapping sees), and reserved again before a block is handed out over them, so the segment, its
// mappings and the no-SIGBUS promise stay. The segment server's thread does it (trim()).
//
// One arena per process: a forked child gets a fresh one on first use and never allocates from
// the copy of its parent's.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ipc/clock.hpp"
#include "ipc/ledger.hpp"

namespace ferry {

class Segment;

class Arena {
 public:
  struct Options {
    std::size_t segment_size = std::size_t{64} << 20;
    std::uint32_t lease_slots = 65536;
    std::string dir;  // empty: default_segment_place(); set: files in this directory
    // How long a free range lies unused before its pages go back to the system.
    std::chrono::milliseconds idle{5000};
  };
  struct Block {
    std::uint32_t segment_seq = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
    std::byte* data = nullptr;
  };
  struct Stats {
    std::uint64_t segments = 0, bytes_reserved = 0, bytes_in_use = 0, blocks_in_use = 0;
    std::uint64_t bytes_returned = 0;  // of bytes_reserved, pages given back to the system now
  };

  // This process's arena, created on first use with options from the environment
  // (FERRY_SHM_BACKING, FERRY_SHM_DIR, FERRY_ARENA_SEGMENT_MB, FERRY_LEASE_SLOTS).
  static Arena& local();
  // The options local() uses: the defaults with FERRY_ARENA_SEGMENT_MB and FERRY_LEASE_SLOTS
  // applied (dir stays empty: default_segment_place()). Throws Error(invalid_argument) naming a
  // malformed variable.
  static Options options_from_env();
  explicit Arena(Options options);

  // A block of at least `bytes`. Before growing, takes back leases receivers ended. Throws
  // Error(shm_exhausted) when the shm filesystem cannot hold another segment.
  Block allocate(std::size_t bytes);
  // The same without growing when `may_grow` is false: empty when no free block fits, even after
  // taking back ended leases. With may_grow, throws as allocate() does.
  std::optional<Block> try_allocate(std::size_t bytes, bool may_grow);
  // Returns a block; a no-op in any process but the one that allocated it.
  void free(const Block& block) noexcept;
  // Gives back to the system the pages of free ranges that have lain unused for options().idle
  // by `now` (steady clock); returns when the next one comes due, or nullopt when none will.
  std::optional<Clock::time_point> trim(Clock::time_point now) noexcept;

  std::shared_ptr<Segment> segment(std::uint32_t seq) const;
  Ledger& ledger();           // created (and published as segment 0) on first use
  Ledger* existing_ledger();  // null until something was sent
  Stats stats() const;
  // The segments' total size, read without the lock (a moment old at worst).
  std::uint64_t bytes_reserved() const noexcept {
    return reserved_.load(std::memory_order_relaxed);
  }
  std::size_t segment_size() const noexcept { return options_.segment_size; }
  pid_t pid() const noexcept { return pid_; }

  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

 private:
  struct Free {
    std::uint32_t seq;
    std::uint64_t offset;
  };
  // A free range of a segment: its size, since when it has lain unused, and whether its whole
  // pages have been given back since then.
  struct Range {
    std::uint64_t size;
    Clock::time_point since;
    bool trimmed;
  };
  bool take_locked(std::size_t size, std::size_t align, Block* out);
  void insert_free_locked(std::uint32_t seq, std::uint64_t offset, std::uint64_t size);
  void grow_locked(std::size_t at_least);
  // Reserves again the given-back pages that [offset, offset + size) of segment `seq` touches;
  // throws Error(shm_exhausted) when they no longer fit.
  void reserve_locked(std::uint32_t seq, std::uint64_t offset, std::uint64_t size);

  const Options options_;
  const pid_t pid_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Segment>> segments_;              // index seq-1
  std::vector<std::map<std::uint64_t, Range>> free_by_offset_;  // per segment
  // Per segment, the page ranges given back (offset -> end): always inside free ranges.
  std::vector<std::map<std::uint64_t, std::uint64_t>> returned_;
  std::multimap<std::uint64_t, Free> free_by_size_;
  Stats stats_;
  std::uint64_t returned_bytes_ = 0;  // the pages in returned_
  std::atomic<std::uint64_t> reserved_{0};
  std::unique_ptr<Ledger> ledger_;
};

}  // namespace ferry
