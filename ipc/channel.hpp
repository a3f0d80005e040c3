// Channel: a bounded multi-producer multi-consumer queue of fixed-size records in shared memory.
//
// Crash safety: the ring is guarded by a robust process-shared mutex. Every operation prepares
// its slots first and commits with a single store of `tail` (push) or `head` (pop) at the end of
// the critical section, so a process killed at any instant leaves the ring consistent: the next
// locker gets EOWNERDEAD, marks the mutex consistent and carries on; a half-written push is
// invisible and a half-done pop leaves its message in place for the next consumer.
// Waiting polls the futex word for a moment first (SpinPolicy: only while answers come that fast,
// at most 100 us), then is a futex wait in slices of at most 100 ms, so waiters notice closing and
// peer death.
//
// Custody: what a message needs besides its records (the segments of shared memory its tensors
// live in) dies with its sender, so a sender that exits normally hands the fds of those segments
// to the channel (deposit()). They wait as SCM_RIGHTS fds in flight in a Unix datagram socket
// connected to itself, which every process attached to the channel holds (custody_fd()): the
// kernel keeps them after the sender has gone, and refuses datagrams from any other socket. A
// receiver that cannot fetch a segment from its exited owner takes it from there
// (from_custody()). A deposit is kept until the last message that needs it has been consumed,
// and dropped by the pop that consumes it, so a dead sender's memory lives exactly as long as its
// queued messages (plan_custody(), custody_needed()), or until the channel's last holder exits.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ipc/clock.hpp"
#include "ipc/fd.hpp"
#include "ipc/peer_roles.hpp"
#include "ipc/spin_policy.hpp"

namespace ferry {

class Segment;

namespace ring {
struct Header;
}

// A lease of a sender that is exiting, as a channel's custody sees it: the message that carries
// it and the sender's segment that its block lives in.
struct QueuedLease {
  std::uint64_t seq = 0;      // the message's sequence number (Channel::push)
  std::uint32_t segment = 0;  // the owner's segment holding the block
};

// What an exiting sender leaves in a channel's custody, given its leases on that channel and the
// ring's head: the segments its messages still queued there need (ascending, each once, with its
// lease ledger, segment 0, first), kept until message `last_seq` has been consumed. A lease whose
// message was consumed already (seq before head) needs nothing; no segments: nothing to leave.
struct CustodyPlan {
  std::uint64_t last_seq = 0;
  std::vector<std::uint32_t> segments;
};
CustodyPlan plan_custody(const std::vector<QueuedLease>& leases, std::uint64_t head);

// Whether a deposit kept until message `last_seq` is still needed when the ring's head is `head`
// (every message before `head` consumed). A pop reads its head before it commits, so the message
// it is popping still counts.
bool custody_needed(std::uint64_t last_seq, std::uint64_t head) noexcept;

class Channel {
 public:
  struct Options {
    std::uint32_t capacity = 64;     // records the ring holds; a message takes one per record
    std::uint32_t record_size = 64;  // bytes of each record (rounded up to 8)
    // Messages the ring holds at most, whatever their size; 0: only `capacity` bounds it. A
    // queue of Python objects is bounded in messages (Queue(maxsize)), not in records.
    std::uint32_t max_messages = 0;
  };

  // Creates the channel in a fresh segment; share it by fork, or pass fd() to a spawned child.
  static std::shared_ptr<Channel> create(const Options& options);
  // Attaches to a channel whose segment fd was inherited or received; validates the header.
  // `custody`: the channel's custody socket (custody_fd() where it came from), or none: this
  // process then neither deposits nor takes from the custody.
  static std::shared_ptr<Channel> attach(UniqueFd fd, UniqueFd custody = UniqueFd());

  // Pushes a message of `count` records (1 <= count <= capacity) as one unit: consumers see all
  // of it or none. Blocks while the ring lacks room (records, or max_messages); throws
  // Error(timeout), Error(closed), or Error(peer_dead) when every process that popped, or held
  // the channel and could have, has exited (ipc/peer_roles.hpp has the rule).
  // Returns the message's sequence number (its first record's position since creation).
  std::uint64_t push(const void* records, std::uint32_t count, std::chrono::milliseconds timeout);

  // Pops the oldest message into `out` (resized to count * record_size). `claim`, if given, runs
  // inside the critical section with the records and the message sequence number, before the pop
  // commits: what it records (leases) is in place before the message leaves the ring, and if the
  // caller dies there, the message stays. Throws Error(timeout), Error(closed) once closed and
  // drained, or Error(peer_dead) when the ring is empty and every process that pushed, or held
  // the channel and could have, has exited.
  using Claim =
      std::function<void(const std::byte* records, std::uint32_t count, std::uint64_t seq)>;
  std::uint32_t pop(std::vector<std::byte>& out, std::chrono::milliseconds timeout,
                    const Claim& claim = {});

