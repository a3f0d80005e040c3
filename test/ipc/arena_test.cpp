#include "ipc/arena.hpp"

#include "../catch.hpp"

#include <cstring>
#include <memory>

#include "../test_util.hpp"
#include "ipc/channel.hpp"
#include "ipc/error.hpp"
#include "ipc/ledger.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"

using ferry::Arena;
using ferry::Ledger;

namespace {
Arena::Options small_arena() {
  Arena::Options o;
  o.segment_size = 4 << 20;
  return o;
}
}  // namespace

TEST_CASE("arena blocks are aligned: 64 bytes, 4 KiB from 1 MiB up", "[arena]") {
  Arena arena(small_arena());
  for (std::size_t bytes : {1, 63, 65, 1000, 4097}) {
    auto b = arena.allocate(bytes);
    REQUIRE(b.offset % 64 == 0);
    REQUIRE(reinterpret_cast<std::uintptr_t>(b.data) % 64 == 0);
    REQUIRE(b.size >= bytes);
  }
  auto big = arena.allocate((1 << 20) + 3);
  REQUIRE(big.offset % 4096 == 0);
  REQUIRE(reinterpret_cast<std::uintptr_t>(big.data) % 4096 == 0);
}

TEST_CASE("freed blocks are reused and coalesce", "[arena]") {
  Arena arena(small_arena());
  auto a = arena.allocate(1000);
  auto b = arena.allocate(1000);
  auto c = arena.allocate(1000);
  REQUIRE(arena.stats().blocks_in_use == 3);
  arena.free(a);
  arena.free(b);
  // a and b merged: a block as large as both fits where they were, without growing.
  auto ab = arena.allocate(2048);
  REQUIRE(ab.segment_seq == a.segment_seq);
  REQUIRE(ab.offset == a.offset);
  REQUIRE(arena.stats().segments == 1);
  arena.free(ab);
  arena.free(c);
  REQUIRE(arena.stats().bytes_in_use == 0);
  auto whole = arena.allocate(4 << 20);  // the whole segment is one free range again
  REQUIRE(arena.stats().segments == 1);
  arena.free(whole);
}

TEST_CASE("the arena grows by segments, and a large block gets its own", "[arena]") {
  Arena arena(small_arena());
  auto a = arena.allocate(3 << 20);
  auto b = arena.allocate(3 << 20);
  REQUIRE(a.segment_seq != b.segment_seq);
  auto huge = arena.allocate(40 << 20);
  REQUIRE(arena.stats().segments == 3);
  REQUIRE(arena.segment(huge.segment_seq)->size() >= (40u << 20));
  std::memset(huge.data, 1, huge.size);  // reserved memory: touching it cannot SIGBUS
}

TEST_CASE("a forked child never frees into its parent's arena", "[arena]") {
  Arena arena(small_arena());
  auto a = arena.allocate(100);
  ferry::test::in_child([&] { arena.free(a); });
  REQUIRE(arena.stats().blocks_in_use == 1);
  arena.free(a);
  REQUIRE(arena.stats().blocks_in_use == 0);
}

TEST_CASE("a lease lives from send to release, then frees its block", "[ledger]") {
  auto ledger = Ledger::create(4);
  auto keep = std::make_shared<int>(7);
  std::weak_ptr<int> watch = keep;
  auto lease = ledger->acquire(keep);
  keep.reset();
  REQUIRE_FALSE(watch.expired());  // the ledger holds the block while the lease is in flight

  auto channel = ferry::Channel::create({4, 8});
  const char rec[8] = {};
  const auto seq = channel->push(rec, 1, std::chrono::seconds(1));
  ledger->route(lease, channel, seq);
  REQUIRE(ledger->reclaim(true) == 0);

  const pid_t me = ferry::current_pid();
  REQUIRE_FALSE(Ledger::claim(*ledger->segment(), lease.slot, lease.gen + 1, me));  // stale
  REQUIRE(Ledger::claim(*ledger->segment(), lease.slot, lease.gen, me));
  REQUIRE(ledger->reclaim(true) == 0);  // held by a live process
  REQUIRE_FALSE(ledger->has_releases());
  Ledger::release(*ledger->segment(), lease.slot, lease.gen, me);
  REQUIRE(ledger->has_releases());
  REQUIRE(ledger->reclaim(false) == 1);
  REQUIRE(watch.expired());
  REQUIRE(ledger->outstanding() == 0);
  // A late duplicate release of the old generation changes nothing.
  Ledger::release(*ledger->segment(), lease.slot, lease.gen, me);
  REQUIRE_FALSE(ledger->has_releases());
}

