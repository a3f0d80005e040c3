// The bytes of a channel's segment (internal): the header at its start, then `capacity` slots of
// kSlotHeader + record_size bytes. Every process maps it, so a change here bumps kVersion.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace ferry::ring {

inline constexpr std::uint64_t kMagic = 0x31484359'52524546ull;  // "FERRYCH1" little-endian
// 2: max_messages and the message count; 3: the wake-up stamps; 4: holders and announced
// children (ipc/peer_roles.hpp); 5: custody_until; 6: a waker takes those it woke out of the
// waiter counts (ring::wake)
inline constexpr std::uint32_t kVersion = 6;
inline constexpr std::size_t kParticipants = 32;
// A slot's own bytes before its record: the message's record count in its first slot, else 0.
inline constexpr std::size_t kSlotHeader = 8;
// custody_until when the custody keeps nothing.
inline constexpr std::uint64_t kNothingInCustody = std::numeric_limits<std::uint64_t>::max();

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared atomics must be lock-free");

// The layout at the start of the segment; Channel's header().
struct Header {
  std::atomic<std::uint64_t> magic;  // written last, by a release store: see Channel::create()
  std::uint32_t version;
  std::uint32_t capacity;
  std::uint32_t record_size;   // already rounded up to 8
  std::uint32_t slot_size;     // kSlotHeader + record_size
  std::uint32_t max_messages;  // 0: unbounded
  pthread_mutex_t mutex;
  // head and tail are positions since creation; each changes only by the single commit store at
  // the end of a critical section.
  alignas(64) std::atomic<std::uint64_t> head;
  std::atomic<std::uint64_t> tail;
  // Messages between head and tail. Written under the lock just before the commit store, so a
  // process dying between the two leaves it off by one: the next locker recounts it from the
  // slots (ring::Lock), which only committed state determines.
  std::atomic<std::uint32_t> messages;
  alignas(64) std::atomic<std::uint32_t> not_empty_seq;
  std::atomic<std::uint32_t> not_full_seq;
  // Processes asleep (or about to sleep) on each futex word and not yet woken: a wake is a
  // syscall, so it is made only when someone may be waiting. A waiter killed while counted costs
  // spare wakes, never a lost one.
  std::atomic<std::uint32_t> empty_waiters;
  std::atomic<std::uint32_t> full_waiters;
  // When a waker last called the kernel to wake sleepers on each word (steady clock, ns), so a
  // woken waiter learns how soon its answer came, not how long its own wake-up took (SpinPolicy).
  std::atomic<std::int64_t> not_empty_woken_ns;
  std::atomic<std::int64_t> not_full_woken_ns;
  std::atomic<std::uint32_t> closed;
  // Roles of dead participants whose entries were recycled: their death must still count.
  std::atomic<std::uint32_t> dead_roles;
  // Children handed the channel that have not attached yet (announce(), hold(true)).
  std::atomic<std::uint32_t> announced;
  // The head at which some deposit in the custody stops being needed (kNothingInCustody: none
  // is kept), so a pop looks at the custody only when one of them is due to go. Written under
  // the ring lock.
  std::atomic<std::uint64_t> custody_until;
  alignas(64) std::atomic<std::uint64_t> participants[kParticipants];
};

// Where the slots start.
inline constexpr std::size_t kHeaderBytes = (sizeof(Header) + 63) / 64 * 64;

}  // namespace ferry::ring
