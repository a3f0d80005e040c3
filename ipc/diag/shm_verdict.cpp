#include "ipc/diag/shm_verdict.hpp"

namespace ferry {
namespace {

constexpr std::size_t kNamed = 3;  // processes named in a reason; the rest are counted

std::string pid_list(const std::vector<pid_t>& pids) {
  std::string out;
  for (std::size_t i = 0; i < pids.size() && i < kNamed + 2; ++i) {
    out += (i ? ", " : "") + std::to_string(pids[i]);
  }
  if (pids.size() > kNamed + 2) out += ", ...";
  return out;
}

std::string process_list(const std::vector<UnreadableProcess>& ps) {
  std::string out;
  for (std::size_t i = 0; i < ps.size() && i < kNamed; ++i) {
    out += (i ? ", " : "") + std::string("pid ") + std::to_string(ps[i].pid);
    if (!ps[i].command.empty()) out += " (" + ps[i].command + ")";
  }
  if (ps.size() > kNamed) out += " and " + std::to_string(ps.size() - kNamed) + " more";
  return out;
}

}  // namespace

const char* segment_state_name(SegmentState s) noexcept {
  switch (s) {
    case SegmentState::live:
      return "live";
    case SegmentState::orphaned:
      return "orphaned";
    case SegmentState::unknown:
      return "unknown";
  }
  return "unknown";
}

std::string unreadable_reason(const std::vector<UnreadableProcess>& processes,
                              const ReaderRights& reader) {
  const std::string who = "the fds or maps of " + process_list(processes) + " could not be read";
  if (reader.cap_sys_ptrace) {
    // CAP_SYS_PTRACE overrides dumpability and other users' ownership in our user namespace, so
    // what is left is a restriction it does not cover.
    return who +
           " even with CAP_SYS_PTRACE: a security module (AppArmor, SELinux, Landlock) or a user "
           "namespace other than this process's forbids it";
  }
  if (reader.root) {
    return who +
           " even as root: such a process is not dumpable (it called prctl(PR_SET_DUMPABLE, 0), "
           "or runs a set-id or file-capability program) and this process lacks CAP_SYS_PTRACE, "
           "which container runtimes drop (docker run --cap-add SYS_PTRACE restores it); or it "
           "is in another user namespace, or a security module forbids it";
  }
  return who + ": run as root or as their owner to decide";
}

SegmentVerdict judge_segment(const SegmentFacts& f) {
  SegmentVerdict v;
  if (!f.holders.empty()) {
    v.state = SegmentState::live;
    v.reason = "held or mapped by pid " + pid_list(f.holders);
    return v;
  }
  // Only a named file can get here: the others were found through a holder.
  if (f.name_pid > 0 && f.name_pid_alive) {
    v.state = SegmentState::live;
    v.reason = "its creator, pid " + std::to_string(f.name_pid) + ", is alive";
    return v;
  }
  v.state = SegmentState::unknown;
  if (f.name_pid == 0) {
    v.reason = "no pid in its name, and no process holds or maps it";
    return v;
  }
  // The one case --force never overrides: a running manager may still give the name to a
  // process that opens it later.
  if (f.torch && f.torch_manager != 0) {
    v.reason = "torch_shm_manager (pid " + std::to_string(f.torch_manager) +
               ") is running and may still hand it out";
    return v;
  }
  const std::string dead = "pid " + std::to_string(f.name_pid) + " exited";
  const std::string force = "; ferry-shm clean --force removes it, its creator being dead";
  if (f.hidepid) {
    v.reason = dead + ", but /proc hides other users' processes (hidepid), which may hold it: " +
               "run as root to decide" + force;
    v.force_removable = true;
    return v;
  }
  // A process could hold it only if it could have opened it: same owner, or a mode that lets
  // others in. Root processes of other users are not counted: ferry and PyTorch pass segment fds
  // only between processes of one user.
  std::vector<UnreadableProcess> blind;
  for (const UnreadableProcess& p : f.unreadable) {
    if (p.uid == f.uid || (f.mode & 0066) != 0) blind.push_back(p);
  }
  if (!blind.empty()) {
    v.reason = dead + " and no process seen holds or maps it, but " +
               unreadable_reason(blind, f.reader) + force;
    v.force_removable = true;
    return v;
  }
  v.state = SegmentState::orphaned;
  v.reason = dead + " and no process holds or maps it";
  return v;
}

}  // namespace ferry
