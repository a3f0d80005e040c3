#include "ipc/peer_roles.hpp"

namespace ferry {

std::uint32_t capabilities(std::uint32_t roles) noexcept {
  const bool producer = (roles & kRoleProducer) != 0;
  const bool consumer = (roles & kRoleConsumer) != 0;
  const bool holder = (roles & kRoleHolder) != 0;
  std::uint32_t may = 0;
  if (producer || (holder && !consumer)) may |= kMayPush;
  if (consumer || (holder && !producer)) may |= kMayPop;
  return may;
}

bool counterpart_gone(Waiting waiting, std::uint32_t self_roles,
                      const std::vector<Participant>& others, std::uint32_t dead_capabilities,
                      std::uint32_t announced) noexcept {
  const std::uint32_t needed = waiting == Waiting::pop ? kMayPush : kMayPop;
  // Only an acted role counts for the waiter itself: it is inside a push or pop now, so it is
  // no longer a mere holder, and its own role on the other side means another thread may serve.
  const std::uint32_t acted = self_roles & (kRoleProducer | kRoleConsumer);
  if (capabilities(acted) & needed) return false;
  if (announced != 0) return false;
  bool saw_dead = (dead_capabilities & needed) != 0;
  for (const Participant& p : others) {
    if (!(capabilities(p.roles) & needed)) continue;
    if (p.alive) return false;
    saw_dead = true;
  }
  return saw_dead;
}

}  // namespace ferry
