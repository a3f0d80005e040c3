// When a waiter on a channel is told its counterpart is gone (Error(peer_dead)): one case per
// rule of counterpart_gone(), as the channel's waiters ask it; and when a channel is held by no
// process at all (channel_abandoned()).
#include "../catch.hpp"

#include <vector>

#include "ipc/peer_roles.hpp"

using ferry::capabilities;
using ferry::counterpart_gone;
using ferry::kMayPop;
using ferry::kMayPush;
using ferry::kRoleConsumer;
using ferry::kRoleHolder;
using ferry::kRoleProducer;
using ferry::Participant;
using ferry::Waiting;

namespace {
constexpr std::uint32_t kNone = 0;
}  // namespace

TEST_CASE("peer roles: a holder may do either until it acts, then what it did", "[peer_roles]") {
  REQUIRE(capabilities(kNone) == 0);
  REQUIRE(capabilities(kRoleProducer) == kMayPush);
  REQUIRE(capabilities(kRoleConsumer) == kMayPop);
  REQUIRE(capabilities(kRoleProducer | kRoleConsumer) == (kMayPush | kMayPop));
  REQUIRE(capabilities(kRoleHolder) == (kMayPush | kMayPop));
  REQUIRE(capabilities(kRoleHolder | kRoleProducer) == kMayPush);
  REQUIRE(capabilities(kRoleHolder | kRoleConsumer) == kMayPop);
  REQUIRE(capabilities(kRoleHolder | kRoleProducer | kRoleConsumer) == (kMayPush | kMayPop));
}

TEST_CASE("peer roles: a pop is told its producers are gone only when none can come",
          "[peer_roles]") {
  const std::uint32_t me = kRoleConsumer;
  const Participant dead_producer{kRoleProducer, false};
  const Participant live_producer{kRoleProducer, true};

  SECTION("before any producer existed, the pop waits") {
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {}, 0, 0));
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {{kRoleConsumer, false}}, 0, 0));
  }
  SECTION("every producer dead: gone") {
    REQUIRE(counterpart_gone(Waiting::pop, me, {dead_producer}, 0, 0));
    REQUIRE(counterpart_gone(Waiting::pop, me, {dead_producer, dead_producer}, 0, 0));
  }
  SECTION("one live producer among dead ones: not gone") {
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {dead_producer, live_producer}, 0, 0));
  }
  SECTION("a live holder that has not acted yet may still push: not gone") {
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {dead_producer, {kRoleHolder, true}}, 0, 0));
  }
  SECTION("a live holder that has only popped will not push: gone") {
    REQUIRE(counterpart_gone(Waiting::pop, me, {dead_producer, {kRoleHolder | kRoleConsumer, true}},
                             0, 0));
  }
  SECTION("a live consumer is no producer: gone") {
    REQUIRE(counterpart_gone(Waiting::pop, me, {dead_producer, {kRoleConsumer, true}}, 0, 0));
  }
  SECTION("a dead holder that never pushed could have: gone, as for a dead producer") {
    // A producer that died before its first put (an exception at its start, a kill).
    REQUIRE(counterpart_gone(Waiting::pop, me, {{kRoleHolder, false}}, 0, 0));
    REQUIRE(counterpart_gone(Waiting::pop, me, {{kRoleHolder | kRoleProducer, false}}, 0, 0));
  }
  SECTION("a dead holder that only popped could not have pushed: the pop waits") {
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {{kRoleHolder | kRoleConsumer, false}}, 0, 0));
  }
  SECTION("an announced child on its way: not gone, however many died") {
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {dead_producer}, 0, 1));
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {}, kRoleProducer, 3));
  }
  SECTION("a producer whose entry was reused still counts as one that died") {
    REQUIRE(counterpart_gone(Waiting::pop, me, {}, kRoleProducer, 0));
    REQUIRE(counterpart_gone(Waiting::pop, me, {}, kRoleHolder, 0));
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {}, kRoleConsumer, 0));
    // Roles of several reused entries are merged: where they cannot say a producer was among
    // them, the pop waits rather than be told wrongly.
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {}, kRoleConsumer | kRoleHolder, 0));
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me, {live_producer}, kRoleProducer, 0));
  }
  SECTION("the waiter that also pushes may serve itself from another thread: not gone") {
    REQUIRE_FALSE(counterpart_gone(Waiting::pop, me | kRoleProducer, {dead_producer}, 0, 0));
  }
  SECTION("the waiter's own holder role does not count: it is popping") {
    REQUIRE(counterpart_gone(Waiting::pop, me | kRoleHolder, {dead_producer}, 0, 0));
  }
}

