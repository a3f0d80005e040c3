#include "ipc/arena.hpp"

#include "../catch.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

#include "../fill_filesystem.hpp"
#include "../test_util.hpp"
#include "ipc/channel.hpp"
#include "ipc/error.hpp"
#include "ipc/ledger.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/stats.hpp"

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

namespace {

// The bytes of a segment's file that hold memory now (what its pages cost the system).
std::uint64_t resident_bytes(const ferry::Segment& segment) {
  struct stat st {};
  REQUIRE(::fstat(segment.fd(), &st) == 0);
  return std::uint64_t(st.st_blocks) * 512;
}

}  // namespace

TEST_CASE("free pages go back to the system once idle, and are reserved again before reuse",
          "[arena][idle]") {
  Arena::Options o = small_arena();
  o.idle = std::chrono::milliseconds(50);
  Arena arena(o);
  auto a = arena.allocate(1 << 20);
  auto b = arena.allocate(1 << 20);
  std::memset(a.data, 0x5a, a.size);
  std::memset(b.data, 0x6b, b.size);
  const auto segment = arena.segment(a.segment_seq);
  REQUIRE(resident_bytes(*segment) == 4u << 20);  // reserved whole at creation
  arena.free(a);
  const auto start = ferry::Clock::now();
  // Not idle long enough yet: nothing goes, and the answer says when it will.
  const auto due = arena.trim(start);
  REQUIRE(due.has_value());
  REQUIRE(*due <= start + std::chrono::milliseconds(50));
  REQUIRE(arena.stats().bytes_returned == 0);
  // Idle long enough: a's pages and the untouched rest go; b, in use, stays.
  REQUIRE_FALSE(arena.trim(start + std::chrono::seconds(1)).has_value());
  const std::uint64_t returned = arena.stats().bytes_returned;
  REQUIRE(returned == 3u << 20);
  REQUIRE(resident_bytes(*segment) == (4u << 20) - returned);
  REQUIRE(ferry::transport_stats().bytes_returned >= returned);
  for (std::size_t i = 0; i < b.size; i += 4096) REQUIRE(b.data[i] == std::byte{0x6b});
  // Reused: reserved again first, so the block's pages are memory the system holds for it.
  auto c = arena.allocate(1 << 20);
  REQUIRE(arena.stats().bytes_returned == returned - c.size);
  REQUIRE(resident_bytes(*segment) == (4u << 20) - returned + c.size);
  std::memset(c.data, 0x7c, c.size);
  REQUIRE(c.data[c.size - 1] == std::byte{0x7c});
}

TEST_CASE("a freed range is kept while it lies idle for less than the bound", "[arena][idle]") {
  Arena::Options o = small_arena();
  o.idle = std::chrono::hours(1);
  Arena arena(o);
  auto a = arena.allocate(4096);
  arena.free(a);
  const auto now = ferry::Clock::now();
  const auto due = arena.trim(now);
  REQUIRE(due.has_value());
  REQUIRE(*due > now + std::chrono::minutes(59));
  REQUIRE(arena.stats().bytes_returned == 0);
}

TEST_CASE("this process's arena gives idle pages back on its own, with no call into ferry",
          "[arena][idle]") {
  ferry::test::in_child([] {
    ::setenv("FERRY_ARENA_IDLE_MS", "100", 1);
    Arena& arena = Arena::local();
    auto a = arena.allocate(8 << 20);
    std::memset(a.data, 1, a.size);
    arena.free(a);
    const auto deadline = ferry::Clock::now() + std::chrono::seconds(10);
    while (arena.stats().bytes_returned < (8u << 20) && ferry::Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (arena.stats().bytes_returned < (8u << 20)) throw std::runtime_error("nothing went back");
  });
}

TEST_CASE("a block over given-back pages that no longer fit is an error naming the sizes",
          "[arena][idle]") {
  ferry::test::in_child([] {
    const std::string dir = ferry::test::private_tmpfs(8 << 20);
    Arena::Options o = small_arena();
    o.idle = std::chrono::milliseconds(0);
    o.dir = dir;
    Arena arena(o);
    auto a = arena.allocate(2 << 20);
    arena.free(a);
    arena.trim(ferry::Clock::now() + std::chrono::seconds(1));
    if (arena.stats().bytes_returned != 4u << 20) throw std::runtime_error("not given back");
    const std::string filler = ferry::test::fill_filesystem(dir);
    try {
      arena.allocate(2 << 20);
      throw std::runtime_error("no error");
    } catch (const ferry::Error& e) {
      const std::string what = e.what();
      if (e.code() != ferry::Errc::shm_exhausted || what.find("--shm-size") == std::string::npos) {
        throw std::runtime_error("wrong error: " + what);
      }
    }
    ::unlink(filler.c_str());
    // Room again: the same block is handed out, reserved.
    auto b = arena.allocate(2 << 20);
    std::memset(b.data, 2, b.size);
  });
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
