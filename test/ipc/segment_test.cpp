#include "ipc/segment.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/statvfs.h>

#include "../catch.hpp"

#include <cstring>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
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
using ferry::SegmentBacking;
using ferry::SegmentPlace;

namespace {

// Throws unless `what` says each of `needles`.
void require_mentions(const std::string& what, std::initializer_list<const char*> needles) {
  for (const char* needle : needles) {
    if (what.find(needle) == std::string::npos) {
      throw std::runtime_error("message lacks '" + std::string(needle) + "': " + what);
    }
  }
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
  const SegmentPlace place =
      GENERATE(SegmentPlace{SegmentBacking::memfd, "/dev/shm"}, SegmentPlace::in_dir("/dev/shm"));
  INFO("backing " << ferry::backing_name(place.backing));
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ferry::test::fork_child([&] {
    auto a = Segment::create(8 << 20, place);
    auto b = Segment::create(1 << 20, place);
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
  REQUIRE(ferry::test::shm_names_of({child}).empty());
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
    const SegmentPlace dir = SegmentPlace::in_dir(ferry::test::private_tmpfs(16 << 20));
    auto fits = Segment::create(12 << 20, dir);
    std::memset(fits->data(), 0xab, fits->size());  // every page really is there
    try {
      Segment::create(8 << 20, dir);
      throw std::runtime_error("8 MiB fit into 4 MiB of free space");
    } catch (const Error& e) {
      if (e.code() != Errc::shm_exhausted) throw;
      require_mentions(e.what(), {"8.0 MiB", "8388608 bytes", "4.0 MiB free", "--shm-size",
                                  "--ipc=host", "FERRY_SHM_DIR"});
    }
    fits.reset();
    Segment::create(12 << 20, dir);  // the space came back
  });
}

TEST_CASE("memfd segments are not bounded by a small /dev/shm", "[segment][tmpfs]") {
  ferry::test::in_child([] {
    ferry::test::private_tmpfs(16 << 20, ferry::test::SegmentsIn::memfd);
    const SegmentPlace place = ferry::default_segment_place();
    if (place.backing != SegmentBacking::memfd) {
      throw std::runtime_error("the default place is not a memfd where memfd_create works");
    }
    auto big = Segment::create(48 << 20);  // three times the 16 MiB /dev/shm
    std::memset(big->data(), 0xab, big->size());
    struct statvfs vfs {};
    if (::statvfs("/dev/shm", &vfs) != 0 || vfs.f_bfree != vfs.f_blocks) {
      throw std::runtime_error("a memfd segment took room in /dev/shm");
    }
    char link[64], target[256] = {};
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", big->fd());
    if (::readlink(link, target, sizeof target - 1) <= 0 ||
        std::string(target).rfind("/memfd:ferry-segment", 0) != 0) {
      throw std::runtime_error(std::string("not a ferry memfd: ") + target);
    }
  });
}

TEST_CASE("a memfd segment is sealed: no peer can shrink or grow it under the others' mappings",
          "[segment]") {
  auto seg = Segment::create(1 << 20, SegmentPlace{SegmentBacking::memfd, "/dev/shm"});
  errno = 0;
  CHECK(::ftruncate(seg->fd(), 4096) == -1);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(seg->fd(), 4 << 20) == -1);
  CHECK(::fcntl(seg->fd(), F_ADD_SEALS, 0) == -1);  // and the seals cannot be changed
  // A peer that attaches sees the whole size and maps it.
  auto peer = Segment::attach(ferry::UniqueFd(::dup(seg->fd())), 1 << 20);
  peer->data()[(1 << 20) - 1] = std::byte{7};
  CHECK(seg->data()[(1 << 20) - 1] == std::byte{7});
}