TEST_CASE("peer roles: a push is told its consumers are gone only when none can come",
          "[peer_roles]") {
  const std::uint32_t me = kRoleProducer;
  const Participant dead_consumer{kRoleConsumer, false};

  SECTION("before any consumer existed, the push waits") {
    REQUIRE_FALSE(counterpart_gone(Waiting::push, me, {}, 0, 0));
    REQUIRE_FALSE(counterpart_gone(Waiting::push, me, {{kRoleProducer, false}}, 0, 0));
  }
  SECTION("every consumer dead: gone") {
    REQUIRE(counterpart_gone(Waiting::push, me, {dead_consumer}, 0, 0));
  }
  SECTION("a live consumer, or a live holder that has not acted: not gone") {
    REQUIRE_FALSE(
        counterpart_gone(Waiting::push, me, {dead_consumer, {kRoleConsumer, true}}, 0, 0));
    REQUIRE_FALSE(counterpart_gone(Waiting::push, me, {dead_consumer, {kRoleHolder, true}}, 0, 0));
  }
  SECTION("a live holder that has only pushed will not pop: gone") {
    REQUIRE(counterpart_gone(Waiting::push, me,
                             {dead_consumer, {kRoleHolder | kRoleProducer, true}}, 0, 0));
  }
  SECTION("an announced child: not gone") {
    REQUIRE_FALSE(counterpart_gone(Waiting::push, me, {dead_consumer}, 0, 1));
  }
  SECTION("a consumer whose entry was reused still counts as one that died") {
    REQUIRE(counterpart_gone(Waiting::push, me, {}, kRoleConsumer, 0));
  }
  SECTION("a dead holder that never popped could have: gone") {
    REQUIRE(counterpart_gone(Waiting::push, me, {{kRoleHolder, false}}, 0, 0));
    REQUIRE_FALSE(
        counterpart_gone(Waiting::push, me, {{kRoleHolder | kRoleProducer, false}}, 0, 0));
  }
  SECTION("the waiter that also pops: not gone") {
    REQUIRE_FALSE(counterpart_gone(Waiting::push, me | kRoleConsumer, {dead_consumer}, 0, 0));
  }
}

using ferry::channel_abandoned;
using ferry::SocketHolders;

TEST_CASE("abandoned: nobody holds it, not this process, the socket, the table or a newcomer",
          "[peer_roles][abandoned]") {
  CHECK(channel_abandoned(false, SocketHolders::none, false, 0));
}

TEST_CASE("abandoned: not while this process still has a handle on it", "[peer_roles][abandoned]") {
  CHECK_FALSE(channel_abandoned(true, SocketHolders::none, false, 0));
}

TEST_CASE("abandoned: not while some process holds its custody socket (a forked holder)",
          "[peer_roles][abandoned]") {
  CHECK_FALSE(channel_abandoned(false, SocketHolders::some, false, 0));
}

TEST_CASE("abandoned: not while another participant lives (one attached without the socket)",
          "[peer_roles][abandoned]") {
  CHECK_FALSE(channel_abandoned(false, SocketHolders::none, true, 0));
}

TEST_CASE("abandoned: not while a child is on its way to it", "[peer_roles][abandoned]") {
  CHECK_FALSE(channel_abandoned(false, SocketHolders::none, false, 1));
}

TEST_CASE("abandoned: never when this process cannot ask the socket", "[peer_roles][abandoned]") {
  // A process that never had the socket cannot tell a forked holder that has not acted yet.
  CHECK_FALSE(channel_abandoned(false, SocketHolders::unknown, false, 0));
}
