// The census and clean-up of /dev/shm, against real processes: segments planted in a private
// container (pid and mount namespaces, a small tmpfs at /dev/shm) whose named owners are dead
// (forked, exited and reaped), next to ones that live processes hold open, map, or name.
#include "ipc/diag/shm_census.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include "../../catch.hpp"

#include <algorithm>
#include <ctime>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../test_util.hpp"
#include "ipc/segment.hpp"

namespace {

using ferry::SegmentState;
using ferry::ShmSegment;

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// A pid that surely names no process: a child that exited and was reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// A file of `bytes` really allocated in the tmpfs, as a crashed job would leave it.
void plant(const std::string& name, std::size_t bytes) {
  const std::string path = "/dev/shm/" + name;
  const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  expect(fd >= 0, "cannot create " + path);
  expect(::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0, "fallocate " + path);
  ::close(fd);
}

bool present(const std::string& name) {
  struct stat st {};
  return ::stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

const ShmSegment& find(const ferry::ShmCensus& c, const std::string& name) {
  for (const auto& s : c.segments) {
    if (s.name == name) return s;
  }
  throw std::runtime_error("the census missed " + name);
}

void expect_state(const ferry::ShmCensus& c, const std::string& name, SegmentState want) {
  const ShmSegment& s = find(c, name);
  expect(s.state == want, name + " is " + ferry::segment_state_name(s.state) + ", expected " +
                              ferry::segment_state_name(want) + " (" + s.reason + ")");
}

// A child that runs `hold` and then waits to be killed; returns once `hold` has run.
pid_t holder(const std::function<void()>& hold) {
  int ready[2];
  expect(::pipe(ready) == 0, "pipe");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    hold();
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(3);  // never; glibc wants it checked
    for (;;) ::pause();
  }
  char c = 0;
  expect(::read(ready[0], &c, 1) == 1, "holder did not start");
  ::close(ready[0]);
  ::close(ready[1]);
  return pid;
}

// The leftovers of a crashed job next to segments still in use, each case once.
struct Planted {
  pid_t dead = 0, alive = 0;
  std::string orphan_ferry, orphan_torch, torch_alive, held, mapped;
  std::vector<pid_t> children;
};

Planted plant_mix() {
  Planted p;
  p.dead = dead_pid();
  p.orphan_ferry = "ferry-" + std::to_string(p.dead) + "-0";
  p.orphan_torch = "torch_" + std::to_string(p.dead) + "_1804289383_0";
  p.held = "ferry-" + std::to_string(p.dead) + "-1";
  p.mapped = "torch_" + std::to_string(p.dead) + "_846930886";
  plant(p.orphan_ferry, 1 << 20);
  plant(p.orphan_torch, 2 << 20);
  plant(p.held, 1 << 20);
  plant(p.mapped, 1 << 20);
  // Named after a live process that holds nothing (PyTorch's file_system strategy between two
  // messages): alive by its name alone.
  p.alive = holder([] {});
  p.torch_alive = "torch_" + std::to_string(p.alive) + "_42";
  plant(p.torch_alive, 64 << 10);
  p.children.push_back(p.alive);
  // Held open by a live process, though its creator is dead.
  const std::string held_path = "/dev/shm/" + p.held;
  p.children.push_back(holder([held_path] { (void)::open(held_path.c_str(), O_RDWR); }));
  // Only mapped: the fd was closed after mmap, as receivers do.
  const std::string mapped_path = "/dev/shm/" + p.mapped;
  p.children.push_back(holder([mapped_path] {
    const int fd = ::open(mapped_path.c_str(), O_RDWR);
    void* m = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) ::_exit(5);
  }));
  return p;
}

}  // namespace

