#include "runtime/transport/shm_cpu/exit_custody.hpp"

#include <vector>

#include "ipc/arena.hpp"
#include "ipc/channel.hpp"

namespace ferry::detail {

ExitWait wait_for_uncovered() {
  Ledger* ledger = Arena::local().existing_ledger();
  if (!ledger) return [] { return std::size_t{0}; };
  std::vector<Ledger::Lease> waiting;
  for (const Ledger::Unclaimed& u : ledger->unclaimed_leases()) {
    // A lease with no queue yet is still being pushed by another thread.
    const bool covered = u.channel && u.segment != Ledger::kNoSegment && u.channel->entrusted(0) &&
                         u.channel->entrusted(u.segment);
    if (!covered) waiting.push_back(u.lease);
  }
  return [ledger, waiting = std::move(waiting)] {
    std::size_t n = 0;
    for (const Ledger::Lease& l : waiting) n += ledger->unclaimed(l);
    return n;
  };
}

}  // namespace ferry::detail
