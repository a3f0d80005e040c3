// The ferry-shm binary as users run it: exit codes, messages for bad input, JSON on stdout, and
// clean keeping what is live. Conditions are real: a private small tmpfs, a lowered fd limit,
// planted segments whose owner is dead.
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include "../catch.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../test_util.hpp"
#include "ipc/segment.hpp"

namespace {

struct Run {
  int code = -1;
  std::string out, err;
};

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

std::string drain(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return s;
}

// Runs ferry-shm with `args`; stdout and stderr go to files so neither pipe can fill and block.
Run ferry_shm(const std::vector<std::string>& args) {
  char out_path[] = "/tmp/ferry-shm-test-out-XXXXXX";
  char err_path[] = "/tmp/ferry-shm-test-err-XXXXXX";
  const int out = ::mkstemp(out_path);
  const int err = ::mkstemp(err_path);
  expect(out >= 0 && err >= 0, "mkstemp");
  ::unlink(out_path);
  ::unlink(err_path);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> argv = {const_cast<char*>(FERRY_SHM_EXE)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(FERRY_SHM_EXE, argv.data());
    ::_exit(127);
  }
  Run r;
  r.code = ferry::test::wait_child(pid, std::chrono::seconds(60));
  ::lseek(out, 0, SEEK_SET);
  ::lseek(err, 0, SEEK_SET);
  r.out = drain(out);
  r.err = drain(err);
  return r;
}

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The exit code must be the worst verdict of the document printed.
void expect_consistent(const Run& r) {
  const auto doc = nlohmann::json::parse(r.out);
  int worst = 0;
  for (const auto& c : doc.at("checks")) {
    const std::string v = c.at("verdict");
    worst = std::max(worst, v == "ok" ? 0 : v == "warn" ? 1 : 2);
  }
  expect(doc.at("exit_code") == worst && r.code == worst,
         "exit " + std::to_string(r.code) + " for verdicts " + doc.dump());
}

// By value: GCC 13's -Wdangling-reference cannot tell that the reference would point into `doc`,
// not into the temporary name.
nlohmann::json check_named(const nlohmann::json& doc, const std::string& name) {
  for (const auto& c : doc.at("checks")) {
    if (c.at("name") == name) return c;
  }
  throw std::runtime_error("no check " + name);
}

}  // namespace

TEST_CASE("ferry-shm --version prints project()'s version", "[tools][ferry-shm]") {
  const Run r = ferry_shm({"--version"});
  expect(r.code == 0 && r.out == std::string(FERRY_PROJECT_VERSION) + "\n",
         "ferry-shm --version: exit " + std::to_string(r.code) + ", '" + r.out + "' " + r.err);
}

TEST_CASE("ferry-shm check exits 0, 1 or 2 with the worst verdict", "[tools][ferry-shm]") {
  ferry::test::in_child([] {
    ferry::test::private_tmpfs(16 << 20);
    // Fits: the shm checks are ok.
    Run ok = ferry_shm({"check", "--need", "4M", "--workers", "2", "--json", "--no-cuda"});
    expect_consistent(ok);
    auto doc = nlohmann::json::parse(ok.out);
    expect(check_named(doc, "shm_reserve").at("verdict") == "ok", ok.out);
    expect(check_named(doc, "shm_dir").at("verdict") == "ok", ok.out);

    // Does not fit: a failure, exit 2, in the table too.
    Run fail = ferry_shm({"--need", "64M", "--no-cuda"});
    expect(fail.code == 2, "exit " + std::to_string(fail.code) + ": " + fail.out + fail.err);
    expect(has(fail.out, "shm_reserve") && has(fail.out, "cannot reserve 64.0 MiB") &&
               has(fail.out, "fix: ") && has(fail.out, "--shm-size="),
           fail.out);
    expect(!has(fail.out, "\033["), "colours when stdout is not a terminal");

    // A soft fd limit below the need: a warning.
    struct rlimit rl {};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = 20;
    expect(::setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
    Run warn = ferry_shm({"--need", "4M", "--workers", "4", "--json", "--no-cuda"});
    expect_consistent(warn);
    doc = nlohmann::json::parse(warn.out);
    expect(check_named(doc, "open_files").at("verdict") == "warn", warn.out);
    expect(warn.code >= 1, "a warning exits 1 unless something failed");
  });
}

TEST_CASE("ferry-shm refuses bad input with the value and the accepted forms, exit 2",
          "[tools][ferry-shm]") {
  Run r = ferry_shm({"check", "--need", "12QB"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("'12QB'") && Catch::Contains("64M, 1.5GiB, 2g"));
  r = ferry_shm({"clean", "--older-than", "-3x", "--dry-run"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("'-3x'") && Catch::Contains("30s, 10m, 2h, 1d"));
  r = ferry_shm({"check", "--workers", "0"});
  CHECK(r.code == 2);
  r = ferry_shm({"frobnicate"});
  CHECK(r.code == 2);
  r = ferry_shm({"--help"});
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("check") && Catch::Contains("clean"));
}

TEST_CASE("a bad FERRY_* variable is refused by name and value, exit 2", "[tools][ferry-shm]") {
  ::setenv("FERRY_SHM_DIR", "shm", 1);  // relative: another place in each working directory
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"ls"}, {"clean", "--dry-run"}, {"check", "--no-cuda"}}) {
    const Run r = ferry_shm(args);
    INFO(args[0] << ": " << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::StartsWith("ferry-shm: FERRY_SHM_DIR='shm' is not accepted") &&
                          Catch::Contains("an absolute path"));
  }
  ::unsetenv("FERRY_SHM_DIR");
  ::setenv("FERRY_ARENA_SEGMENT_MB", "2s", 1);
  const Run r = ferry_shm({"check", "--no-cuda", "--no-reserve"});
  ::unsetenv("FERRY_ARENA_SEGMENT_MB");
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("FERRY_ARENA_SEGMENT_MB='2s' is not accepted") &&
                        Catch::Contains("a number of MiB") &&
                        Catch::Contains("the default (64.0 MiB)"));
}