TEST_CASE("the census tells orphaned segments from live ones, named or not", "[shm][census]") {
  ferry::test::in_child([] {
    ferry::test::run_in_private_container(32 << 20, [] {
      const Planted p = plant_mix();
      plant("sem.other", 4096);
      // ferry's own segments, found only through this process's fds: an O_TMPFILE file, nameless
      // in the directory, and a memfd, in none.
      auto seg = ferry::Segment::create(3 << 20, ferry::SegmentPlace::in_dir("/dev/shm"));
      auto memfd = ferry::Segment::create(
          5 << 20, ferry::SegmentPlace{ferry::SegmentBacking::memfd, "/dev/shm"});
      // PyTorch's file_descriptor strategy: named, unlinked at once, held by fd.
      const std::string unlinked = "torch_" + std::to_string(::getpid()) + "_7_0";
      const int ufd = ::open(("/dev/shm/" + unlinked).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
      expect(ufd >= 0 && ::ftruncate(ufd, 8192) == 0, "unlinked torch segment");
      ::unlink(("/dev/shm/" + unlinked).c_str());

      const ferry::ShmCensus c = ferry::take_shm_census("/dev/shm");
      expect(c.unreadable.empty(), "as root in its own container, every process is readable");
      expect_state(c, p.orphan_ferry, SegmentState::orphaned);
      expect_state(c, p.orphan_torch, SegmentState::orphaned);
      expect_state(c, p.torch_alive, SegmentState::live);
      expect_state(c, p.held, SegmentState::live);
      expect_state(c, p.mapped, SegmentState::live);
      expect_state(c, "sem.other", SegmentState::unknown);

      const ShmSegment& o = find(c, p.orphan_torch);
      expect(o.kind == "torch" && o.named && o.name_pid == p.dead, "orphan's kind, name pid");
      expect(o.size == (2u << 20) && o.allocated == (2u << 20), "orphan's size");
      expect(o.holders.empty(), "orphan has holders");
      expect(o.reason.find(std::to_string(p.dead)) != std::string::npos, "reason names the pid");
      expect(find(c, p.held).holders == std::vector<pid_t>{p.children[1]}, "holder by fd");
      expect(find(c, p.mapped).holders == std::vector<pid_t>{p.children[2]}, "holder by map");
      expect(find(c, "sem.other").kind == "other", "a foreign name is 'other'");

      const ShmSegment& u = find(c, unlinked);
      expect(!u.named && u.kind == "torch" && u.state == SegmentState::live && u.size == 8192,
             "unlinked torch segment held by fd");
      bool found_ours = false;
      for (const auto& s : c.segments) {
        if (!s.named && s.name[0] == '#' && s.size == seg->size()) {
          expect(s.kind == "ferry" && s.state == SegmentState::live &&
                     s.holders == std::vector<pid_t>{::getpid()},
                 "ferry's nameless segment: " + s.kind + ", " + s.reason);
          found_ours = true;
        }
      }
      expect(found_ours, "the census missed this process's nameless segment");
      // Every memfd has that name (this process may hold others, its children some of them).
      bool found_memfd = false;
      for (const auto& s : c.segments) {
        if (s.memfd && s.size == memfd->size()) {
          expect(s.name == "memfd:ferry-segment" && !s.named && s.kind == "ferry" &&
                     s.state == SegmentState::live && s.holders == std::vector<pid_t>{::getpid()},
                 "ferry's memfd: " + s.name + ", " + s.kind + ", " + s.reason);
          found_memfd = true;
        }
      }
      expect(found_memfd, "the census missed this process's memfd");
      ::close(ufd);
    });
  });
}

TEST_CASE("clean removes orphans only, honouring --dry-run and --older-than", "[shm][census]") {
  ferry::test::in_child([] {
    ferry::test::run_in_private_container(32 << 20, [] {
      const Planted p = plant_mix();
      const std::vector<std::string> live = {p.torch_alive, p.held, p.mapped};

      ferry::ShmCleanOptions dry;
      dry.dry_run = true;
      ferry::ShmCleanResult r = ferry::clean_shm(dry);
      expect(r.removed.size() == 2 && r.bytes_freed == (3u << 20), "dry run lists the 2 orphans");
      expect(present(p.orphan_ferry) && present(p.orphan_torch), "a dry run removed something");

      // Fresh files are younger than an hour: --older-than 1h holds both back, until one of
      // them is made old.
      ferry::ShmCleanOptions aged;
      aged.older_than = std::chrono::hours(1);
      r = ferry::clean_shm(aged);
      expect(r.removed.empty() && present(p.orphan_ferry), "--older-than removed a fresh file");
      const struct timespec two_hours_ago[2] = {{std::time(nullptr) - 7200, 0},
                                                {std::time(nullptr) - 7200, 0}};
      expect(::utimensat(AT_FDCWD, ("/dev/shm/" + p.orphan_torch).c_str(), two_hours_ago, 0) == 0,
             "utimensat");
      r = ferry::clean_shm(aged);
      expect(r.removed.size() == 1 && r.removed[0].name == p.orphan_torch &&
                 r.bytes_freed == (2u << 20),
             "--older-than 1h removed the wrong set");
      expect(!present(p.orphan_torch) && present(p.orphan_ferry), "--older-than 1h");

      r = ferry::clean_shm({});
      expect(r.removed.size() == 1 && r.removed[0].name == p.orphan_ferry && r.errors.empty(),
             "the last orphan was not removed");
      for (const auto& name : live) expect(present(name), "clean removed live " + name);

      // Once the holders are gone, what they kept is an orphan too.
      for (pid_t c : p.children) {
        ::kill(c, SIGKILL);
        ::waitpid(c, nullptr, 0);
      }
      r = ferry::clean_shm({});
      expect(r.removed.size() == 3, "after the holders died, their 3 segments are orphans");
      for (const auto& name : live) expect(!present(name), name + " outlived its holders");
    });
  });
}

TEST_CASE("what cannot be inspected is unknown, never orphaned", "[shm][census]") {
  ferry::test::in_child([] {
    ferry::test::run_in_private_container(8 << 20, [] {
      const std::string orphan = "ferry-" + std::to_string(dead_pid()) + "-0";
      plant(orphan, 4096);
      // An unprivileged user cannot read root's /proc/<pid>/fd: this process (pid 1, root)
      // might hold the root-owned file, so nobody can call it orphaned.
      const int code = ferry::test::wait_child(ferry::test::fork_child([&] {
        expect(::setgid(65534) == 0 && ::setuid(65534) == 0, "cannot drop to nobody");
        const ferry::ShmCensus c = ferry::take_shm_census("/dev/shm");
        expect(std::find(c.unreadable.begin(), c.unreadable.end(), 1) != c.unreadable.end(),
               "pid 1 should be unreadable to nobody");
        expect_state(c, orphan, SegmentState::unknown);
        expect(find(c, orphan).reason.find("could not be read") != std::string::npos,
               "the reason says what could not be read: " + find(c, orphan).reason);
        expect(ferry::clean_shm({}).removed.empty(), "clean removed an unknown segment");
      }));
      expect(code == 0, "the unprivileged census failed");
      expect(present(orphan), "the unknown segment was removed");
      expect_state(ferry::take_shm_census("/dev/shm"), orphan, SegmentState::orphaned);
    });
  });
}

TEST_CASE("a process root may not read: the real reason, and force removes dead owners' only",
          "[shm][census]") {
  ferry::test::in_child([] {
    ferry::test::run_in_private_container(32 << 20, [] {
      // As in a docker container: root, but no process has CAP_SYS_PTRACE.
      ferry::test::drop_cap_sys_ptrace();
      const Planted p = plant_mix();
      const pid_t undumpable = holder([] {
        ::prctl(PR_SET_NAME, "undumpable");
        ::prctl(PR_SET_DUMPABLE, 0);
      });
      const std::string who = "pid " + std::to_string(undumpable) + " (undumpable";

      const ferry::ShmCensus c = ferry::take_shm_census("/dev/shm");
      expect(c.unreadable == std::vector<pid_t>{undumpable}, "only the undumpable one is unread");
      for (const std::string& needle :
           {who, std::string("even as root"), std::string("not dumpable"),
            std::string("CAP_SYS_PTRACE")}) {
        expect(c.unreadable_reason.find(needle) != std::string::npos,
               "the census's reason lacks '" + needle + "': " + c.unreadable_reason);
      }
      expect(c.unreadable_reason.find("run as root") == std::string::npos,
             "root is told to run as root: " + c.unreadable_reason);
      for (const auto& name : {p.orphan_ferry, p.orphan_torch}) {
        expect_state(c, name, SegmentState::unknown);
        const ShmSegment& s = find(c, name);
        expect(s.force_removable && s.reason.find(who) != std::string::npos &&
                   s.reason.find("clean --force") != std::string::npos,
               name + ": " + s.reason);
      }
      for (const auto& name : {p.torch_alive, p.held, p.mapped}) {
        expect_state(c, name, SegmentState::live);
        expect(!find(c, name).force_removable, name + " is force-removable");
      }

      ferry::ShmCleanResult r = ferry::clean_shm({});
      expect(r.removed.empty() && r.kept.size() == 2, "clean without force removed something");
      expect(present(p.orphan_ferry) && present(p.orphan_torch), "an unknown segment went");

      ferry::ShmCleanOptions force;
      force.force = true;
      r = ferry::clean_shm(force);
      std::vector<std::string> removed;
      for (const auto& s : r.removed) removed.push_back(s.name);
      std::sort(removed.begin(), removed.end());
      std::vector<std::string> orphans = {p.orphan_ferry, p.orphan_torch};
      std::sort(orphans.begin(), orphans.end());
      expect(removed == orphans && r.errors.empty() && r.kept.empty(),
             "force removed other than the two dead creators' segments");
      for (const auto& name : {p.torch_alive, p.held, p.mapped}) {
        expect(present(name), "force removed live " + name);
      }
      expect(::kill(undumpable, 0) == 0, "the unreadable process was disturbed");
    });
  });
}

TEST_CASE("the census JSON follows its documented schema", "[shm][census]") {
  ferry::test::in_child([] {
    ferry::test::run_in_private_container(8 << 20, [] {
      plant("ferry-" + std::to_string(dead_pid()) + "-3", 8192);
      plant("sem.x", 4096);
      auto seg = ferry::Segment::create(64 << 10, ferry::SegmentPlace::in_dir("/dev/shm"));
      auto memfd = ferry::Segment::create(
          64 << 10, ferry::SegmentPlace{ferry::SegmentBacking::memfd, "/dev/shm"});
      const ferry::ShmCensus c = ferry::take_shm_census("/dev/shm");
      const auto doc = nlohmann::json::parse(ferry::to_json(c));
      expect(doc.at("schema") == "ferry-shm-ls/1" && doc.at("dir").is_string() &&
                 doc.at("hidepid").is_boolean() && doc.at("unreadable_pids").is_array(),
             "top-level keys");
      const auto& segs = doc.at("segments");
      // ferry's two in the directory, 'other' left out; and its memfds (this one at least).
      const auto memfds = std::count_if(
          segs.begin(), segs.end(), [](const nlohmann::json& s) { return s.at("memfd") == true; });
      expect(segs.is_array() && segs.size() - static_cast<std::size_t>(memfds) == 2 && memfds >= 1,
             "ferry's segments: " + segs.dump());
      for (const auto& s : segs) {
        for (const char* k : {"name", "kind", "state", "reason"}) {
          expect(s.at(k).is_string(), std::string(k) + " is a string");
        }
        for (const char* k : {"size_bytes", "allocated_bytes", "inode", "uid"}) {
          expect(s.at(k).is_number_unsigned(), std::string(k) + " is unsigned");
        }
        expect(s.at("mtime").is_number_integer() && s.at("named").is_boolean() &&
                   s.at("memfd").is_boolean() && s.at("holders").is_array() &&
                   (s.at("name_pid").is_null() || s.at("name_pid").is_number_integer()),
               "mtime, named, memfd, holders, name_pid");
        const std::string state = s.at("state");
        expect(state == "live" || state == "orphaned" || state == "unknown", "state " + state);
      }
      const auto& t = doc.at("totals");
      expect(t.at("segments") == segs.size() && t.at("orphaned") == 1 &&
                 t.at("orphaned_bytes") == 8192,
             "totals: " + t.dump());
      expect(
          nlohmann::json::parse(ferry::to_json(c, true)).at("segments").size() == segs.size() + 1,
          "include_other lists sem.x too");
    });
  });
}
