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
// live in) would die with its sender, so a sender hands the fds of those segments to the channel
// before it pushes the first message that needs them (entrust()), once per segment. They wait as
// SCM_RIGHTS fds in flight in a Unix datagram socket connected to itself, which every process
// attached to the channel holds (custody_fd()): the kernel keeps them whatever happens to the
// sender, SIGKILL included, and refuses datagrams from any other socket. A receiver that cannot
// fetch a segment from its dead owner takes it from there (from_custody()). While its owner lives
// a deposit costs nothing (the owner holds the same memory); once the owner has died it is kept
// while a message the owner pushed is still queued, and dropped by the next sweep after that
// (deposit_fate()): a pop, push or wait that finds a sweep due checks the owners it holds at
// most every kCustodySweep, and reads the socket only when one of them died. So a dead
// sender's memory lives exactly as long as its queued messages, or until the channel's last
// holder exits and the socket goes with what is in it.
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

// How often a custody that holds something checks whether its owners are alive.
inline constexpr std::chrono::milliseconds kCustodySweep{200};

// What a sweep does with a deposit: keep it while its owner lives (it may send again, and what it
// sent may be popped at any time), and after its owner died while a message that owner pushed
// is still queued (whoever pops it needs the segments); otherwise drop it (its fds close).
enum class DepositFate : std::uint8_t { keep, drop };
DepositFate deposit_fate(bool owner_alive, bool owner_has_queued) noexcept;

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

  // Custody (see the top of this file). entrust(): the segments `segments` (numbers of this
  // process's arena; 0 is its lease ledger) of this process, `owner_token`, must outlive it for
  // the messages it pushes here: each one not handed over yet is deposited now, with its fd from
  // `fd_of`, before the caller pushes. A segment is handed over once per process, so later calls
  // cost a load per segment. True when every one of them is in the custody; false when this
  // process has no custody socket, the ring lock stayed busy past `timeout`, or the custody
  // refused them (logged once with the remedy, counted, and tried again at most once a second):
  // those segments then live only as long as this process.
  using FdOf = std::function<int(std::uint32_t segment)>;
  bool entrust(std::uint64_t owner_token, const std::uint32_t* segments, std::size_t count,
               const FdOf& fd_of, std::chrono::milliseconds timeout);
  // Whether this process's `segment` is in the custody (what a normal exit need not wait for),
  // and whether all of `segments` are (what a send asks before it calls entrust()).
  bool entrusted(std::uint32_t segment) const noexcept;
  bool entrusted(const std::uint32_t* segments, std::size_t count) const noexcept;
  // From inside a pop's claim only (it needs the ring lock): a new fd of `owner_token`'s
  // `segment` if the custody holds it, else an empty one. It also sweeps.
  UniqueFd from_custody(std::uint64_t owner_token, std::uint32_t segment);
  // Sweeps the custody now if a sweep is due: checks the owners' lives and drops the deposits
  // no one can need (deposit_fate()). `force`: even if one is not due. A push or pop asks on
  // every 64th call of its thread (a clock read is the cost), a wait on every slice.
  void sweep_custody(bool force = false);
  // The custody socket, to pass to a spawned process with fd(); -1 when this process has none.
  int custody_fd() const noexcept;

  // This process's handles on the channel (TensorQueue): while it has one it may pop what is
  // queued. When the last goes, its custody socket closes, so that abandoned() can tell whether
  // any other process still holds the channel.
  void hold_here() noexcept;
  void let_go_here() noexcept;
  // True when nothing queued here can ever be popped: this process lets go of it and no other
  // process holds it (ipc/peer_roles.hpp's channel_abandoned(), a few syscalls). What the queued
  // messages hold may then be taken back.
  bool abandoned() const;

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
  // With the ring lock held: sweeps the custody (deposit_fate()) and returns a new fd of
  // (owner_token, segment) when a kept deposit holds it. `alive`: owners already known alive.
  UniqueFd sweep_custody_locked(const std::vector<pid_t>& alive, std::uint64_t owner_token = 0,
                                std::uint32_t segment = 0);
  // Notes `pid` among the custody's owners, with the ring lock held.
  void note_custody_owner_locked(pid_t pid) noexcept;
  std::shared_ptr<Segment> segment_;
  UniqueFd custody_;
  // The custody socket's abstract name, for abandoned() to ask whether it still exists after
  // this process closed its own; empty without one.
  std::string custody_name_;
  // Which of its segments this process has entrusted (bit n: segment n; beyond 255 none is
  // kept track of, nor entrusted), for `entrusted_pid_` only: a forked child starts again.
  // Written under the ring lock, read without it.
  static constexpr std::uint32_t kEntrustable = 256;
  std::atomic<std::uint64_t> entrusted_bits_[kEntrustable / 64] = {};
  std::atomic<pid_t> entrusted_pid_{0};
  std::atomic<std::int64_t> entrust_retry_ns_{0};  // a refused custody is asked again from then
  std::atomic<int> holds_here_{0};
  // This process's entry in the participants table, redone when a forked child first acts.
  std::atomic<std::uint32_t> registered_roles_{0};
  std::atomic<pid_t> registered_pid_{0};
  // How long this process's waits for room and for messages take, learnt separately.
  SpinPolicy push_spin_;
  SpinPolicy pop_spin_;
};

}  // namespace ferry
