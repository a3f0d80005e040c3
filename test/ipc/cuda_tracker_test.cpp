// The CUDA allocation-lifetime tracker's decisions, on every machine (the send policy has its
// own file): what the import cache opens, reuses and closes, when an event may be recorded
// again, and how leases per (block, peer) end, with real processes and real shared memory.
// The CUDA calls these decisions drive are tested on a GPU (test/runtime/cuda_transport_test).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../catch.hpp"

#include <atomic>
#include <cstring>
#include <fstream>
#include <memory>

#include "../test_util.hpp"
#include "ipc/channel.hpp"
#include "ipc/cuda/event_pool.hpp"
#include "ipc/cuda/export_cache.hpp"
#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/import_cache.hpp"
#include "ipc/error.hpp"
#include "ipc/ledger.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/stats.hpp"

using namespace ferry;
using namespace ferry::cuda;
using namespace std::chrono_literals;

namespace {

// A device allocation legacy IPC can export.
BlockInfo exportable_block() {
  BlockInfo b;
  b.kind = MemoryKind::device;
  b.legacy_ipc = true;
  b.device = 0;
  b.base = 0x7f0000000000;
  b.size = 2 << 20;
  b.buffer_id = 1;
  return b;
}

BlockKey key(std::uint64_t base, std::uint64_t buffer_id, pid_t pid = 1000) {
  BlockKey k;
  k.owner.pid = pid;
  k.owner.pid_ns = 4026531836;
  k.owner.boot_id[0] = 0xb0;
  k.device[0] = 0xd0;
  k.base = base;
  k.size = 2 << 20;
  k.buffer_id = buffer_id;
  return k;
}

const ImportCache::Clock::time_point now = ImportCache::Clock::now();

LeaseRef lease(std::uint32_t slot) {
  LeaseRef l;
  l.device = 0;
  l.slot = slot;
  l.gen = 1;
  return l;
}

void* fake_mapping(std::uintptr_t at) {
  return reinterpret_cast<void*>(at);
}

// A lease record as a test channel carries it.
struct LeaseMsg {
  std::uint32_t slot;
  std::uint32_t gen;
};

}  // namespace

TEST_CASE("import cache: a block is opened once and every tensor from it is a view", "[cuda]") {
  ImportCache c;
  auto first = c.acquire(key(0x1000, 7));
  REQUIRE(first.action == ImportCache::Lookup::open);
  // A second tensor of the same block, arriving while the first is still opening, waits rather
  // than opening the block a second time (the classic "invalid device pointer").
  CHECK(c.acquire(key(0x1000, 7)).action == ImportCache::Lookup::wait);
  c.opened(first.id, 0, fake_mapping(0xa000));
  for (int i = 0; i < 999; ++i) {
    auto again = c.acquire(key(0x1000, 7));
    REQUIRE(again.action == ImportCache::Lookup::use);
    REQUIRE(again.id == first.id);
    REQUIRE(again.local == fake_mapping(0xa000));
  }
  CHECK(c.views_of(first.id) == 1000);
  CHECK(c.size() == 1);
}

TEST_CASE("import cache: keys name the owner by pid, pid namespace and boot id", "[cuda]") {
  ImportCache c;
  BlockKey a = key(0x1000, 7);
  BlockKey other_ns = a;
  other_ns.owner.pid_ns += 1;  // same pid number in another container
  BlockKey other_boot = a;
  other_boot.owner.boot_id[15] = 1;  // a pid from before a reboot (a stale record)
  BlockKey other_device = a;
  other_device.device[0] = 0xd1;
  for (const BlockKey& k : {a, other_ns, other_boot, other_device}) {
    CHECK(c.acquire(k).action == ImportCache::Lookup::open);
  }
  CHECK(c.size() == 4);
}

