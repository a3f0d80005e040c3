// The segment server: how a peer gets the fd of a segment this process owns.
//
// Each process that owns segments listens on an abstract Unix socket named by its pid and
// process token. A receiver that meets a segment it has not mapped asks the owner once and gets
// the fd by SCM_RIGHTS; it maps it and caches the mapping (peer_segments.hpp), so steady-state
// sends make no fd-passing call. A small thread serves the socket so that an owner busy in user
// code (or blocked on a full queue) still answers. It takes one lock, held only for a map lookup
// and across fork (pthread_atfork), so it cannot deadlock a forked child; the child starts its
// own server when it first publishes.
//
// The thread also watches, by pidfd, each process it has served: the moment one exits, it runs
// the reader-exit hook (the arena's: take back the leases the dead process held, and let go of
// its segments mapped here), so a receiver's death releases what it pinned here at once, without
// a heartbeat and without waiting for this process to send again.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ipc/clock.hpp"
#include "ipc/fd.hpp"

namespace ferry {

class Segment;

// Makes `segment` fetchable by peers as (this process, seq) until withdrawn.
void publish_segment(std::uint32_t seq, std::shared_ptr<Segment> segment);
// Withdraws what was published as `seq` (a segment or a bundle).
void withdraw_segment(std::uint32_t seq);

// What a seq names, by range: an arena's segments count up from 0 (0: its lease ledger); fds a
// process hands to peers by name (kFirstHandedFdSeq, the Python package's pool messages); CUDA
// spans (ipc/cuda/span_export.hpp, from 0x80000000); the CUDA lease ledger (0xfffffffe).
inline constexpr std::uint32_t kFirstHandedFdSeq = 0x40000000u;

// Fds that travel together, with bytes that say what they are: the chunks of a CUDA span
// (ipc/cuda/span_export.hpp). At most 128 fds and 60 KiB.
struct FdBundle {
  std::vector<UniqueFd> fds;
  std::string bytes;
};
// Makes `bundle` fetchable by peers as (this process, seq) until withdrawn. The server keeps
// its own reference, so the fds stay open while a fetch is being served.
void publish_bundle(std::uint32_t seq, std::shared_ptr<const FdBundle> bundle);
// Fetches bundle `seq` from its owner: new fds of the same files, and the bytes. Throws as
// fetch_segment_fd does.
FdBundle fetch_bundle(pid_t owner_pid, std::uint64_t owner_token, std::uint32_t seq,
                      std::chrono::milliseconds timeout);
// This process's own published segment `seq`, or null.
std::shared_ptr<Segment> find_published_segment(std::uint32_t seq);

// What the serving thread runs when a process it served has exited, and also once a second
// while `pending` (if given) returns true: a process that uses our segments without having
// asked for them (forked from one that had) is found dead within that second. One per
// process; neither may throw.
void set_reader_exit_hook(void (*hook)() noexcept, bool (*pending)() noexcept = nullptr) noexcept;

// Work the serving thread does besides serving, when it comes due: `run(now)` does what is due
// and returns when it next comes due (nullopt: nothing pending). One per process; may not throw.
using Housekeeping = std::optional<Clock::time_point> (*)(Clock::time_point now) noexcept;
void set_housekeeping(Housekeeping run) noexcept;
// Tells the serving thread that housekeeping comes due by `due` at the latest. Cheap: a load,
// and a wake-up only when it had nothing pending.
void note_housekeeping(Clock::time_point due) noexcept;

// Fetches the fd of segment `seq` from its owner. Throws Error(peer_dead) when the owner has
// exited, Error(fd_transfer) when it refuses or no longer has the segment, Error(timeout).
UniqueFd fetch_segment_fd(pid_t owner_pid, std::uint64_t owner_token, std::uint32_t seq,
                          std::chrono::milliseconds timeout);

}  // namespace ferry
