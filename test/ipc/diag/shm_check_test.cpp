// check_shm() under real, controlled conditions: a private small tmpfs at /dev/shm (a mount
// namespace), a lowered RLIMIT_NOFILE, a missing directory, and the FERRY_* variables.
#include "ipc/diag/shm_check.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <nlohmann/json.hpp>
#include "../../catch.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../../test_util.hpp"
#include "ipc/error.hpp"
#include "ipc/ledger.hpp"

namespace {

using ferry::Verdict;

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void expect_has(const std::string& text, const std::string& needle) {
  expect(text.find(needle) != std::string::npos, "'" + needle + "' missing from: " + text);
}

// The name by value: GCC 13 on takes a reference returned by a function that was handed a
// temporary (`item(r, "shm_dir")` made a std::string) for one into it (-Wdangling-reference).
const ferry::CheckItem& item(const ferry::ShmReport& r, std::string_view name) {
  const ferry::CheckItem* i = r.item(std::string(name));
  if (!i) throw std::runtime_error("no item " + std::string(name));
  return *i;
}

std::string verdict_of(const ferry::ShmReport& r, const std::string& name) {
  return ferry::verdict_name(item(r, name).verdict);
}

std::size_t entries(const std::string& dir) {
  std::size_t n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

ferry::ShmCheckOptions options(std::uint64_t need, const std::string& dir = "/dev/shm") {
  ferry::ShmCheckOptions o;
  o.dir = dir;
  o.need_bytes = need;
  o.workers = 2;
  return o;
}

}  // namespace

TEST_CASE("a memory cgroup with less room than the need fails before anything is reserved",
          "[shm][check][cgroup]") {
  ferry::test::in_memory_cgroup(48 << 20, [&] {
    const std::string dir = ferry::test::private_tmpfs(512 << 20);
    ferry::ShmReport r = ferry::check_shm(options(256 << 20, dir));
    const ferry::CheckItem& m = item(r, "memory_cgroup");
    expect(m.verdict == Verdict::fail, "256 MiB fit a 48 MiB cgroup: " + m.summary);
    expect_has(m.summary, "memory limit 48.0 MiB");
    expect_has(m.remedy, "--memory=");
    expect(std::get<std::uint64_t>(*m.value("limit_bytes")) == (48u << 20), "limit_bytes");
    const ferry::CheckItem& reserve = item(r, "shm_reserve");
    expect(reserve.verdict == Verdict::fail, "shm_reserve should fail too");
    expect_has(reserve.summary, "not attempted");
    // What fits is reserved for real, and charged to the cgroup meanwhile.
    r = ferry::check_shm(options(8 << 20, dir));
    expect(verdict_of(r, "memory_cgroup") == "ok", item(r, "memory_cgroup").summary);
    expect(verdict_of(r, "shm_reserve") == "ok", item(r, "shm_reserve").summary);
  });
}

TEST_CASE("with memfd segments the memory cgroup is the limit that applies, not /dev/shm",
          "[shm][check][cgroup]") {
  ferry::test::in_memory_cgroup(48 << 20, [&] {
    // A container's 16 MiB /dev/shm: with memfds it bounds nothing of ferry's.
    ferry::test::private_tmpfs(16 << 20, ferry::test::SegmentsIn::memfd);
    ferry::ShmCheckOptions o;  // no dir: the job's own place
    o.need_bytes = 32 << 20;
    o.workers = 2;
    ferry::ShmReport r = ferry::check_shm(o);
    expect(r.backing == "memfd", "backing " + r.backing);
    expect(verdict_of(r, "shm_dir") == "ok", item(r, "shm_dir").summary);
    expect_has(item(r, "shm_dir").summary, "segments are memfds");
    expect(verdict_of(r, "shm_reserve") == "ok", item(r, "shm_reserve").summary);
    expect_has(item(r, "shm_reserve").summary, "32.0 MiB in a memfd");
    // Past the cgroup's room: refused before anything is reserved, the cgroup named.
    o.need_bytes = 64 << 20;
    r = ferry::check_shm(o);
    expect(verdict_of(r, "memory_cgroup") == "fail", item(r, "memory_cgroup").summary);
    expect(verdict_of(r, "shm_reserve") == "fail", item(r, "shm_reserve").summary);
    expect_has(item(r, "shm_reserve").summary, "the memory cgroup has left");
    expect(verdict_of(r, "shm_dir") == "ok", "the 16 MiB /dev/shm is not what failed");
  });
}

TEST_CASE("a reservation that does not fit fails with the numbers and the remedy, never SIGBUS",
          "[shm][check][tmpfs]") {
  ferry::test::in_child([] {
    const std::string dir = ferry::test::private_tmpfs(16 << 20);
    const ferry::ShmReport r = ferry::check_shm(options(32 << 20, dir));
    const ferry::CheckItem& reserve = item(r, "shm_reserve");
    expect(reserve.verdict == Verdict::fail, "32 MiB fit into 16 MiB: " + reserve.summary);
    expect_has(reserve.summary, "32.0 MiB");
    expect_has(reserve.summary, "33554432 bytes");
    expect_has(reserve.summary, "16.0 MiB free");
    for (const char* fix : {"--shm-size=1g", "--ipc=host", "emptyDir", "FERRY_SHM_DIR"}) {
      expect_has(reserve.remedy, fix);
    }
    expect(std::get<bool>(*reserve.value("reserved")) == false, "reserved says true");
    expect(r.exit_code() == 2 && r.overall() == Verdict::fail, "a failure must exit 2");
    const ferry::CheckItem& d = item(r, "shm_dir");
    expect(d.verdict == Verdict::warn, "a 16 MiB tmpfs for a 32 MiB job is not ok");
    expect(std::get<std::uint64_t>(*d.value("size_bytes")) == (16u << 20), "size_bytes");
    expect(std::get<bool>(*d.value("tmpfs")), "a tmpfs not recognised");
    expect(entries(dir) == 0, "the probe left a file behind");
  });
}

TEST_CASE("a reservation that fits is measured and released", "[shm][check][tmpfs]") {
  ferry::test::in_child([] {
    const std::string dir = ferry::test::private_tmpfs(16 << 20);
    const ferry::ShmReport r = ferry::check_shm(options(12 << 20, dir));
    expect(verdict_of(r, "shm_reserve") == "ok", item(r, "shm_reserve").summary);
    expect(verdict_of(r, "shm_dir") == "ok", item(r, "shm_dir").summary);
    expect(std::get<bool>(*item(r, "shm_reserve").value("reserved")), "not reserved");
    struct statvfs vfs {};
    expect(::statvfs(dir.c_str(), &vfs) == 0 && vfs.f_bfree == vfs.f_blocks,
           "the reservation was not released");
    expect(r.exit_code() == static_cast<int>(r.overall()), "exit code is the worst verdict");
    // Without reserving, the same answer comes from the free space alone.
    auto est = options(24 << 20, dir);
    est.reserve = false;
    const ferry::ShmReport e = ferry::check_shm(est);
    expect(verdict_of(e, "shm_reserve") == "fail", "24 MiB estimated to fit in 16 MiB");
    expect_has(item(e, "shm_reserve").summary, "estimate");
  });
}

TEST_CASE("a container's default 64 MiB /dev/shm is named as such", "[shm][check][tmpfs]") {
  ferry::test::in_child([] {
    const std::string dir = ferry::test::private_tmpfs(64 << 20);
    const ferry::ShmReport r = ferry::check_shm(options(4 << 20, dir));
    const ferry::CheckItem& d = item(r, "shm_dir");
    const std::string container = std::get<std::string>(*d.value("container"));
    if (container.empty()) {
      // Outside a container 64 MiB is just a size, and 4 MiB fits.
      expect(d.verdict == Verdict::ok, "outside a container: " + d.summary);
    } else {
      expect(d.verdict == Verdict::warn, "in a " + container + " container: " + d.summary);
      expect_has(d.summary, "container default");
      expect_has(d.remedy, "--shm-size=");
      expect_has(d.remedy, "--ipc=host");
    }
    expect(verdict_of(r, "shm_reserve") == "ok", item(r, "shm_reserve").summary);
  });
}

TEST_CASE("a missing shm directory fails, and nothing is reserved", "[shm][check]") {
  const ferry::ShmReport r = ferry::check_shm(options(1 << 20, "/nonexistent/ferry-shm-check"));
  CHECK(verdict_of(r, "shm_dir") == "fail");
  CHECK_THAT(item(r, "shm_dir").summary, Catch::Contains("No such file or directory"));
  CHECK_THAT(item(r, "shm_dir").remedy, Catch::Contains("FERRY_SHM_DIR"));
  CHECK(verdict_of(r, "shm_reserve") == "fail");
  CHECK_THAT(item(r, "shm_reserve").summary, Catch::Contains("not attempted"));
  CHECK(r.exit_code() == 2);
}

TEST_CASE("a lowered RLIMIT_NOFILE warns when the hard limit allows more, else fails",
          "[shm][check][rlimit]") {
  ferry::test::in_child([] {
    struct rlimit rl {};
    expect(::getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit");
    const std::uint64_t need = ferry::fds_needed(2, 1 << 20);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
      std::fprintf(stderr, "SKIP: the hard fd limit is already below %llu\n",
                   static_cast<unsigned long long>(need));
      ::_exit(ferry::test::kSkip);
    }
    rl.rlim_cur = 16;
    expect(::setrlimit(RLIMIT_NOFILE, &rl) == 0, "lower the soft limit");
    ferry::ShmReport r = ferry::check_shm(options(1 << 20));
    const ferry::CheckItem& soft = item(r, "open_files");
    expect(soft.verdict == Verdict::warn, "soft limit 16: " + soft.summary);
    expect_has(soft.summary, "soft 16");
    expect_has(soft.summary, std::to_string(need));
    expect_has(soft.remedy, "ulimit -n");
    expect(std::get<std::uint64_t>(*soft.value("needed")) == need, "needed");
    expect(r.exit_code() >= 1, "a warning exits 1 at least");

    rl.rlim_max = 16;
    expect(::setrlimit(RLIMIT_NOFILE, &rl) == 0, "lower the hard limit");
    r = ferry::check_shm(options(1 << 20));
    const ferry::CheckItem& hard = item(r, "open_files");
    expect(hard.verdict == Verdict::fail, "hard limit 16: " + hard.summary);
    expect_has(hard.summary, "hard 16");
    expect_has(hard.remedy, "--ulimit nofile=" + std::to_string(need));
    expect(r.exit_code() == 2, "a failure exits 2");
  });
}

TEST_CASE("the default need follows the arena's variables and the worker count", "[shm][check]") {
  ferry::test::in_child([] {
    ::setenv("FERRY_ARENA_SEGMENT_MB", "8", 1);
    ::setenv("FERRY_LEASE_SLOTS", "1000", 1);
    const std::uint64_t per_process = (8u << 20) + ferry::Ledger::segment_bytes(1000);
    expect(per_process == (8u << 20) + 64 + 8000, "ledger size formula");
    expect(ferry::default_shm_need(3) == 4 * per_process, "(workers + 1) * (segment + ledger)");
    // 32 + 8 per worker + one fd per 8 MiB segment of the need.
    expect(ferry::fds_needed(3, 20 << 20) == 32 + 24 + 3, "fds_needed formula");
    ferry::ShmCheckOptions o;
    o.workers = 3;
    o.reserve = false;
    expect(ferry::check_shm(o).need_bytes == 4 * per_process, "check_shm's default need");
    ::setenv("FERRY_ARENA_SEGMENT_MB", "lots", 1);
    try {
      ferry::default_shm_need(1);
      throw std::runtime_error("a malformed FERRY_ARENA_SEGMENT_MB was accepted");
    } catch (const ferry::Error& e) {
      expect(e.code() == ferry::Errc::invalid_argument, "wrong error code");
      expect_has(e.what(), "FERRY_ARENA_SEGMENT_MB='lots'");
    }
  });
}

TEST_CASE("the check's JSON follows its documented schema", "[shm][check]") {
  // In a child: the CUDA probe creates a context, after which this process should not fork.
  ferry::test::in_child([] {
    const std::string dir = ferry::test::private_tmpfs(16 << 20);
    auto o = options(1 << 20, dir);
    o.cuda = true;
    const ferry::ShmReport r = ferry::check_shm(o);
    const auto doc = nlohmann::json::parse(ferry::to_json(r));
    expect(doc.at("schema") == "ferry-shm-check/1" && doc.at("dir") == dir, "schema, dir");
    expect(doc.at("need_bytes") == (1u << 20) && doc.at("workers") == 2, "need_bytes, workers");
    expect(doc.at("fds_needed").is_number_unsigned(), "fds_needed");
    const std::set<std::string> verdicts = {"ok", "warn", "fail"};
    expect(verdicts.count(doc.at("verdict").get<std::string>()) == 1, "verdict");
    expect(doc.at("exit_code") == r.exit_code(), "exit_code");
    std::set<std::string> names;
    for (const auto& c : doc.at("checks")) {
      expect(c.at("name").is_string() && c.at("summary").is_string() &&
                 c.at("remedy").is_string() && c.at("values").is_object(),
             "check fields: " + c.dump());
      expect(verdicts.count(c.at("verdict").get<std::string>()) == 1, "check verdict");
      expect(c.at("verdict") == "ok" || !c.at("remedy").get<std::string>().empty(),
             "a warning or failure without a remedy: " + c.dump());
      for (const auto& [key, value] : c.at("values").items()) {
        expect(
            value.is_null() || value.is_boolean() || value.is_number_integer() || value.is_string(),
            "value " + key + " has a type outside the schema");
      }
      names.insert(c.at("name").get<std::string>());
    }
    for (const char* n :
         {"shm_dir", "shm_reserve", "memory_cgroup", "sysv_shm", "open_files", "memlock", "cuda"}) {
      expect(names.count(n) == 1, std::string("missing check ") + n);
    }
    const auto& cuda = doc.at("cuda");
    for (const char* k : {"built_with_cuda", "driver_present"}) {
      expect(cuda.at(k).is_boolean(), k);
    }
    expect(cuda.at("driver_version").is_number_integer() && cuda.at("error").is_string() &&
               cuda.at("devices").is_array() && cuda.at("peer_access").is_array(),
           "cuda fields");
    expect(cuda.at("peer_access").size() == cuda.at("devices").size(), "peer_access is square");
    for (const auto& d : cuda.at("devices")) {
      for (const char* k : {"name", "uuid", "compute_capability", "compute_mode", "error"}) {
        expect(d.at(k).is_string(), k);
      }
      for (const char* k : {"legacy_ipc", "ipc_events", "kernel_ok", "unified_addressing"}) {
        expect(d.at(k).is_boolean(), k);
      }
    }
    // Without a driver the CUDA item says so and is not a failure: CPU use does not need it.
    if (cuda.at("devices").empty()) expect(verdict_of(r, "cuda") == "ok", "no driver is ok");
    // Without the probe, "cuda" is null and the item absent.
    o.cuda = false;
    const auto plain = nlohmann::json::parse(ferry::to_json(ferry::check_shm(o)));
    expect(plain.at("cuda").is_null(), "cuda must be null when not probed");
  });
}

TEST_CASE("a failed check is reported by the error code of what failed", "[shm][check]") {
  using ferry::Errc;
  using ferry::failure_code;
  CHECK(failure_code("shm_dir") == Errc::shm_failed);  // no usable directory: not a lack of room
  CHECK(failure_code("shm_reserve") == Errc::shm_exhausted);
  CHECK(failure_code("memory_cgroup") == Errc::shm_exhausted);  // tmpfs pages count against it
  CHECK(failure_code("sysv_shm") == Errc::shm_exhausted);
  CHECK(failure_code("open_files") == Errc::system);  // the job's open() would fail: EMFILE
  CHECK(failure_code("memlock") == Errc::system);
  CHECK(failure_code("cuda") == Errc::system);
  CHECK(failure_code("a_check_added_later") == Errc::system);
  // Every check a report can carry has its code; none falls to the default by a typo.
  ferry::ShmCheckOptions o;
  o.workers = 1;
  o.need_bytes = 1 << 20;
  o.reserve = false;
  for (const auto& i : ferry::check_shm(o).items) {
    INFO(i.name);
    CHECK((i.name == "open_files" || i.name == "memlock" || i.name == "cuda" ||
           failure_code(i.name) != Errc::system));
  }
}