TEST_CASE("import cache: a reused address is a new block, and the stale entry is closed",
          "[cuda]") {
  const auto stale_before = transport_stats().cuda_stale_entries;
  ImportCache c;
  auto old_block = c.acquire(key(0x1000, 7));
  c.opened(old_block.id, 0, fake_mapping(0xa000));
  CHECK(c.drop_view(old_block.id, lease(1), now));  // idle: the closer has not run yet
  // The owner freed that allocation and a new one (new buffer id) landed at the same address:
  // never a hit on the old mapping.
  auto fresh = c.acquire(key(0x1000, 8));
  REQUIRE(fresh.action == ImportCache::Lookup::open);
  CHECK(fresh.id != old_block.id);
  CHECK(c.state_of(old_block.id) == ImportCache::State::closing);
  CHECK(transport_stats().cuda_stale_entries == stale_before + 1);
  // A block of another size at the same address is another block too.
  BlockKey resized = key(0x1000, 8);
  resized.size *= 2;
  CHECK(c.acquire(resized).action == ImportCache::Lookup::open);

  ImportCache::Work w = c.take_work(now, 0s);
  REQUIRE(w.close.size() == 1);
  CHECK(w.close[0].id == old_block.id);
  CHECK(w.close[0].local == fake_mapping(0xa000));
  REQUIRE(w.release.size() == 1);
  c.closed(old_block.id);
  CHECK(c.key_of(old_block.id) == nullptr);
  CHECK(c.key_of(fresh.id) != nullptr);
}

TEST_CASE("import cache: leases go to the closer, and a block closes once, after its last view",
          "[cuda]") {
  ImportCache c;
  auto a = c.acquire(key(0x1000, 7));
  c.opened(a.id, 0, fake_mapping(0xa000));
  c.acquire(key(0x1000, 7));
  c.acquire(key(0x1000, 7));

  // Views die one by one: each lease is handed over at once, the block stays open.
  CHECK_FALSE(c.drop_view(a.id, lease(1), now));
  CHECK_FALSE(c.drop_view(a.id, lease(2), now));
  ImportCache::Work w = c.take_work(now, 0s);
  CHECK(w.release.size() == 2);
  CHECK(w.close.empty());
  CHECK(c.state_of(a.id) == ImportCache::State::open);

  CHECK(c.drop_view(a.id, lease(3), now));  // the last view
  w = c.take_work(now, 0s);
  CHECK(w.release.size() == 1);
  REQUIRE(w.close.size() == 1);
  CHECK(c.state_of(a.id) == ImportCache::State::closing);
  // While it closes, a new tensor of the same block waits, then opens it afresh.
  CHECK(c.acquire(key(0x1000, 7)).action == ImportCache::Lookup::wait);
  CHECK(c.take_work(now, 0s).empty());  // never closed twice
  c.closed(a.id);
  CHECK(c.acquire(key(0x1000, 7)).action == ImportCache::Lookup::open);
}

TEST_CASE("import cache: an idle block is revived by a new tensor before the closer runs",
          "[cuda]") {
  ImportCache c;
  auto a = c.acquire(key(0x1000, 7));
  c.opened(a.id, 0, fake_mapping(0xa000));
  CHECK(c.drop_view(a.id, lease(1), now));
  auto again = c.acquire(key(0x1000, 7));
  CHECK(again.action == ImportCache::Lookup::use);
  CHECK(again.id == a.id);
  ImportCache::Work w = c.take_work(now, 0s);
  CHECK(w.close.empty());        // still in use: not closed
  CHECK(w.release.size() == 1);  // but the dead view's lease still ends
}

TEST_CASE("import cache: a view whose lease ended at its drop leaves the closer no lease",
          "[cuda]") {
  ImportCache c;
  auto a = c.acquire(key(0x1000, 7));
  c.opened(a.id, 0, fake_mapping(0xa000));
  auto b = c.acquire(key(0x1000, 7));
  CHECK_FALSE(c.drop_view(b.id, std::nullopt, now));  // released at once (an idle stream)
  CHECK(c.drop_view(a.id, lease(1), now));            // this one waits for the device
  ImportCache::Work w = c.take_work(now, 0s);
  CHECK(w.release.size() == 1);
  CHECK(w.close.size() == 1);  // both views counted: the mapping closes all the same
}