TEST_CASE("leases of a receiver that died are reclaimed once its message left the queue",
          "[ledger]") {
  auto ledger = Ledger::create(8);
  auto channel = ferry::Channel::create({4, 8});
  auto keep = std::make_shared<int>(1);
  std::weak_ptr<int> watch = keep;
  auto lease = ledger->acquire(std::move(keep));
  const char rec[8] = {};
  ledger->route(lease, channel, channel->push(rec, 1, std::chrono::seconds(1)));

  // The child claims inside its pop (as TensorQueue does), then dies holding the lease.
  const pid_t child = ferry::test::fork_child([&] {
    std::vector<std::byte> out;
    channel->pop(out, std::chrono::seconds(5), [&](const std::byte*, std::uint32_t, std::uint64_t) {
      if (!Ledger::claim(*ledger->segment(), lease.slot, lease.gen, ferry::current_pid())) {
        ::_exit(5);
      }
    });
    ::raise(SIGKILL);
  });
  REQUIRE(ferry::test::wait_child(child) == 128 + SIGKILL);
  REQUIRE_FALSE(watch.expired());
  REQUIRE(ledger->reclaim(false) == 0);  // a dead-holder check is asked for explicitly
  REQUIRE(ledger->reclaim(true) == 1);
  REQUIRE(watch.expired());
}

TEST_CASE("a consumer that dies inside its pop leaves the lease to the next one", "[ledger]") {
  auto ledger = Ledger::create(8);
  auto channel = ferry::Channel::create({4, 8});
  auto lease = ledger->acquire(std::make_shared<int>(1));
  const char rec[8] = {};
  ledger->route(lease, channel, channel->push(rec, 1, std::chrono::seconds(1)));
  const pid_t child = ferry::test::fork_child([&] {
    std::vector<std::byte> out;
    channel->pop(out, std::chrono::seconds(5), [&](const std::byte*, std::uint32_t, std::uint64_t) {
      Ledger::claim(*ledger->segment(), lease.slot, lease.gen, ferry::current_pid());
      ::raise(SIGKILL);  // dies before the pop commits
    });
  });
  REQUIRE(ferry::test::wait_child(child) == 128 + SIGKILL);
  REQUIRE(ledger->reclaim(true) == 0);  // the message is still queued: not reclaimable
  std::vector<std::byte> out;
  bool claimed = false;
  channel->pop(out, std::chrono::seconds(5), [&](const std::byte*, std::uint32_t, std::uint64_t) {
    claimed = Ledger::claim(*ledger->segment(), lease.slot, lease.gen, ferry::current_pid());
  });
  REQUIRE(claimed);
}

TEST_CASE("a full ledger is an error with a remedy", "[ledger]") {
  auto ledger = Ledger::create(2);
  ledger->acquire(std::make_shared<int>(1));
  ledger->acquire(std::make_shared<int>(2));
  try {
    ledger->acquire(std::make_shared<int>(3));
    FAIL("no error");
  } catch (const ferry::Error& e) {
    REQUIRE(e.code() == ferry::Errc::ledger_full);
    REQUIRE_THAT(e.what(), Catch::Contains("FERRY_LEASE_SLOTS"));
  }
}
