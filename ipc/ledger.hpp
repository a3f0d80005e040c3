// The lease ledger: how an owner knows when receivers are done with its blocks.
//
// Each tensor sent from an owner's arena takes one lease slot in the owner's ledger, a segment
// peers map like any other (sequence number 0). A slot is one 64-bit word, changed only by
// single compare-and-swaps, so a process killed at any instant leaves every slot valid:
//
//   FREE --owner sends--> IN_FLIGHT --receiver pops (inside the channel's critical section)-->
//   HELD(pid) --receiver drops its last view--> RELEASED --owner reclaims--> FREE
//   HELD(pid) --receiver cannot use the block at all--> RELEASED(refused by pid) --> FREE
//
// A generation number in the word makes stale releases harmless. The owner frees a slot when it
// is RELEASED, when its holder died after the message left the queue, or when its message was
// consumed but never claimed; the block behind it returns to the arena when its last lease and
// the owner's own references are gone.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace ferry {

class Channel;
class Segment;

class Ledger {
 public:
  struct Lease {
    std::uint32_t slot;
    std::uint32_t gen;
  };

  // A ledger of `slots` leases in a new segment (owner side).
  static std::unique_ptr<Ledger> create(std::uint32_t slots);
  // The size of the segment a ledger of `slots` leases takes.
  static std::size_t segment_bytes(std::uint32_t slots) noexcept;
  const std::shared_ptr<Segment>& segment() const noexcept { return segment_; }

  // A lease whose block lives in no segment of the owner's that a peer could map.
  static constexpr std::uint32_t kNoSegment = ~std::uint32_t{0};

  // Takes a free slot for a tensor about to be sent; `keepalive` (the block) is held until the
  // lease ends, and `segment` says which of the owner's segments holds it. Reclaims first when no
  // slot is free; throws Error(ledger_full) if none comes back.
  Lease acquire(std::shared_ptr<void> keepalive, std::uint32_t segment = kNoSegment);
  // True when acquire() would find a slot now (reclaiming ended leases first when none is free).
  bool has_room();
  // Records which channel carries the lease's message and its sequence number there, so a lease
  // whose message was consumed by a receiver that then died can be taken back.
  void route(const Lease& lease, std::shared_ptr<Channel> channel, std::uint64_t seq);
  // Gives back a lease whose message was never pushed.
  void abandon(const Lease& lease);
  // Frees every lease that has ended. With check_dead, also those held by processes that exited
  // (a syscall per distinct holder, so callers rate-limit it). Returns how many were freed.
  std::size_t reclaim(bool check_dead);
  // True when a receiver released something since the last reclaim (no syscall).
  bool has_releases() const noexcept;
  std::size_t outstanding() const;
  // Leases sent but not yet claimed by any receiver.
  std::size_t in_flight() const;
  // True while this lease is sent and not yet claimed (one atomic load, no lock).
  bool unclaimed(const Lease& lease) const noexcept;
  // The leases sent and not yet claimed, each with where its message is (channel null: not
  // pushed yet) and its block's segment: what an exiting owner hands over (Channel::deposit).
  struct Unclaimed {
    Lease lease;
    std::shared_ptr<Channel> channel;
    std::uint64_t seq;
    std::uint32_t segment;
  };
  std::vector<Unclaimed> unclaimed_leases() const;

  // Receiver side, on a peer's mapped ledger segment. claim(), from inside a pop only (under
  // the ring lock, with the message at the head), moves an IN_FLIGHT lease (or one HELD by
  // another consumer, which died before its pop committed) to HELD by `me`; false when the slot
  // does not match the record (a bad or stale record). release() ends a held lease.
  static bool claim(const Segment& ledger, std::uint32_t slot, std::uint32_t gen, pid_t me);
  static void release(const Segment& ledger, std::uint32_t slot, std::uint32_t gen,
                      pid_t me) noexcept;
  // Ends a held lease whose block the receiver could not use (a CUDA allocation it cannot
  // open), so the owner learns not to send that block to it again (take_refusals()).
  static void refuse(const Segment& ledger, std::uint32_t slot, std::uint32_t gen,
                     pid_t me) noexcept;

  // Owner side: the leases refused since the last call, with who refused and what the lease
  // kept alive.
  struct Refusal {
    pid_t by;
    std::shared_ptr<void> keepalive;
  };
  std::vector<Refusal> take_refusals();

 private:
  struct Header;
  // HELD by `me` -> RELEASED, with `marker` or'ed into the word (a refusal), and tells the owner.
  static void end_held(const Segment& ledger, std::uint32_t slot, std::uint32_t gen, pid_t me,
                       std::uint64_t marker) noexcept;
  struct Local {
    std::shared_ptr<void> keepalive;
    std::shared_ptr<Channel> channel;  // null until route(): not yet known to be in a queue
    std::uint64_t seq = 0;
    std::uint32_t gen = 0;
    std::uint32_t segment = kNoSegment;
  };
  explicit Ledger(std::shared_ptr<Segment> segment);
  Header* header() const noexcept;
  std::atomic<std::uint64_t>* slots() const noexcept;
  std::size_t reclaim_locked(bool check_dead);
  void free_locked(std::uint32_t slot);

  std::shared_ptr<Segment> segment_;
  mutable std::mutex mu_;
  std::vector<Local> local_;
  std::vector<std::uint32_t> free_;
  std::vector<std::uint32_t> outstanding_;  // slots not FREE, in no particular order
  std::vector<std::uint32_t> where_;        // slot -> its index in outstanding_
  std::vector<Refusal> refusals_;
  // Read without mu_ by has_releases(), a hint: a stale value costs one early or late reclaim.
  std::atomic<std::uint32_t> releases_seen_{0};
};

}  // namespace ferry