TEST_CASE("import cache: a mapping with no views lingers for the next tensor, then closes",
          "[cuda]") {
  ImportCache c;
  auto a = c.acquire(key(0x1000, 7));
  c.opened(a.id, 0, fake_mapping(0xa000));
  CHECK_FALSE(c.next_close(250ms).has_value());
  CHECK(c.drop_view(a.id, lease(1), now));
  REQUIRE(c.next_close(250ms).has_value());
  CHECK(*c.next_close(250ms) == now + 250ms);
  // Within the linger: the lease is handed over at once, the mapping stays.
  ImportCache::Work w = c.take_work(now + 100ms, 250ms);
  CHECK(w.release.size() == 1);
  CHECK(w.close.empty());
  CHECK(c.state_of(a.id) == ImportCache::State::idle);
  // Past it: closed.
  w = c.take_work(now + 250ms, 250ms);
  REQUIRE(w.close.size() == 1);
  CHECK_FALSE(c.next_close(250ms).has_value());
}

TEST_CASE("import cache: a failed open leaves nothing behind, owner death marks entries",
          "[cuda]") {
  ImportCache c;
  auto a = c.acquire(key(0x1000, 7, 1000));
  c.open_failed(a.id);
  CHECK(c.size() == 0);
  CHECK(c.acquire(key(0x1000, 7, 1000)).action == ImportCache::Lookup::open);

  auto b = c.acquire(key(0x2000, 9, 2000));
  c.opened(b.id, 0, fake_mapping(0xb000));
  auto owners = c.owners();
  CHECK(owners.size() == 2);
  CHECK(c.owner_died(key(0, 0, 2000).owner) == 1);
  CHECK(c.owner_dead(b.id));
  CHECK(c.owner_died(key(0, 0, 2000).owner) == 0);  // told once
  CHECK(c.owners().size() == 1);
}

TEST_CASE("export cache: one handle per allocation, a new allocation at the address gets its own",
          "[cuda]") {
  ExportCache c;
  BlockInfo b = exportable_block();
  CHECK(c.find(b) == nullptr);
  IpcHandle h{};
  h[0] = 1;
  c.put(b, h);
  REQUIRE(c.find(b) != nullptr);
  CHECK((*c.find(b))[0] == 1);
  BlockInfo reused = b;
  reused.buffer_id = 2;
  CHECK(c.find(reused) == nullptr);  // and the stale handle is gone
  CHECK(c.size() == 0);
  BlockInfo other_device = b;
  other_device.device = 1;
  c.put(b, h);
  CHECK(c.find(other_device) == nullptr);
}

TEST_CASE("event pool: an event is recorded again only after its receiver claimed (waited)",
          "[cuda]") {
  auto ledger = Ledger::create(8);
  EventPool pool(2);
  auto unclaimed = [&](const Ledger::Lease& l) { return ledger->unclaimed(l); };
  auto keep = std::make_shared<int>(0);

  auto t0 = pool.take(0, unclaimed);
  REQUIRE(t0.action == EventPool::Take::create);
  pool.add(0, t0.slot, fake_mapping(0xe0), IpcHandle{});
  const Ledger::Lease l0 = ledger->acquire(keep);
  pool.bind(0, t0.slot, l0);

  auto t1 = pool.take(0, unclaimed);
  REQUIRE(t1.action == EventPool::Take::create);  // event 0 is still awaited
  CHECK(t1.slot != t0.slot);
  pool.add(0, t1.slot, fake_mapping(0xe1), IpcHandle{});
  const Ledger::Lease l1 = ledger->acquire(keep);
  pool.bind(0, t1.slot, l1);

  // Both awaited and the pool is full: the sender must synchronise instead.
  CHECK(pool.take(0, unclaimed).action == EventPool::Take::exhausted);
  // Another device has its own events.
  CHECK(pool.take(1, unclaimed).action == EventPool::Take::create);

  // A receiver in another process claims lease 0 (after queueing its wait on event 0).
  const auto segment = ledger->segment();
  const pid_t receiver = test::fork_child([&] {
    if (!Ledger::claim(*segment, l0.slot, l0.gen, current_pid())) _exit(4);
  });
  REQUIRE(test::wait_child(receiver) == 0);
  auto again = pool.take(0, unclaimed);
  REQUIRE(again.action == EventPool::Take::use);
  CHECK(again.slot == t0.slot);
  CHECK(again.event == fake_mapping(0xe0));
  pool.give_back(0, again.slot);  // a send that failed frees it at once
  CHECK(pool.take(0, unclaimed).action == EventPool::Take::use);
  CHECK(pool.event_at(0, t1.slot) == fake_mapping(0xe1));
  CHECK(pool.event_at(3, 0) == nullptr);
  CHECK_THROWS_AS(EventPool(0), ferry::Error);
}

