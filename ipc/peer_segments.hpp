// Peers' segments as mapped in this process: each one mapped once and reused for every tensor
// that lives in it, so a warm receiver makes no mmap or fd-passing call. Keyed by the owner's
// token and the segment's sequence number (a pid alone is reused; a token is not).
//
// The cache holds a live owner's mappings for good; an owner that exited has its mappings held
// only by what still points into them (tensors, the grace period of relocated storages), so
// they are unmapped when the last of those goes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "ipc/fd.hpp"

namespace ferry {

class Segment;

// Where a segment whose owner has exited may still be found (a queue's custody,
// Channel::from_custody): a new fd of it, or an empty one.
using SegmentFallback = std::function<UniqueFd(std::uint64_t owner_token, std::uint32_t seq)>;

// The mapping of owner's segment `seq` (fetching and mapping it on first use). `expected_size`
// comes from the record and must match the file. A segment of this process is returned as is.
// When the owner has exited, `fallback` is asked for the segment instead, and `*owner_exited`
// (if given) is set, as it is when the mapping is one of an owner already known to have exited.
std::shared_ptr<Segment> map_peer_segment(pid_t owner_pid, std::uint64_t owner_token,
                                          std::uint32_t seq, std::size_t expected_size,
                                          std::chrono::milliseconds timeout,
                                          const SegmentFallback& fallback = {},
                                          bool* owner_exited = nullptr);

// Stops holding the mappings of the owner with `owner_token`, which has exited.
void drop_peer_segments(std::uint64_t owner_token) noexcept;

// Stops holding the mappings of every owner that has exited (a liveness check per owner: callers
// rate-limit it). Mapping a new segment does this too.
void drop_dead_peer_segments() noexcept;

}  // namespace ferry
