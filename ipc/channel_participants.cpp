// The Channel's participants table: who holds, pushed or popped it, and, for a waiter, whether
// everyone who could still answer it has exited (the rule is ipc/peer_roles.hpp's).
#include <string>
#include <vector>

#include "ipc/channel.hpp"
#include "ipc/channel_layout.hpp"
#include "ipc/log.hpp"
#include "ipc/peer_roles.hpp"
#include "ipc/process.hpp"

namespace ferry {
namespace {

// A participant entry packs pid and roles in one word so it is claimed, extended and recycled
// with one compare-exchange: no reader ever sees a new pid with a previous owner's roles.
constexpr std::uint64_t pack(pid_t pid, std::uint32_t roles) {
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(pid)) |
         (static_cast<std::uint64_t>(roles) << 32);
}
constexpr pid_t pid_of(std::uint64_t entry) {
  return static_cast<pid_t>(static_cast<std::uint32_t>(entry));
}
constexpr std::uint32_t roles_of(std::uint64_t entry) {
  return static_cast<std::uint32_t>(entry >> 32);
}

}  // namespace

// Adds `role` to `pid`'s entry in the participants table, taking a free entry, or one of a dead
// process, when it has none. False when every entry is held by a live process.
bool Channel::enter(pid_t pid, std::uint32_t role) {
  auto& table = header()->participants;
  for (auto& e : table) {
    std::uint64_t v = e.load(std::memory_order_acquire);
    while (pid_of(v) == pid) {
      if (e.compare_exchange_weak(v, pack(pid, roles_of(v) | role))) return true;
    }
  }
  for (auto& e : table) {
    std::uint64_t v = 0;
    if (e.compare_exchange_strong(v, pack(pid, role))) return true;
  }
  for (auto& e : table) {
    std::uint64_t v = e.load(std::memory_order_acquire);
    if (v == 0 || pid_of(v) == pid || process_alive(pid_of(v))) continue;
    // Published before the entry is recycled so a waiter never loses sight of that death.
    header()->dead_roles.fetch_or(roles_of(v));
    if (e.compare_exchange_strong(v, pack(pid, role))) return true;
  }
  return false;
}

void Channel::register_role(std::uint32_t role) {
  const pid_t self = current_pid();
  // A forked child inherits this object but is a different participant.
  if (registered_pid_.load(std::memory_order_relaxed) != self) {
    registered_roles_.store(0, std::memory_order_relaxed);
    registered_pid_.store(self, std::memory_order_relaxed);
  }
  if (registered_roles_.load(std::memory_order_relaxed) & role) return;
  if (!enter(self, role)) {
    if (role == kRoleHolder) {
      // Every child forked while a Python queue exists holds it, most never use it: no warning
      // for them. One that acts later tries again for its role, and warns then.
      ferry::log().debug("channel: no participant entry free for holder {}", self);
    } else {
      ferry::log().warn(
          "channel: all {} participant entries are held by live processes; process {} is not "
          "registered, so peers waiting on it will time out rather than see peer_dead if it "
          "dies",
          ring::kParticipants, self);
    }
  }
  registered_roles_.fetch_or(role, std::memory_order_relaxed);  // do not rescan every time
}

void Channel::hold(bool announced) {
  register_role(kRoleHolder);
  if (!announced) return;
  // Clamped at zero: a hold that no announce() counted must not hide another child's.
  auto& count = header()->announced;
  std::uint32_t n = count.load(std::memory_order_acquire);
  while (n != 0 && !count.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
  }
}

void Channel::announce() noexcept {
  header()->announced.fetch_add(1, std::memory_order_acq_rel);
}

bool Channel::expire_announced(pid_t child) {
  if (child <= 0 || process_alive(child)) return false;
  for (const auto& e : header()->participants) {
    if (pid_of(e.load(std::memory_order_acquire)) == child) return false;  // it arrived
  }
  auto& count = header()->announced;
  std::uint32_t n = count.load(std::memory_order_acquire);
  do {
    if (n == 0) return false;
  } while (!count.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel));
  // It was handed the channel and could have acted on either side: its death counts as a
  // holder's, and waiters name it.
  if (!enter(child, kRoleHolder)) header()->dead_roles.fetch_or(kRoleHolder);
  return true;
}

std::optional<std::string> Channel::counterpart_gone(Waiting waiting) const {
  const pid_t self = current_pid();
  const Header* h = header();
  const std::uint32_t needed = waiting == Waiting::pop ? kMayPush : kMayPop;
  std::uint32_t self_roles = 0;
  if (registered_pid_.load(std::memory_order_relaxed) == self) {
    self_roles = registered_roles_.load(std::memory_order_relaxed);
  }
  std::vector<Participant> others;
  std::vector<pid_t> pids;
  others.reserve(ring::kParticipants);
  for (const auto& e : h->participants) {
    const std::uint64_t v = e.load(std::memory_order_acquire);
    if (v == 0) continue;
    if (pid_of(v) == self) {
      self_roles |= roles_of(v);  // another Channel object of this process, or this one
      continue;
    }
    // Liveness reads /proc, so it is asked only where the rule looks at it (a process that
    // may act on the other side).
    const bool matters = (capabilities(roles_of(v)) & needed) != 0;
    others.push_back({roles_of(v), matters && process_alive(pid_of(v))});
    pids.push_back(pid_of(v));
  }
  const std::uint32_t dead_roles = h->dead_roles.load(std::memory_order_acquire);
  if (!ferry::counterpart_gone(waiting, self_roles, others, dead_roles,
                               h->announced.load(std::memory_order_acquire))) {
    return std::nullopt;
  }
  // Who could have served the waiter, and how each ended.
  std::string who;
  for (std::size_t i = 0; i < others.size(); ++i) {
    if ((capabilities(others[i].roles) & needed) == 0) continue;
    const std::uint32_t r = others[i].roles;
    const char* did = (r & (kRoleProducer | kRoleConsumer)) == 0   ? "held it"
                      : (r & kRoleProducer) && (r & kRoleConsumer) ? "pushed and popped"
                      : (r & kRoleProducer)                        ? "pushed"
                                                                   : "popped";
    if (!who.empty()) who += ", ";
    who += "pid " + std::to_string(pids[i]) + " (" + did + "; " + describe_exit(pids[i]) + ")";
  }
  if (dead_roles != 0 && (capabilities(dead_roles) & needed) != 0) {
    who += std::string(who.empty() ? "" : ", ") + "others whose places in the table were reused";
  }
  return who;
}

}  // namespace ferry
