// The Channel's side of its custody (ipc/channel.hpp says what it is for): what a sender entrusts
// before its first push that needs it, what a claim takes, and what a sweep drops, under the
// ring lock; ipc/custody_socket.* moves the bytes.
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "ipc/channel.hpp"
#include "ipc/channel_layout.hpp"
#include "ipc/channel_lock.hpp"
#include "ipc/channel_wait.hpp"
#include "ipc/custody_socket.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"

namespace ferry {
namespace {

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

constexpr std::int64_t kSweepNs =
    std::chrono::duration_cast<std::chrono::nanoseconds>(kCustodySweep).count();
// How long a process whose deposit was refused waits before it asks again: a full custody or a
// user out of in-flight fds does not change between two sends.
constexpr std::int64_t kRetryNs = 1'000'000'000;

// What a refusal means to the user, and what to change.
std::string refusal_remedy(int err) {
  if (err == ETOOMANYREFS) {
    return "this user has more fds in flight in sockets than its fd limit (ulimit -n) allows; "
           "raise it";
  }
  if (err == EAGAIN || err == ENOBUFS) {
    return "the queue's custody is full (net.core.wmem_max bounds it); fewer processes sending "
           "on one queue, or a larger wmem_max, make room";
  }
  return std::strerror(err);
}

}  // namespace

DepositFate deposit_fate(bool owner_alive, bool owner_has_queued) noexcept {
  return owner_alive || owner_has_queued ? DepositFate::keep : DepositFate::drop;
}

bool Channel::entrusted(std::uint32_t segment) const noexcept {
  if (segment >= kEntrustable || entrusted_pid_.load(std::memory_order_acquire) != current_pid()) {
    return false;
  }
  const std::uint64_t bit = std::uint64_t{1} << (segment % 64);
  return (entrusted_bits_[segment / 64].load(std::memory_order_acquire) & bit) != 0;
}

bool Channel::entrusted(const std::uint32_t* segments, std::size_t count) const noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    if (!entrusted(segments[i])) return false;
  }
  return true;
}

bool Channel::entrust(std::uint64_t owner_token, const std::uint32_t* segments, std::size_t count,
                      const FdOf& fd_of, std::chrono::milliseconds timeout) {
  if (entrusted(segments, count)) return true;
  if (!custody_) return false;
  if (entrust_retry_ns_.load(std::memory_order_relaxed) > now_ns() &&
      entrusted_pid_.load(std::memory_order_relaxed) == current_pid()) {
    return false;
  }
  Header* h = header();
  const pid_t self = current_pid();
  try {
    ring::Lock lock(h, ring::Deadline(timeout), "entrust", timeout);
    if (entrusted_pid_.load(std::memory_order_relaxed) != self) {
      // A forked child: its parent's deposits are its parent's.
      for (auto& bits : entrusted_bits_) bits.store(0, std::memory_order_relaxed);
      entrust_retry_ns_.store(0, std::memory_order_relaxed);
      entrusted_pid_.store(self, std::memory_order_release);
    }
    std::vector<std::uint32_t> missing;
    std::vector<int> fds;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint32_t seg = segments[i];
      if (entrusted(seg) || std::find(missing.begin(), missing.end(), seg) != missing.end()) {
        continue;
      }
      if (seg >= kEntrustable) {
        ferry::log().debug("channel custody: segment {} is past the {} kept track of", seg,
                           kEntrustable);
        return false;
      }
      const int fd = fd_of(seg);
      if (fd < 0) return false;
      missing.push_back(seg);
      fds.push_back(fd);
    }
    for (std::size_t at = 0; at < missing.size(); at += custody::kMaxFdsPerDeposit) {
      const auto n =
          static_cast<std::uint32_t>(std::min(custody::kMaxFdsPerDeposit, missing.size() - at));
      const custody::DepositHead head{custody::kDepositMagic, owner_token, self, n};
      if (const int err =
              custody::send_deposit(custody_.get(), head, missing.data() + at, fds.data() + at)) {
        entrust_retry_ns_.store(now_ns() + kRetryNs, std::memory_order_relaxed);
        detail::bump(detail::counters().custody_refusals);
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true)) {
          ferry::log().warn(
              "a queue's custody refused this process's shared memory ({}): what it sends on "
              "that queue is lost if it dies before a receiver takes it (a normal exit still "
              "waits for it, FERRY_EXIT_LINGER_MS)",
              refusal_remedy(err));
        }
        // What went in before is kept (noted below) and swept like any other deposit.
        missing.resize(at);
        break;
      }
    }
    if (missing.empty()) return false;
    note_custody_owner_locked(self);
    std::int64_t due = ring::kNoSweep;
    h->custody_sweep_ns.compare_exchange_strong(due, now_ns() + kSweepNs);
    for (std::uint32_t seg : missing) {
      entrusted_bits_[seg / 64].fetch_or(std::uint64_t{1} << (seg % 64), std::memory_order_release);
    }
    detail::bump(detail::counters().segments_entrusted, missing.size());
    ferry::log().debug("channel custody: entrusted {} segment(s)", missing.size());
  } catch (const Error& e) {
    // The ring lock stayed busy: the next send asks again.
    ferry::log().debug("channel custody: {}", e.detail());
    return false;
  }
  return entrusted(segments, count);
}

