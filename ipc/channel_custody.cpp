// The Channel's side of its custody (ipc/channel.hpp says what it is for): what an exiting sender
// leaves, and what a pop takes and drops, under the ring lock; ipc/custody_socket.* moves the
// bytes.
#include <fcntl.h>

#include <algorithm>

#include "ipc/channel.hpp"
#include "ipc/channel_layout.hpp"
#include "ipc/channel_lock.hpp"
#include "ipc/channel_wait.hpp"
#include "ipc/custody_socket.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"

namespace ferry {

CustodyPlan plan_custody(const std::vector<QueuedLease>& leases, std::uint64_t head) {
  CustodyPlan plan;
  for (const QueuedLease& l : leases) {
    if (!custody_needed(l.seq, head)) continue;
    plan.last_seq = plan.segments.empty() ? l.seq : std::max(plan.last_seq, l.seq);
    plan.segments.push_back(l.segment);
  }
  if (plan.segments.empty()) return plan;
  // The lease ledger: a receiver claims each lease there before it maps the block.
  plan.segments.push_back(0);
  std::sort(plan.segments.begin(), plan.segments.end());
  plan.segments.erase(std::unique(plan.segments.begin(), plan.segments.end()), plan.segments.end());
  return plan;
}

bool custody_needed(std::uint64_t last_seq, std::uint64_t head) noexcept {
  return last_seq >= head;
}

bool Channel::deposit(pid_t owner_pid, std::uint64_t owner_token,
                      const std::vector<QueuedLease>& leases,
                      const std::function<int(std::uint32_t segment)>& fd_of,
                      std::chrono::milliseconds timeout) {
  if (!custody_) return false;
  Header* h = header();
  try {
    ring::Lock lock(h, ring::Deadline(timeout), "deposit", timeout);
    const pid_t self = current_pid();
    if (deposited_by_ != self) {
      deposited_by_ = self;
      deposited_until_ = 0;
    }
    std::vector<QueuedLease> fresh;
    for (const QueuedLease& l : leases) {
      if (l.seq >= deposited_until_) fresh.push_back(l);
    }
    const CustodyPlan plan = plan_custody(fresh, h->head.load(std::memory_order_relaxed));
    if (plan.segments.empty()) return true;
    std::vector<int> fds;
    for (std::uint32_t seg : plan.segments) {
      const int fd = fd_of(seg);
      if (fd < 0) return false;
      fds.push_back(fd);
    }
    for (std::size_t at = 0; at < fds.size(); at += custody::kMaxFdsPerDeposit) {
      const auto count =
          static_cast<std::uint32_t>(std::min(custody::kMaxFdsPerDeposit, fds.size() - at));
      const custody::DepositHead head{custody::kDepositMagic, owner_token, plan.last_seq, owner_pid,
                                      count};
      // A deposit sent before a later one failed is dropped in time like any other.
      if (!custody::send_deposit(custody_.get(), head, plan.segments.data() + at,
                                 fds.data() + at)) {
        return false;
      }
    }
    h->custody_until.store(
        std::min(h->custody_until.load(std::memory_order_relaxed), plan.last_seq + 1),
        std::memory_order_relaxed);
    deposited_until_ = plan.last_seq + 1;
    ferry::log().debug("channel custody: left {} segment(s) until message {}", fds.size(),
                       plan.last_seq);
    return true;
  } catch (const Error& e) {
    ferry::log().warn("channel custody: {}", e.detail());
    return false;
  }
}

UniqueFd Channel::from_custody(std::uint64_t owner_token, std::uint32_t segment) {
  if (!custody_) return UniqueFd();
  return sort_custody_locked(header()->head.load(std::memory_order_relaxed), owner_token, segment);
}

UniqueFd Channel::sort_custody_locked(std::uint64_t head, std::uint64_t owner_token,
                                      std::uint32_t segment) {
  UniqueFd found;
  bool drained;
  std::vector<custody::Deposit> deposits = custody::take_deposits(custody_.get(), &drained);
  // What could not be read is looked at again by the next pop.
  std::uint64_t until = drained ? ring::kNothingInCustody : head + 1;
  for (custody::Deposit& d : deposits) {
    if (!custody_needed(d.head.last_seq, head)) continue;  // its fds close here
    if (!found && owner_token != 0 && d.head.owner_token == owner_token) {
      for (std::size_t i = 0; i < d.segments.size(); ++i) {
        if (d.segments[i] == segment) {
          found = UniqueFd(::fcntl(d.fds[i].get(), F_DUPFD_CLOEXEC, 0));
          break;
        }
      }
    }
    if (custody::send_deposit(custody_.get(), d)) until = std::min(until, d.head.last_seq + 1);
  }
  header()->custody_until.store(until, std::memory_order_relaxed);
  return found;
}

int Channel::custody_fd() const noexcept {
  return custody_.get();
}

}  // namespace ferry
