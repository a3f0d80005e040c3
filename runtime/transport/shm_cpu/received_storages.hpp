// Received storages by sender (internal), so that what this process keeps does not pin a dead
// sender's segments (design invariant 9).
//
// Every CPU storage received as a view of a peer's block is noted under its sender, weakly: the
// note never keeps a tensor alive, and a storage freed meanwhile is skipped. When the sender has
// exited, each storage still alive is moved into this process's memory: a fresh buffer from the
// CPU allocator, a memcpy, and a swap of the storage's DataPtr, which every view of that storage
// follows. The old DataPtr is kept for a grace period (a thread that read the old address just
// before the swap must not fault), then dropped, which lets the sender's segments be unmapped.
//
// The one race: a write to the tensor by another thread while it is moved can land in the old
// buffer after the memcpy, and is then lost. Reads see the same values before and after.
#pragma once

#include <c10/core/Storage.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ferry::detail {

// How long a moved storage's old memory stays mapped after the swap.
inline constexpr std::chrono::milliseconds kRelocationGrace{1000};
// How often recv() looks for senders that died.
inline constexpr std::chrono::milliseconds kSenderCheck{100};

// Notes that `storage` is a view of segments of the sender with `owner_token` and `owner_pid`.
void track_received(const c10::Storage& storage, std::uint64_t owner_token, pid_t owner_pid);

// Moves every live storage received from a sender that has exited (with `pid` > 0: only from
// that pid) into this process's memory, and stops holding those senders' segments. Returns how
// many storages were moved.
std::size_t relocate_from_dead(pid_t pid = 0);

// relocate_from_dead() for every sender, at most once per kSenderCheck; otherwise a clock read.
void relocate_from_dead_if_due();

}  // namespace ferry::detail
