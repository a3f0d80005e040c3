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
                      const std::vector<Participant>& others, std::uint32_t dead_roles,
                      std::uint32_t announced) noexcept {
  const std::uint32_t role = waiting == Waiting::pop ? kRoleProducer : kRoleConsumer;
  const std::uint32_t may = waiting == Waiting::pop ? kMayPush : kMayPop;
  // The waiter is inside a push or pop, so it is no mere holder; its own role on the other
  // side means another of its threads may serve.
  if (self_roles & role) return false;
  if (announced != 0) return false;
  bool saw_dead = dead_roles != 0 && (capabilities(dead_roles) & may) != 0;
  for (const Participant& p : others) {
    if (capabilities(p.roles) & may) {
      if (p.alive) return false;
      saw_dead = true;
    }
  }
  return saw_dead;
}

bool channel_abandoned(bool held_here, SocketHolders custody, bool other_participant_alive,
                       std::uint32_t announced) noexcept {
  return !held_here && custody == SocketHolders::none && !other_participant_alive && announced == 0;
}

}  // namespace ferry