void Channel::note_custody_owner_locked(pid_t pid) noexcept {
  Header* h = header();
  std::atomic<std::int32_t>* free_place = nullptr;
  for (auto& owner : h->custody_owners) {
    const std::int32_t o = owner.load(std::memory_order_relaxed);
    if (o == pid) return;
    if (o == 0 && !free_place) free_place = &owner;
  }
  if (free_place) {
    free_place->store(pid, std::memory_order_release);
  } else {
    h->custody_untracked.store(1, std::memory_order_release);
  }
}

UniqueFd Channel::from_custody(std::uint64_t owner_token, std::uint32_t segment) {
  if (!custody_) return UniqueFd();
  return sweep_custody_locked({}, owner_token, segment);
}

void Channel::sweep_custody(bool force) {
  if (!custody_) return;
  Header* h = header();
  std::int64_t due = h->custody_sweep_ns.load(std::memory_order_relaxed);
  if (due == ring::kNoSweep) return;
  const std::int64_t now = now_ns();
  if (!force && now < due) return;
  // One process sweeps per period; the others carry on.
  if (!h->custody_sweep_ns.compare_exchange_strong(due, now + kSweepNs) && !force) return;
  // Who lives is asked outside the lock: the socket is read only when someone died.
  std::vector<pid_t> alive;
  bool someone_died = h->custody_untracked.load(std::memory_order_acquire) != 0;
  for (const auto& owner : h->custody_owners) {
    const pid_t pid = owner.load(std::memory_order_acquire);
    if (pid == 0) continue;
    if (process_alive(pid)) {
      alive.push_back(pid);
    } else {
      someone_died = true;
    }
  }
  if (!someone_died) return;
  try {
    ring::Lock lock(h, ring::Deadline(kCustodySweep), "custody sweep", kCustodySweep);
    sweep_custody_locked(alive);
  } catch (const Error& e) {
    // The lock stayed busy: the next sweep tries again.
    ferry::log().debug("channel custody: sweep skipped: {}", e.detail());
  }
}

