#include "runtime/transport/shm_cpu/exit_custody.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "ipc/arena.hpp"
#include "ipc/channel.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"

namespace ferry::detail {
namespace {

// How long an exiting sender waits for a queue's ring lock to leave its deposit there: a queue
// whose lock is held longer (its holder stopped, or died inside) keeps the sender waiting instead.
constexpr auto kDepositLockTimeout = std::chrono::seconds(1);

}  // namespace

ExitWait leave_in_custody() {
  Arena& arena = Arena::local();
  Ledger* ledger = arena.existing_ledger();
  if (!ledger) return [] { return std::size_t{0}; };
  std::vector<Ledger::Lease> waiting;
  struct Queued {
    std::shared_ptr<Channel> channel;
    std::vector<QueuedLease> leases;
    std::vector<Ledger::Lease> ids;
  };
  std::map<const Channel*, Queued> by_queue;
  for (const Ledger::Unclaimed& u : ledger->unclaimed_leases()) {
    if (!u.channel || u.segment == Ledger::kNoSegment) {
      waiting.push_back(u.lease);  // still being pushed by another thread
      continue;
    }
    Queued& q = by_queue[u.channel.get()];
    q.channel = u.channel;
    q.leases.push_back({u.seq, u.segment});
    q.ids.push_back(u.lease);
  }
  const auto fd_of = [&arena](std::uint32_t seq) {
    const std::shared_ptr<Segment> s = arena.segment(seq);
    return s ? s->fd() : -1;
  };
  for (auto& [key, q] : by_queue) {
    if (!q.channel->deposit(current_pid(), process_token(), q.leases, fd_of, kDepositLockTimeout)) {
      waiting.insert(waiting.end(), q.ids.begin(), q.ids.end());
    }
  }
  // What was deposited is done with: its receivers take the segments from the custody.
  return [ledger, waiting = std::move(waiting)] {
    std::size_t n = 0;
    for (const Ledger::Lease& l : waiting) n += ledger->unclaimed(l);
    return n;
  };
}

}  // namespace ferry::detail