TEST_CASE(
    "leases per (block, peer): a block lives until every peer is done, and a killed peer's "
    "leases are reclaimed",
    "[cuda]") {
  auto ledger = Ledger::create(16);
  auto channel = Channel::create({8, sizeof(LeaseMsg)});
  const auto reclaimed_before = transport_stats().leases_reclaimed;

  // The block: what a CUDA lease keeps alive (the sender's storage). Its deleter says when it
  // went back to the allocator.
  auto freed = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<void> block(new int(0), [freed](void* p) {
    delete static_cast<int*>(p);
    freed->store(true);
  });
  // Three tensors of the one block: two to peer A, one to peer B.
  const std::shared_ptr<Segment> segment = ledger->segment();
  std::vector<Ledger::Lease> leases;
  for (int i = 0; i < 3; ++i) {
    leases.push_back(ledger->acquire(block));
    const LeaseMsg m{leases.back().slot, leases.back().gen};
    ledger->route(leases.back(), channel, channel->push(&m, 1, 5s));
  }
  block.reset();  // the sender dropped its tensor: only leases keep the block now

  int a_ready[2], a_go[2], b_ready[2];
  REQUIRE(::pipe(a_ready) == 0);
  REQUIRE(::pipe(a_go) == 0);
  REQUIRE(::pipe(b_ready) == 0);
  auto receive = [&](int n, std::vector<LeaseMsg>& got) {
    std::vector<std::byte> out;
    for (int i = 0; i < n; ++i) {
      channel->pop(out, 5s, [&](const std::byte* r, std::uint32_t, std::uint64_t) {
        LeaseMsg m;
        std::memcpy(&m, r, sizeof m);
        if (!Ledger::claim(*segment, m.slot, m.gen, current_pid())) _exit(5);
        got.push_back(m);
      });
    }
  };
  const pid_t a = test::fork_child([&] {
    std::vector<LeaseMsg> got;
    receive(2, got);
    char c = 1;
    (void)!::write(a_ready[1], &c, 1);
    (void)!::read(a_go[0], &c, 1);
    for (const auto& m : got) Ledger::release(*segment, m.slot, m.gen, current_pid());
  });
  char c;
  REQUIRE(::read(a_ready[0], &c, 1) == 1);
  const pid_t b = test::fork_child([&] {
    std::vector<LeaseMsg> got;
    receive(1, got);
    char one = 1;
    (void)!::write(b_ready[1], &one, 1);
    ::pause();  // holds its view until killed
  });
  REQUIRE(::read(b_ready[0], &c, 1) == 1);

  // Both peers hold leases: nothing ends, the block lives.
  CHECK(ledger->reclaim(true) == 0);
  CHECK(ledger->outstanding() == 3);
  CHECK_FALSE(freed->load());

  // Peer A is done with both its tensors: its two leases end, B's keeps the block.
  REQUIRE(::write(a_go[1], &c, 1) == 1);
  REQUIRE(test::wait_child(a) == 0);
  CHECK(ledger->has_releases());
  CHECK(ledger->reclaim(false) == 2);
  CHECK(ledger->outstanding() == 1);
  CHECK_FALSE(freed->load());

  // Peer B is killed holding its view: the sender takes the lease back and the block goes.
  ::kill(b, SIGKILL);
  CHECK(test::wait_child(b) == 128 + SIGKILL);
  CHECK(ledger->reclaim(true) == 1);
  CHECK(ledger->outstanding() == 0);
  CHECK(freed->load());
  CHECK(transport_stats().leases_reclaimed == reclaimed_before + 1);
  for (int fd : {a_ready[0], a_ready[1], a_go[0], a_go[1], b_ready[0], b_ready[1]}) ::close(fd);
}

