// Who may still push to or pop from a channel: the rule behind Error(peer_dead), and the one
// behind giving up a channel nobody holds.
//
// A process takes a role by acting: its first push makes it a producer, its first pop a
// consumer. A process that holds the channel but has not acted yet (a child that attached it,
// or was forked holding it) is a holder, and a holder may still do either. Children on their way
// (handed the channel, not yet attached) are counted as announced. A waiter is told its
// counterpart is gone only when no live process may still act on the other side, none is on its
// way, and some other process that could have has exited: a child that starts late is waited
// for, not taken for dead because an early sibling exited, and a producer that dies before its
// first push ends the consumer's wait as surely as one that pushed.
//
// The same table, with the channel's custody socket, says when no process at all can pop what is
// queued any more (channel_abandoned()).
#pragma once

#include <cstdint>
#include <vector>

namespace ferry {

// Roles a participant entry records, as bits.
inline constexpr std::uint32_t kRoleProducer = 1;
inline constexpr std::uint32_t kRoleConsumer = 2;
inline constexpr std::uint32_t kRoleHolder = 4;

// What a participant may still do, as bits: a holder may push until it has only popped, and pop
// until it has only pushed.
inline constexpr std::uint32_t kMayPush = 1;
inline constexpr std::uint32_t kMayPop = 2;
std::uint32_t capabilities(std::uint32_t roles) noexcept;

// Which side the waiter is on: a pop waits for producers, a push for consumers.
enum class Waiting : std::uint8_t { pop, push };

// Another process in the participants table: its roles and whether it is alive.
struct Participant {
  std::uint32_t roles = 0;
  bool alive = false;
};

// True when the waiter's counterpart is gone for good: the waiter itself has not acted on the
// other side (another of its threads might serve it), no child is announced, no live process
// may act on the other side, and one that could have has died (`others`, or `dead_roles`: the
// roles of dead entries whose places were reused). A dead holder that never acted counts: it
// could have. Before any other process held the channel the waiter waits (its own threads may
// serve it).
bool counterpart_gone(Waiting waiting, std::uint32_t self_roles,
                      const std::vector<Participant>& others, std::uint32_t dead_roles,
                      std::uint32_t announced) noexcept;

// Who holds a channel's custody socket besides this process, as a probe of its abstract name
// tells: some process (the name answers), none (it is gone), or unknown (this process never had
// the socket).
enum class SocketHolders : std::uint8_t { some, none, unknown };

// True when nothing queued in a channel can ever be popped, so that what its queued messages
// hold (their leases, and the channel itself) may be taken back by their sender: this process
// holds no handle on it any more, no process holds its custody socket (every process forked
// while holding the channel holds it, as does every process handed it together with the
// channel), no other process of the participants table is alive (one that attached the channel
// without its socket counts there from its attach), and no child is on its way. Without the
// socket's answer nothing is given up: a child forked holding the channel that has not acted yet
// is in no table.
bool channel_abandoned(bool held_here, SocketHolders custody, bool other_participant_alive,
                       std::uint32_t announced) noexcept;

}  // namespace ferry
