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
// waiter counts (ring::wake); 7: custody from the first send (custody_owners, the pusher in a
// message's first slot)
inline constexpr std::uint32_t kVersion = 7;
inline constexpr std::size_t kParticipants = 32;
// A slot's own bytes before its record: in a message's first slot its record count and the pid
// of the process that pushed it (SlotHead), in the others zeros.
inline constexpr std::size_t kSlotHeader = 8;
struct SlotHead {
  std::uint32_t count;
  std::int32_t pusher;
};
static_assert(sizeof(SlotHead) == kSlotHeader, "a slot's header is its first 8 bytes");
// Processes whose segments the custody holds that a sweep can check without reading the socket.
inline constexpr std::size_t kCustodyOwners = 32;
// custody_sweep_ns while the custody holds nothing.
inline constexpr std::int64_t kNoSweep = std::numeric_limits<std::int64_t>::max();

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
  // The custody (ipc/channel.hpp): when its next sweep is due (steady clock, ns; kNoSweep while
  // it holds nothing), the pids of the processes whose segments it holds (0: a free place), and
  // whether some such process found no place (a sweep then reads every deposit). The pids and
  // the flag are written under the ring lock; the due time by whoever claims the sweep.
  std::atomic<std::int64_t> custody_sweep_ns;
  std::atomic<std::uint32_t> custody_untracked;
  std::atomic<std::int32_t> custody_owners[kCustodyOwners];
  alignas(64) std::atomic<std::uint64_t> participants[kParticipants];
};

// Where the slots start.
inline constexpr std::size_t kHeaderBytes = (sizeof(Header) + 63) / 64 * 64;

}  // namespace ferry::ring
