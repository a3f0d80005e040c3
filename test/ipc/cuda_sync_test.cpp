// How a CUDA receiver is ordered after its sender and when its lease ends (design invariant 6):
// one case per rule of choose_sync() and release_when(), and the bookkeeping behind memops: the
// sender's timeline slots and the receiver's flag buffers, what a dead sender's waits need.
#include "../catch.hpp"

#include <set>

#include "ipc/cuda/flag_imports.hpp"
#include "ipc/cuda/release_policy.hpp"
#include "ipc/cuda/sync_policy.hpp"
#include "ipc/cuda/timeline.hpp"
#include "ipc/error.hpp"

namespace ferry::cuda {
namespace {

SyncFacts busy(SyncMode mode) {
  SyncFacts f;
  f.mode = mode;
  f.memops = true;
  f.flag_slot = true;
  f.event_free = true;
  return f;
}

}  // namespace

TEST_CASE("sync policy: auto skips an idle stream and takes a memop on a busy one", "[sync]") {
  SyncFacts f = busy(SyncMode::automatic);
  CHECK(choose_sync(f).sync == Sync::memop);
  CHECK_FALSE(choose_sync(f).fallback);
  f.stream_idle = true;
  CHECK(choose_sync(f).sync == Sync::none);
  CHECK_FALSE(choose_sync(f).fallback);
  f.event_free = false;  // nothing else is needed for an idle stream
  f.memops = false;
  CHECK(choose_sync(f).sync == Sync::none);
}

TEST_CASE("sync policy: without memops, or without a flag slot, an event, counted", "[sync]") {
  for (SyncMode mode : {SyncMode::automatic, SyncMode::memop}) {
    SyncFacts f = busy(mode);
    f.memops = false;
    CHECK(choose_sync(f).sync == Sync::event);
    CHECK(choose_sync(f).fallback == SyncFallback::no_memops);
    f = busy(mode);
    f.flag_slot = false;
    CHECK(choose_sync(f).sync == Sync::event);
    CHECK(choose_sync(f).fallback == SyncFallback::flag_slots_full);
  }
}

TEST_CASE("sync policy: no event free where one is needed: the stream is synchronised", "[sync]") {
  SyncFacts f = busy(SyncMode::automatic);
  f.memops = false;
  f.event_free = false;
  CHECK(choose_sync(f).sync == Sync::synced);
  CHECK(choose_sync(f).fallback == SyncFallback::event_pool_full);
  f = busy(SyncMode::event);
  f.event_free = false;
  CHECK(choose_sync(f).sync == Sync::synced);
  CHECK(choose_sync(f).fallback == SyncFallback::event_pool_full);
}

TEST_CASE("sync policy: each forced mode takes its own way, idle or not", "[sync]") {
  for (bool idle : {false, true}) {
    SyncFacts f = busy(SyncMode::memop);
    f.stream_idle = idle;
    CHECK(choose_sync(f).sync == Sync::memop);
    f.mode = SyncMode::event;
    CHECK(choose_sync(f).sync == Sync::event);
    CHECK_FALSE(choose_sync(f).fallback);
    f.mode = SyncMode::stream;
    CHECK(choose_sync(f).sync == Sync::synced);
    CHECK_FALSE(choose_sync(f).fallback);
  }
}

TEST_CASE("sync policy: a stream being captured records an event, whatever the mode", "[sync]") {
  for (SyncMode mode : {SyncMode::automatic, SyncMode::memop, SyncMode::event, SyncMode::stream}) {
    SyncFacts f = busy(mode);
    f.capturing = true;
    f.stream_idle = true;  // not asked while capturing; must not count
    INFO(sync_mode_name(mode));
    CHECK(choose_sync(f).sync == Sync::event);
    if (mode == SyncMode::event) {
      CHECK_FALSE(choose_sync(f).fallback);
    } else {
      CHECK(choose_sync(f).fallback == SyncFallback::capturing);
    }
  }
}

TEST_CASE("sync policy: FERRY_CUDA_SYNC's values, and a bad one named with the choices", "[sync]") {
  CHECK(sync_mode_from("") == SyncMode::automatic);
  CHECK(sync_mode_from("auto") == SyncMode::automatic);
  CHECK(sync_mode_from("memop") == SyncMode::memop);
  CHECK(sync_mode_from("event") == SyncMode::event);
  CHECK(sync_mode_from("stream") == SyncMode::stream);
  CHECK_THROWS_WITH(sync_mode_from("fast"), Catch::Contains("FERRY_CUDA_SYNC=fast") &&
                                                Catch::Contains("auto") &&
                                                Catch::Contains("memop"));
  CHECK(std::string(sync_name(Sync::memop)) == "memop");
  CHECK(std::string(sync_fallback_name(SyncFallback::no_memops)) == "no_memops");
}

TEST_CASE("timeline: a slot per stream, values rising in it from 1", "[sync]") {
  Timeline t(3);
  auto a1 = t.next(1001);
  auto b1 = t.next(2002);
  auto a2 = t.next(1001);
  REQUIRE(a1);
  REQUIRE(b1);
  REQUIRE(a2);
  CHECK(a1->slot != b1->slot);
  CHECK(a2->slot == a1->slot);
  CHECK(a1->value == 1);
  CHECK(a2->value == 2);
  CHECK(b1->value == 1);
  CHECK(t.streams() == 2);
  CHECK(t.bytes() == 3 * 8);
}

TEST_CASE("timeline: once every slot has its stream, a new stream finds none", "[sync]") {
  Timeline t(2);
  REQUIRE(t.next(1));
  REQUIRE(t.next(2));
  CHECK(t.has_slot(1));
  CHECK_FALSE(t.has_slot(3));
  CHECK_FALSE(t.next(3));
  CHECK(t.next(2)->value == 2);  // the streams that have slots go on
  CHECK_THROWS_AS(Timeline(0), Error);
}

TEST_CASE("timeline: values stay far below the one that releases every wait", "[sync]") {
  Timeline t;
  std::uint64_t v = 0;
  for (int i = 0; i < 1000; ++i) v = t.next(7)->value;
  CHECK(v == 1000);
  CHECK(v < kReleaseValue);
  CHECK(static_cast<std::int64_t>(kReleaseValue) > 0);  // GEQ compares as signed differences
}

TEST_CASE("flag imports: a sender's buffer opened once, and its dead owner's waits released",
          "[sync]") {
  FlagImports f;
  ProcessIdentity a;
  a.pid = 100;
  ProcessIdentity b;
  b.pid = 200;
  FlagImports::Key a0{a, {}}, a1{a, {}}, b0{b, {}};
  a1.device[0] = 1;
  int x = 0, y = 0, z = 0;
  CHECK(f.find(a0) == nullptr);
  f.add(a0, 0, &x);
  f.add(a1, 1, &y);
  f.add(b0, 0, &z);
  CHECK(f.find(a0) == &x);
  CHECK_THROWS_AS(f.add(a0, 0, &x), Error);
  f.waited(a0, 3, 10);
  f.waited(a0, 3, 7);  // the highest is what counts
  f.waited(a0, 5, 1);
  f.waited(b0, 2, 4);
  CHECK(f.owners().size() == 2);

  std::vector<FlagImports::Release> released = f.owner_died(a);
  REQUIRE(released.size() == 2);
  std::set<void*> buffers;
  for (const auto& r : released) {
    buffers.insert(r.local);
    if (r.local == &x) {
      CHECK(r.device == 0);
      CHECK(r.slots == std::vector<std::uint32_t>{3, 5});
    } else {
      CHECK(r.slots.empty());  // opened, never waited on: closed with nothing to release
    }
  }
  CHECK(buffers == std::set<void*>{&x, &y});
  CHECK(f.find(a0) == nullptr);  // forgotten: a sender with that pid later is a new one
  CHECK(f.find(b0) == &z);
  CHECK(f.owner_died(a).empty());
  f.waited(a0, 1, 1);  // a wait on a buffer already let go of changes nothing
  CHECK(f.size() == 1);
}

TEST_CASE("release policy: a lease ends at once on an idle stream, else after an event", "[sync]") {
  ReleaseFacts f;
  f.event = true;
  CHECK(release_when(f) == Release::after_event);
  f.stream_idle = true;
  CHECK(release_when(f) == Release::now);
  f.stream_idle = false;
  f.event = false;  // no event could be had: the device, as before
  CHECK(release_when(f) == Release::after_device);
}

TEST_CASE("release policy: strict release waits for the whole device, whatever the stream",
          "[sync]") {
  ReleaseFacts f;
  f.strict = true;
  for (bool idle : {false, true}) {
    for (bool event : {false, true}) {
      f.stream_idle = idle;
      f.event = event;
      CHECK(release_when(f) == Release::after_device);
    }
  }
  CHECK(std::string(release_name(Release::after_event)) == "after_event");
}

}  // namespace ferry::cuda
