// The verdict on one segment, case by case: facts in, state, reason and --force out.
#include "ipc/diag/shm_verdict.hpp"

#include "../../catch.hpp"

#include <string>

namespace {

using ferry::judge_segment;
using ferry::ReaderRights;
using ferry::SegmentFacts;
using ferry::SegmentState;
using ferry::UnreadableProcess;

constexpr uid_t kUser = 1000;

// A file of kUser, 0600, named for pid 4242, which exited; nothing else known.
SegmentFacts dead_creator() {
  SegmentFacts f;
  f.uid = kUser;
  f.mode = 0600;
  f.name_pid = 4242;
  f.name_pid_alive = false;
  return f;
}

const UnreadableProcess kInit{1, 0, "tini: /sbin/tini -- python train.py"};

ReaderRights rights(bool root, bool cap_sys_ptrace) {
  ReaderRights r;
  r.root = root;
  r.cap_sys_ptrace = cap_sys_ptrace;
  return r;
}

}  // namespace

TEST_CASE("verdict: held or mapped by a live process is live, whatever else", "[shm][verdict]") {
  SegmentFacts f = dead_creator();
  f.holders = {17, 18};
  f.unreadable = {kInit};
  f.hidepid = true;
  const auto v = judge_segment(f);
  CHECK(v.state == SegmentState::live);
  CHECK(v.reason == "held or mapped by pid 17, 18");
  CHECK_FALSE(v.force_removable);
}

TEST_CASE("verdict: a creator alive makes it live", "[shm][verdict]") {
  SegmentFacts f = dead_creator();
  f.name_pid_alive = true;
  const auto v = judge_segment(f);
  CHECK(v.state == SegmentState::live);
  CHECK_THAT(v.reason, Catch::Contains("pid 4242, is alive"));
  CHECK_FALSE(v.force_removable);
}

TEST_CASE("verdict: creator dead and every process read is orphaned", "[shm][verdict]") {
  const auto v = judge_segment(dead_creator());
  CHECK(v.state == SegmentState::orphaned);
  CHECK(v.reason == "pid 4242 exited and no process holds or maps it");
  CHECK_FALSE(v.force_removable);  // clean takes it without --force
}

TEST_CASE("verdict: no pid in the name is unknown, even for --force", "[shm][verdict]") {
  SegmentFacts f = dead_creator();
  f.name_pid = 0;
  const auto v = judge_segment(f);
  CHECK(v.state == SegmentState::unknown);
  CHECK_THAT(v.reason, Catch::Contains("no pid in its name"));
  CHECK_FALSE(v.force_removable);
}

TEST_CASE("verdict: a running torch_shm_manager keeps torch names, even from --force",
          "[shm][verdict]") {
  SegmentFacts f = dead_creator();
  f.torch = true;
  f.torch_manager = 99;
  f.unreadable = {{7, kUser, "python"}};
  auto v = judge_segment(f);
  CHECK(v.state == SegmentState::unknown);
  CHECK_THAT(v.reason, Catch::Contains("torch_shm_manager (pid 99)"));
  CHECK_FALSE(v.force_removable);  // it may give the name to a process that opens it later
  f.torch = false;                 // a ferry name is not the manager's to hand out
  f.unreadable.clear();
  CHECK(judge_segment(f).state == SegmentState::orphaned);
}

TEST_CASE("verdict: hidepid hides possible holders: unknown, removable with --force",
          "[shm][verdict]") {
  SegmentFacts f = dead_creator();
  f.hidepid = true;
  const auto v = judge_segment(f);
  CHECK(v.state == SegmentState::unknown);
  CHECK_THAT(v.reason, Catch::Contains("hidepid") && Catch::Contains("clean --force"));
  CHECK(v.force_removable);
}

TEST_CASE("verdict: an unreadable process that could hold it: unknown, removable with --force",
          "[shm][verdict]") {
  SegmentFacts f = dead_creator();
  f.unreadable = {{31, kUser, "python: python train.py"}};
  const auto v = judge_segment(f);
  CHECK(v.state == SegmentState::unknown);
  CHECK_THAT(v.reason, Catch::Contains("pid 4242 exited") &&
                           Catch::Contains("pid 31 (python: python train.py)") &&
                           Catch::Contains("clean --force"));
  CHECK(v.force_removable);
}

TEST_CASE("verdict: another user's unreadable process counts only if the mode lets it open",
          "[shm][verdict]") {
  SegmentFacts f = dead_creator();
  f.unreadable = {kInit};  // root's, and the file is kUser's 0600
  CHECK(judge_segment(f).state == SegmentState::orphaned);
  f.mode = 0644;
  CHECK(judge_segment(f).state == SegmentState::unknown);
  f.mode = 0600;
  f.uid = 0;  // root's file, root's process
  CHECK(judge_segment(f).state == SegmentState::unknown);
}

TEST_CASE("why a process could not be read: 'run as root' only where root would help",
          "[shm][verdict]") {
  const std::vector<UnreadableProcess> init = {kInit};
  SECTION("not root: run as root") {
    const std::string r = ferry::unreadable_reason(init, rights(false, false));
    CHECK_THAT(r,
               Catch::Contains("pid 1 (tini: /sbin/tini -- python train.py) could not be read") &&
                   Catch::Contains("run as root"));
  }
  SECTION("root without CAP_SYS_PTRACE: not dumpable, the capability containers drop") {
    const std::string r = ferry::unreadable_reason(init, rights(true, false));
    CHECK_THAT(r, Catch::Contains("pid 1 (tini") && Catch::Contains("even as root") &&
                      Catch::Contains("not dumpable") && Catch::Contains("CAP_SYS_PTRACE") &&
                      Catch::Contains("--cap-add SYS_PTRACE"));
    CHECK_THAT(r, !Catch::Contains("run as root"));
  }
  SECTION("with CAP_SYS_PTRACE: a security module or another user namespace") {
    for (const bool root : {true, false}) {
      const std::string r = ferry::unreadable_reason(init, rights(root, true));
      CHECK_THAT(r, Catch::Contains("pid 1 (tini") && Catch::Contains("even with CAP_SYS_PTRACE") &&
                        Catch::Contains("security module") && Catch::Contains("user namespace"));
      CHECK_THAT(r, !Catch::Contains("run as root") && !Catch::Contains("dumpable"));
    }
  }
  SECTION("three processes are named, the rest counted; a missing command is left out") {
    const std::vector<UnreadableProcess> many = {
        {5, 0, ""}, {6, 0, "a"}, {7, 0, "b"}, {8, 0, "c"}, {9, 0, "d"}};
    const std::string r = ferry::unreadable_reason(many, rights(false, false));
    CHECK_THAT(r, Catch::Contains("of pid 5, pid 6 (a), pid 7 (b) and 2 more could not"));
  }
}