UniqueFd Channel::sweep_custody_locked(const std::vector<pid_t>& alive, std::uint64_t owner_token,
                                       std::uint32_t segment) {
  Header* h = header();
  bool drained = true;
  // The deposits are read as copies, left in the socket: a reader SIGKILLed from here on (a
  // consumer inside its pop, any process sweeping) takes nothing with it. Only where the kernel
  // has no peek offset for the socket are they taken out and sent back, a window in which such a
  // death would lose them.
  std::size_t datagrams = 0;
  std::optional<std::vector<custody::Deposit>> peeked =
      custody::peek_deposits(custody_.get(), &drained, &datagrams);
  const bool in_place = peeked.has_value();
  std::vector<custody::Deposit> deposits =
      in_place ? std::move(*peeked) : custody::take_deposits(custody_.get(), &drained);
  // Who pushed what is still queued: their deposits stay whatever their fate.
  std::set<pid_t> queued;
  const std::uint64_t tail = h->tail.load(std::memory_order_relaxed);
  for (std::uint64_t at = h->head.load(std::memory_order_relaxed); at < tail;) {
    ring::SlotHead head{};
    std::memcpy(&head, slot(at), sizeof head);
    if (head.count == 0) break;  // corrupt: pop reports it
    queued.insert(head.pusher);
    at += head.count;
  }
  std::map<pid_t, bool> lives;
  for (pid_t pid : alive) lives[pid] = true;
  UniqueFd found;
  // Whether the socket should hold less than it does: a malformed datagram, a deposit to drop,
  // a segment twice, or deposits of one owner to merge (below).
  bool shrinks = datagrams > deposits.size();
  // Kept deposits are merged by owner, each segment once (a reader killed between writing and
  // dropping leaves some twice), so each owner takes one datagram (or a few) at most.
  std::map<std::uint64_t, custody::Deposit> kept;
  std::map<std::uint64_t, std::set<std::uint32_t>> kept_segments;
  for (custody::Deposit& d : deposits) {
    const pid_t owner = d.head.owner_pid;
    auto life = lives.find(owner);
    if (life == lives.end()) life = lives.emplace(owner, process_alive(owner)).first;
    if (deposit_fate(life->second, queued.count(owner) != 0) == DepositFate::drop) {
      ferry::log().debug("channel custody: dropped {} segment(s) of pid {}, which has exited",
                         d.fds.size(), owner);
      shrinks = true;
      continue;  // its fds close here
    }
    if (!found && owner_token != 0 && d.head.owner_token == owner_token) {
      for (std::size_t i = 0; i < d.segments.size(); ++i) {
        if (d.segments[i] == segment) {
          found = UniqueFd(::fcntl(d.fds[i].get(), F_DUPFD_CLOEXEC, 0));
          detail::bump(detail::counters().segments_from_custody);
          break;
        }
      }
    }
    custody::Deposit& k = kept[d.head.owner_token];
    std::set<std::uint32_t>& have = kept_segments[d.head.owner_token];
    if (k.fds.empty()) k.head = d.head;
    for (std::size_t i = 0; i < d.segments.size(); ++i) {
      if (!have.insert(d.segments[i]).second) {
        shrinks = true;  // a second copy of it: the rewrite leaves one
        continue;
      }
      k.segments.push_back(d.segments[i]);
      k.fds.push_back(std::move(d.fds[i]));
    }
  }
  std::size_t parts = 0;
  for (const auto& [token, d] : kept) {
    parts += (d.fds.size() + custody::kMaxFdsPerDeposit - 1) / custody::kMaxFdsPerDeposit;
  }
  // Read in place and nothing to drop or merge: the socket stays as it is.
  const bool rewrite = !in_place || shrinks || parts < datagrams;
  std::set<pid_t> owners;
  bool all_sent = true;
  for (auto& [token, d] : kept) {
    if (!rewrite) {
      owners.insert(d.head.owner_pid);
      continue;
    }
    for (std::size_t at = 0; at < d.fds.size(); at += custody::kMaxFdsPerDeposit) {
      custody::Deposit part;
      part.head = d.head;
      const std::size_t end = std::min(d.fds.size(), at + custody::kMaxFdsPerDeposit);
      part.head.count = static_cast<std::uint32_t>(end - at);
      for (std::size_t i = at; i < end; ++i) {
        part.segments.push_back(d.segments[i]);
        part.fds.push_back(std::move(d.fds[i]));
      }
      if (const int err = custody::send_deposit(custody_.get(), part)) {
        all_sent = false;
        if (in_place) {
          // The originals are still there: nothing is dropped this time.
          ferry::log().debug("channel custody: not rewritten, a deposit of pid {} did not go: {}",
                             part.head.owner_pid, refusal_remedy(err));
          continue;
        }
        // Taken out, it cannot go back: what it kept for a dead owner's messages is lost.
        ferry::log().warn("channel custody: lost {} segment(s) of pid {} while sweeping it: {}",
                          part.fds.size(), part.head.owner_pid, refusal_remedy(err));
        continue;
      }
      owners.insert(part.head.owner_pid);
    }
  }
  if (rewrite && in_place) {
    if (all_sent) {
      custody::drop_deposits(custody_.get(), datagrams);  // the originals, ahead of the copies
    } else {
      // The copies that went are second copies, merged away by a later sweep; every owner of an
      // original is still tracked.
      for (const custody::Deposit& d : deposits) owners.insert(d.head.owner_pid);
    }
  }
  // The owners' table, written again from what is kept; what could not be read is swept again.
  std::size_t i = 0;
  for (pid_t pid : owners) {
    if (i == ring::kCustodyOwners) break;
    h->custody_owners[i++].store(pid, std::memory_order_release);
  }
  for (std::size_t j = i; j < ring::kCustodyOwners; ++j) {
    h->custody_owners[j].store(0, std::memory_order_release);
  }
  h->custody_untracked.store(owners.size() > ring::kCustodyOwners || !drained ? 1 : 0,
                             std::memory_order_release);
  h->custody_sweep_ns.store(owners.empty() && drained ? ring::kNoSweep : now_ns() + kSweepNs,
                            std::memory_order_relaxed);
  return found;
}

int Channel::custody_fd() const noexcept {
  return custody_.get();
}

void Channel::hold_here() noexcept {
  holds_here_.fetch_add(1, std::memory_order_acq_rel);
}

void Channel::let_go_here() noexcept {
  if (holds_here_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    // Nothing of this process uses the socket any more: closing it lets abandoned() see whether
    // any other process still holds it.
    custody_.reset();
  }
}

bool Channel::abandoned() const {
  const bool held_here = holds_here_.load(std::memory_order_acquire) > 0;
  if (held_here) return false;  // no syscall for a channel in use
  const SocketHolders custody =
      custody_name_.empty() ? SocketHolders::unknown : custody::probe(custody_name_);
  if (custody != SocketHolders::none) return false;
  const Header* h = header();
  const pid_t self = current_pid();
  bool other_alive = false;
  for (const auto& e : h->participants) {
    const auto pid = static_cast<pid_t>(static_cast<std::uint32_t>(e.load()));
    if (pid != 0 && pid != self && process_alive(pid)) {
      other_alive = true;
      break;
    }
  }
  return channel_abandoned(held_here, custody, other_alive,
                           h->announced.load(std::memory_order_acquire));
}

}  // namespace ferry