  // Counts this process as a holder: it may push or pop, and until it has done one of them,
  // peers waiting on either side wait for it rather than report peer_dead. `announced`: this is
  // the child an announce() counted, which this ends.
  void hold(bool announced = false);
  // Counts one process on its way to the channel (handed it, not holding it yet): until it holds,
  // no waiter reports peer_dead. One that never arrives holds waiters until expire_announced().
  void announce() noexcept;
  // The child `child`, which an announce() counted, has exited: if it never held the channel, its
  // announcement ends, since it will never arrive, and it counts as a holder that died. Returns
  // whether one ended. Nothing happens while `child` lives.
  bool expire_announced(pid_t child);

  // Closes the channel for every process: pushes fail at once, pops drain then fail. Idempotent.
  void close() noexcept;
  bool closed() const noexcept;

  // True once the message with sequence number `seq` has been popped (or discarded).
  bool consumed(std::uint64_t seq) const noexcept;

  // Custody (see the top of this file). deposit(): `owner` (this process, exiting) leaves the
  // segments that its messages among `leases` still queued here need; `fd_of(segment)` gives
  // each one's fd. True when nothing of them needs the owner any more (left in custody, or
  // consumed already); false when this process has no custody socket, the ring lock stayed busy
  // past `timeout`, or the custody is full: the owner must then stay until they are claimed.
  // Leases this process already left here are not left twice.
  bool deposit(pid_t owner_pid, std::uint64_t owner_token, const std::vector<QueuedLease>& leases,
               const std::function<int(std::uint32_t segment)>& fd_of,
               std::chrono::milliseconds timeout);
  // From inside a pop's claim only (it needs the ring lock): a new fd of `owner_token`'s
  // `segment` if the custody holds it, else an empty one.
  UniqueFd from_custody(std::uint64_t owner_token, std::uint32_t segment);
  // The custody socket, to pass to a spawned process with fd(); -1 when this process has none.
  int custody_fd() const noexcept;

  std::uint32_t capacity() const noexcept;
  std::uint32_t record_size() const noexcept;
  std::uint32_t size() const noexcept;          // records in the ring now
  std::uint32_t messages() const noexcept;      // messages in the ring now
  std::uint32_t max_messages() const noexcept;  // 0: no bound but capacity
  int fd() const noexcept;  // the segment's fd, for passing to a spawned process
  // What this process has learnt of its waits for messages and for room (how long it polls).
  const SpinPolicy& pop_spin() const noexcept { return pop_spin_; }
  const SpinPolicy& push_spin() const noexcept { return push_spin_; }
  // This process's waits on this channel give the core away between polls (SpinPolicy).
  void set_yielding(bool on) noexcept {
    push_spin_.set_yielding(on);
    pop_spin_.set_yielding(on);
  }

  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

 private:
  using Header = ring::Header;  // ipc/channel_layout.hpp
  Channel(std::shared_ptr<Segment> segment, UniqueFd custody);
  Header* header() const noexcept;
  std::byte* slot(std::uint64_t position) const noexcept;
  bool enter(pid_t pid, std::uint32_t role);
  void register_role(std::uint32_t role);
  // Who could have served a waiter on the other side and has exited ("pid 12 (pushed; exited
  // with code 1)"), when every such process is gone (ipc/peer_roles.hpp); nullopt otherwise.
  std::optional<std::string> counterpart_gone(Waiting waiting) const;
  // With the ring lock held: drops the deposits no message from `head` on needs, keeps the rest,
  // and returns a new fd of (owner_token, segment) when one of them holds it.
  UniqueFd sort_custody_locked(std::uint64_t head, std::uint64_t owner_token = 0,
                               std::uint32_t segment = 0);
  std::shared_ptr<Segment> segment_;
  UniqueFd custody_;
  // Through which message this process has deposited already (one past it), guarded by the
  // ring lock; a forked child starts again.
  pid_t deposited_by_ = 0;
  std::uint64_t deposited_until_ = 0;
  // This process's entry in the participants table, redone when a forked child first acts.
  std::atomic<std::uint32_t> registered_roles_{0};
  std::atomic<pid_t> registered_pid_{0};
  // How long this process's waits for room and for messages take, learnt separately.
  SpinPolicy push_spin_;
  SpinPolicy pop_spin_;
};

}  // namespace ferry