TEST_CASE("process identity: pid, pid namespace and boot id, fresh in a forked child", "[cuda]") {
  const ProcessIdentity& me = this_process();
  CHECK(me.pid == ::getpid());
  struct stat st {};
  REQUIRE(::stat("/proc/self/ns/pid", &st) == 0);
  CHECK(me.pid_ns == st.st_ino);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string text;
  boot >> text;
  REQUIRE(text.size() == 36);
  CHECK(std::stoul(text.substr(0, 2), nullptr, 16) == me.boot_id[0]);
  CHECK(std::stoul(text.substr(34, 2), nullptr, 16) == me.boot_id[15]);

  int up[2], down[2];
  REQUIRE(::pipe(up) == 0);
  REQUIRE(::pipe(down) == 0);
  const pid_t child = test::fork_child([&] {
    const ProcessIdentity& mine = this_process();
    (void)!::write(up[1], &mine, sizeof mine);
    char c;
    (void)!::read(down[0], &c, 1);  // stay alive until the parent looked
  });
  ProcessIdentity theirs;
  REQUIRE(::read(up[0], &theirs, sizeof theirs) == static_cast<ssize_t>(sizeof theirs));
  CHECK(theirs.pid == child);
  CHECK(theirs.pid_ns == me.pid_ns);
  CHECK(theirs.boot_id == me.boot_id);
  CHECK(theirs != me);
  char c = 0;
  REQUIRE(::write(down[1], &c, 1) == 1);
  REQUIRE(test::wait_child(child) == 0);
  for (int fd : {up[0], up[1], down[0], down[1]}) ::close(fd);
}

TEST_CASE("a receiver that cannot open a block refuses its lease, and the owner learns who",
          "[cuda]") {
  auto ledger = Ledger::create(8);
  auto channel = Channel::create({8, sizeof(LeaseMsg)});
  const std::shared_ptr<Segment> segment = ledger->segment();
  auto block = std::make_shared<int>(42);
  for (int i = 0; i < 2; ++i) {
    const Ledger::Lease l = ledger->acquire(block);
    const LeaseMsg m{l.slot, l.gen};
    ledger->route(l, channel, channel->push(&m, 1, 5s));
  }
  // The receiver takes both: it refuses the first (cudaErrorAlreadyMapped), uses and releases
  // the second.
  const pid_t receiver = test::fork_child([&] {
    std::vector<std::byte> out;
    for (int i = 0; i < 2; ++i) {
      LeaseMsg m{};
      channel->pop(out, 5s, [&](const std::byte* r, std::uint32_t, std::uint64_t) {
        std::memcpy(&m, r, sizeof m);
        if (!Ledger::claim(*segment, m.slot, m.gen, current_pid())) _exit(5);
      });
      if (i == 0) {
        Ledger::refuse(*segment, m.slot, m.gen, current_pid());
        Ledger::release(*segment, m.slot, m.gen, current_pid());  // too late: already ended
      } else {
        Ledger::release(*segment, m.slot, m.gen, current_pid());
      }
    }
  });
  REQUIRE(test::wait_child(receiver) == 0);
  CHECK(ledger->reclaim(false) == 2);
  std::vector<Ledger::Refusal> refusals = ledger->take_refusals();
  REQUIRE(refusals.size() == 1);
  CHECK(refusals[0].by == receiver);
  CHECK(refusals[0].keepalive == block);
  CHECK(ledger->take_refusals().empty());  // each told once
  refusals.clear();
  CHECK(block.use_count() == 1);  // nothing in the ledger keeps the block any more
}
