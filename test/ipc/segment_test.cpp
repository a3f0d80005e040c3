#include "ipc/segment.hpp"

#include <dirent.h>
#include <sys/socket.h>

#include "../catch.hpp"

#include <cstring>
#include <set>
#include <string>

#include "../test_util.hpp"
#include "ipc/error.hpp"
#include "ipc/peer_segments.hpp"
#include "ipc/process.hpp"
#include "ipc/segment_server.hpp"
#include "ipc/stats.hpp"

using ferry::Errc;
using ferry::Error;
using ferry::Segment;

namespace {

std::set<std::string> shm_entries() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

}  // namespace

TEST_CASE("a segment is shared memory that a forked child writes and the parent reads",
          "[segment]") {
  auto seg = Segment::create(1 << 20);
  REQUIRE(seg->size() == (1u << 20));
  REQUIRE(seg->fd() >= 0);
  const int code = ferry::test::wait_child(
      ferry::test::fork_child([&] { std::memcpy(seg->data() + 4096, "ferry", 6); }));
  REQUIRE(code == 0);
  REQUIRE(std::string(reinterpret_cast<const char*>(seg->data() + 4096)) == "ferry");
}

TEST_CASE("segments leave nothing in /dev/shm, even when their owner is SIGKILLed", "[segment]") {
  const auto before = shm_entries();
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ferry::test::fork_child([&] {
    auto a = Segment::create(8 << 20);
    auto b = Segment::create(1 << 20);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(3);  // never; glibc wants it checked
    ::pause();                                      // killed while holding both
  });
  char c;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::kill(child, SIGKILL);
  REQUIRE(ferry::test::wait_child(child) == 128 + SIGKILL);
  ::close(ready[0]);
  ::close(ready[1]);
  REQUIRE(shm_entries() == before);
}

TEST_CASE("a peer fetches a segment's fd from its owner once, by SCM_RIGHTS", "[segment]") {
  auto seg = Segment::create(64 << 10);
  std::memcpy(seg->data(), "owner's bytes", 14);
  ferry::publish_segment(7, seg);
  const pid_t owner = ferry::current_pid();
  const std::uint64_t token = ferry::process_token();
  ferry::test::in_child([&] {
    const auto before = ferry::transport_stats();
    auto m1 = ferry::map_peer_segment(owner, token, 7, seg->size(), std::chrono::seconds(5));
    auto m2 = ferry::map_peer_segment(owner, token, 7, seg->size(), std::chrono::seconds(5));
    const auto after = ferry::transport_stats();
    if (m1 != m2) throw std::runtime_error("the second lookup mapped again");
    if (after.fds_fetched - before.fds_fetched != 1) throw std::runtime_error("fetched twice");
    // A fresh mapping of the same memory, not the one inherited by fork.
    if (m1->data() == seg->data()) throw std::runtime_error("reused the inherited mapping");
    if (std::string(reinterpret_cast<const char*>(m1->data())) != "owner's bytes") {
      throw std::runtime_error("wrong bytes");
    }
    try {
      ferry::map_peer_segment(owner, token, 8, 0, std::chrono::seconds(5));
      throw std::runtime_error("an unknown segment was handed over");
    } catch (const Error& e) {
      if (e.code() != Errc::fd_transfer) throw;
    }
  });
  ferry::withdraw_segment(7);
}

TEST_CASE("fetching from an owner that exited says so", "[segment]") {
  const pid_t gone = ferry::test::fork_child([] {});
  REQUIRE(ferry::test::wait_child(gone) == 0);
  try {
    ferry::fetch_segment_fd(gone, 12345, 1, std::chrono::seconds(2));
    FAIL("no error");
  } catch (const Error& e) {
    REQUIRE(e.code() == Errc::peer_dead);
    REQUIRE_THAT(e.what(), Catch::Contains(std::to_string(gone)));
  }
}

TEST_CASE("a full /dev/shm is an error naming sizes and the remedy, never SIGBUS",
          "[segment][tmpfs]") {
  ferry::test::in_child([] {
    const std::string dir = ferry::test::private_tmpfs(16 << 20);
    auto fits = Segment::create(12 << 20, dir);
    std::memset(fits->data(), 0xab, fits->size());  // every page really is there
    try {
      Segment::create(8 << 20, dir);
      throw std::runtime_error("8 MiB fit into 4 MiB of free space");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (e.code() != Errc::shm_exhausted) throw;
      for (const char* needle : {"8.0 MiB", "8388608 bytes", "4.0 MiB free", "--shm-size",
                                 "--ipc=host", "FERRY_SHM_DIR"}) {
        if (what.find(needle) == std::string::npos) {
          throw std::runtime_error("message lacks '" + std::string(needle) + "': " + what);
        }
      }
    }
    fits.reset();
    Segment::create(12 << 20, dir);  // the space came back
  });
}

TEST_CASE("a segment in an unusable directory names it", "[segment]") {
  try {
    Segment::create(4096, "/nonexistent-ferry-dir");
    FAIL("no error");
  } catch (const Error& e) {
    REQUIRE(e.code() == Errc::shm_failed);
    REQUIRE_THAT(e.what(), Catch::Contains("/nonexistent-ferry-dir"));
    REQUIRE_THAT(e.what(), Catch::Contains("FERRY_SHM_DIR"));
  }
}

TEST_CASE("attaching checks the size the record claims", "[segment]") {
  auto seg = Segment::create(8192);
  REQUIRE_THROWS_AS(Segment::attach(ferry::UniqueFd(::dup(seg->fd())), 4096), Error);
  auto again = Segment::attach(ferry::UniqueFd(::dup(seg->fd())), 8192);
  REQUIRE(again->size() == 8192);
  REQUIRE(again->fd() == -1);
}