TEST_CASE("ferry-shm ls and clean: orphans go, live segments stay", "[tools][ferry-shm]") {
  ferry::test::in_child([] {
    ferry::test::run_in_private_container(16 << 20, [] {
      const pid_t dead = ::fork();
      if (dead == 0) ::_exit(0);
      ::waitpid(dead, nullptr, 0);
      const std::string orphan = "torch_" + std::to_string(dead) + "_99_0";
      const std::string live = "ferry-" + std::to_string(dead) + "-7";
      for (const auto& name : {orphan, live}) {
        const int fd = ::open(("/dev/shm/" + name).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
        expect(fd >= 0 && ::posix_fallocate(fd, 0, 1 << 20) == 0, "plant " + name);
        ::close(fd);
      }
      // This process keeps `live` open: its creator is dead but it is in use.
      const int keep = ::open(("/dev/shm/" + live).c_str(), O_RDWR);
      expect(keep >= 0, "open live");

      Run ls = ferry_shm({"ls", "--json"});
      expect(ls.code == 0, ls.err);
      const auto doc = nlohmann::json::parse(ls.out);
      std::string orphan_state, live_state;
      for (const auto& s : doc.at("segments")) {
        if (s.at("name") == orphan) orphan_state = s.at("state");
        if (s.at("name") == live) live_state = s.at("state");
      }
      expect(orphan_state == "orphaned" && live_state == "live", ls.out);
      Run table = ferry_shm({"ls"});
      expect(has(table.out, orphan) && has(table.out, "orphaned") && has(table.out, "1 orphaned"),
             table.out);

      Run dry = ferry_shm({"clean", "--dry-run"});
      expect(dry.code == 0 && has(dry.out, "would remove " + orphan) &&
                 has(dry.out, "would free 1.0 MiB in 1 orphaned segment"),
             dry.out);
      Run clean = ferry_shm({"clean", "--older-than", "10m"});
      expect(clean.code == 0 && has(clean.out, "freed 0 B in 0"), "too young: " + clean.out);
      clean = ferry_shm({"clean"});
      expect(clean.code == 0 && has(clean.out, "removed " + orphan) &&
                 has(clean.out, "freed 1.0 MiB in 1 orphaned segment") && !has(clean.out, live),
             clean.out);
      struct stat st {};
      expect(::stat(("/dev/shm/" + orphan).c_str(), &st) != 0, "the orphan is still there");
      expect(::stat(("/dev/shm/" + live).c_str(), &st) == 0, "clean removed the live segment");
      ::close(keep);
    });
  });
}

TEST_CASE(
    "with memfd segments, check measures the memory, not a 16 MiB /dev/shm, and ls lists them",
    "[tools][ferry-shm]") {
  ferry::test::in_child([] {
    ferry::test::run_in_private_container(16 << 20, [] {
      ::unsetenv("FERRY_SHM_BACKING");  // the default: memfds where the kernel allows them
      expect(ferry::memfd_works(), "memfd_create is refused here");
      Run check = ferry_shm({"check", "--need", "64M", "--workers", "2", "--json", "--no-cuda"});
      expect_consistent(check);
      auto doc = nlohmann::json::parse(check.out);
      expect(doc.at("backing") == "memfd" && check.code != 2, check.out);
      const auto reserve = check_named(doc, "shm_reserve");
      expect(reserve.at("verdict") == "ok" && reserve.at("values").at("backing") == "memfd" &&
                 reserve.at("values").at("reserved") == true,
             "64 MiB reserved in a memfd beside a 16 MiB /dev/shm: " + check.out);
      const auto dir = check_named(doc, "shm_dir");
      expect(dir.at("verdict") == "ok" && has(dir.at("summary"), "segments are memfds"), check.out);
      Run table = ferry_shm({"check", "--need", "64M", "--no-cuda"});
      expect(has(table.out, "ferry-shm check: memfd segments,"), table.out);

      // A live segment: listed by ls, left alone by clean.
      auto seg = ferry::Segment::create(3 << 20);
      std::memset(seg->data(), 1, seg->size());
      Run ls = ferry_shm({"ls", "--json"});
      expect(ls.code == 0, ls.err);
      bool found = false;
      const auto listed = nlohmann::json::parse(ls.out);
      for (const auto& s : listed.at("segments")) {
        if (s.at("memfd") == true && s.at("size_bytes") == (3u << 20)) {
          expect(s.at("name") == "memfd:ferry-segment" && s.at("kind") == "ferry" &&
                     s.at("state") == "live" && s.at("named") == false &&
                     s.at("holders") == nlohmann::json::array({::getpid()}),
                 ls.out);
          found = true;
        }
      }
      expect(found, "ls missed the memfd: " + ls.out);
      Run list = ferry_shm({"ls"});
      expect(has(list.out, "memfd:ferry-segment") && has(list.out, "memfd(s)"), list.out);
      Run clean = ferry_shm({"clean"});
      expect(clean.code == 0 && has(clean.out, "freed 0 B in 0"), clean.out);
      seg->data()[0] = std::byte{2};  // still mapped, still ours
    });
  });
}

TEST_CASE("ferry-shm clean names the process root may not read, --force removes dead owners' only",
          "[tools][ferry-shm]") {
  ferry::test::in_child([] {
    ferry::test::run_in_private_container(16 << 20, [] {
      // As in a docker container: root, but no process has CAP_SYS_PTRACE.
      ferry::test::drop_cap_sys_ptrace();
      const pid_t dead = ::fork();
      if (dead == 0) ::_exit(0);
      ::waitpid(dead, nullptr, 0);
      const std::string orphan = "torch_" + std::to_string(dead) + "_99_0";
      const std::string live = "torch_" + std::to_string(::getpid()) + "_5";  // creator alive
      for (const auto& name : {orphan, live}) {
        const int fd = ::open(("/dev/shm/" + name).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
        expect(fd >= 0 && ::posix_fallocate(fd, 0, 1 << 20) == 0, "plant " + name);
        ::close(fd);
      }
      int ready[2];
      expect(::pipe(ready) == 0, "pipe");
      const pid_t undumpable = ::fork();
      if (undumpable == 0) {
        ::prctl(PR_SET_NAME, "undumpable");
        ::prctl(PR_SET_DUMPABLE, 0);
        if (::write(ready[1], "x", 1) != 1) ::_exit(3);  // never; glibc wants it checked
        for (;;) ::pause();
      }
      char c = 0;
      expect(::read(ready[0], &c, 1) == 1, "the undumpable process did not start");
      const std::string who = "pid " + std::to_string(undumpable) + " (undumpable";

      Run clean = ferry_shm({"clean"});
      expect(clean.code == 0 && has(clean.out, "kept " + orphan) && has(clean.out, who) &&
                 has(clean.out, "not dumpable") && has(clean.out, "CAP_SYS_PTRACE") &&
                 !has(clean.out, "run as root") && has(clean.out, "clean --force removes them") &&
                 !has(clean.out, "removed "),
             "clean: " + clean.out + clean.err);
      struct stat st {};
      expect(::stat(("/dev/shm/" + orphan).c_str(), &st) == 0, "clean removed an unknown one");
      Run ls = ferry_shm({"ls"});
      expect(has(ls.out, "note: the fds or maps of " + who) && !has(ls.out, "not root?"),
             "ls: " + ls.out);

      Run force = ferry_shm({"clean", "--force"});
      expect(force.code == 0 && has(force.out, "removed " + orphan) && !has(force.out, live) &&
                 has(force.out, "freed 1.0 MiB in 1 orphaned or forced segment"),
             "clean --force: " + force.out + force.err);
      expect(::stat(("/dev/shm/" + orphan).c_str(), &st) != 0, "--force kept the orphan");
      expect(::stat(("/dev/shm/" + live).c_str(), &st) == 0, "--force removed a live segment");
      expect(::kill(undumpable, 0) == 0, "the unreadable process was disturbed");
      ::kill(undumpable, SIGKILL);
    });
  });
}