TEST_CASE("a segment past the memory cgroup's limit is refused with the numbers, not OOM-killed",
          "[segment][cgroup]") {
  const SegmentPlace place =
      GENERATE(SegmentPlace{SegmentBacking::memfd, "/dev/shm"}, SegmentPlace::in_dir("/dev/shm"));
  INFO("backing " << ferry::backing_name(place.backing));
  ferry::test::in_memory_cgroup(48 << 20, [&] {
    auto fits = Segment::create(8 << 20, place);
    std::memset(fits->data(), 1, fits->size());
    try {
      Segment::create(128 << 20, place);
      throw std::runtime_error("128 MiB fit a 48 MiB cgroup");
    } catch (const Error& e) {
      if (e.code() != Errc::shm_exhausted) throw;
      require_mentions(e.what(), {"128.0 MiB", "134217728 bytes", "memory cgroup has",
                                  "48.0 MiB limit", "--memory="});
    }
  });
}

TEST_CASE("where segments go: one rule, a case each", "[segment][place]") {
  using ferry::choose_backing;
  SECTION("auto takes a memfd where the kernel allows it") {
    CHECK(choose_backing("auto", false, true) == SegmentBacking::memfd);
    CHECK(choose_backing("", false, true) == SegmentBacking::memfd);
  }
  SECTION("auto takes the directory someone named (FERRY_SHM_DIR)") {
    CHECK(choose_backing("auto", true, true) == SegmentBacking::dir);
  }
  SECTION("auto falls back to the directory where memfd_create is refused") {
    CHECK(choose_backing("auto", false, false) == SegmentBacking::dir);
  }
  SECTION("dir is always the directory") {
    CHECK(choose_backing("dir", false, true) == SegmentBacking::dir);
  }
  SECTION("memfd is a memfd, even with a directory named") {
    CHECK(choose_backing("memfd", true, true) == SegmentBacking::memfd);
  }
  SECTION("memfd where it is refused is an error with the remedy") {
    try {
      choose_backing("memfd", false, false);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::shm_failed);
      CHECK_THAT(e.what(),
                 Catch::Contains("memfd_create") && Catch::Contains("unset FERRY_SHM_BACKING"));
    }
  }
  SECTION("anything else names the value and what is accepted") {
    REQUIRE_THROWS_WITH(choose_backing("tmpfs", false, true),
                        Catch::Contains("'tmpfs'") && Catch::Contains("auto, memfd or dir"));
  }
}

TEST_CASE("the place comes from FERRY_SHM_BACKING and FERRY_SHM_DIR", "[segment][place]") {
  ferry::test::in_child([] {
    ::unsetenv("FERRY_SHM_DIR");
    ::unsetenv("FERRY_SHM_BACKING");
    const bool memfd = ferry::memfd_works();
    SegmentPlace p = ferry::default_segment_place();
    if (p.backing != (memfd ? SegmentBacking::memfd : SegmentBacking::dir) || p.dir != "/dev/shm") {
      throw std::runtime_error("default place: " + p.describe());
    }
    ::setenv("FERRY_SHM_DIR", "/tmp", 1);
    p = ferry::default_segment_place();
    if (p.backing != SegmentBacking::dir || p.dir != "/tmp") {
      throw std::runtime_error("FERRY_SHM_DIR=/tmp: " + p.describe());
    }
    ::setenv("FERRY_SHM_BACKING", "DIR", 1);  // any case
    ::unsetenv("FERRY_SHM_DIR");
    if (ferry::default_segment_place().backing != SegmentBacking::dir) {
      throw std::runtime_error("FERRY_SHM_BACKING=DIR");
    }
    ::setenv("FERRY_SHM_BACKING", "shm", 1);
    try {
      ferry::default_segment_place();
      throw std::runtime_error("FERRY_SHM_BACKING=shm accepted");
    } catch (const Error& e) {
      if (e.code() != Errc::invalid_argument ||
          std::string(e.what()).find("FERRY_SHM_BACKING") == std::string::npos) {
        throw;
      }
    }
  });
}

TEST_CASE("a segment in an unusable directory names it", "[segment]") {
  try {
    Segment::create(4096, SegmentPlace::in_dir("/nonexistent-ferry-dir"));
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
