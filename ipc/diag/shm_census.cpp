#include "ipc/diag/shm_census.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "ipc/process.hpp"
#include "ipc/segment.hpp"

namespace ferry {
namespace {

using FileKey = std::pair<std::uint64_t, std::uint64_t>;  // (st_dev, st_ino)

struct Entry {
  ShmSegment seg;
  mode_t mode = 0;
  std::set<pid_t> holders;
};

// ferry's memfds, as /proc shows them: "/memfd:ferry-segment (deleted)", on the kernel's own shm
// mount, in no directory.
constexpr const char* kFerryMemfd = "/memfd:ferry-";

struct Scan {
  std::string dir;     // as given
  std::string prefix;  // its real path + "/", as /proc shows paths; empty when it does not exist
  dev_t dev = 0;
  std::map<FileKey, Entry> entries;
  std::vector<UnreadableProcess> unreadable;
  std::set<pid_t> ferry_pids;  // processes that map libferry_ipc
  pid_t torch_manager = 0;     // a live torch_shm_manager, which hands out torch_* names
  bool hidepid = false;
  ReaderRights reader;
};

struct DirCloser {
  void operator()(DIR* d) const noexcept { ::closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The pid in "ferry-<pid>-<n>" or "torch_<pid>_...", with the kind; 0 and "other" otherwise.
std::pair<std::string, pid_t> parse_name(const std::string& name) {
  std::string kind;
  std::size_t at = 0;
  char sep = 0;
  if (starts_with(name, "ferry-")) {
    kind = "ferry";
    at = 6;
    sep = '-';
  } else if (starts_with(name, "torch_")) {
    kind = "torch";
    at = 6;
    sep = '_';
  } else {
    return {"other", 0};
  }
  std::size_t end = at;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == at || end - at > 9 || end >= name.size() || name[end] != sep) return {"other", 0};
  return {kind, static_cast<pid_t>(std::stol(name.substr(at, end - at)))};
}

// True unless `pid` provably exited. kill() tells existence even for another user's process;
// EPERM with no /proc entry means /proc hides it (hidepid), so it counts as alive.
bool creator_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  if (process_alive(pid)) return true;
  struct stat st {};
  return ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0 && errno == ENOENT &&
         ::kill(pid, 0) != 0 && errno == EPERM;
}

bool proc_hides_others() {
  if (::geteuid() == 0) return false;
  FILE* f = std::fopen("/proc/mounts", "re");
  if (!f) return false;
  char line[1024];
  bool hidden = false;
  while (std::fgets(line, sizeof line, f)) {
    char src[256], target[256], type[64], opts[512];
    if (std::sscanf(line, "%255s %255s %63s %511s", src, target, type, opts) != 4) continue;
    if (std::strcmp(target, "/proc") != 0 || std::strcmp(type, "proc") != 0) continue;
    const std::string o = opts;
    hidden = o.find("hidepid=") != std::string::npos && o.find("hidepid=0") == std::string::npos &&
             o.find("hidepid=off") == std::string::npos;
  }
  std::fclose(f);
  return hidden;
}

// What this process may read in /proc: root, and CAP_SYS_PTRACE from the CapEff line of
// /proc/self/status (no libcap needed).
ReaderRights reader_rights() {
  ReaderRights r;
  r.root = ::geteuid() == 0;
  constexpr int kCapSysPtrace = 19;
  if (FILE* f = std::fopen("/proc/self/status", "re")) {
    char line[256];
    unsigned long long caps = 0;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "CapEff: %llx", &caps) == 1) {
        r.cap_sys_ptrace = (caps >> kCapSysPtrace) & 1;
        break;
      }
    }
    std::fclose(f);
  }
  return r;
}

// "comm: cmdline" of `proc`, the command line shortened; comm and cmdline stay readable when fd
// and maps are not.
std::string command_of(const std::string& proc) {
  std::string comm, cmdline;
  if (FILE* f = std::fopen((proc + "/comm").c_str(), "re")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) comm = buf;
    std::fclose(f);
  }
  while (!comm.empty() && comm.back() == '\n') comm.pop_back();
  if (FILE* f = std::fopen((proc + "/cmdline").c_str(), "re")) {
    char buf[256];
    const std::size_t n = std::fread(buf, 1, sizeof buf, f);
    std::fclose(f);
    cmdline.assign(buf, n);
    while (!cmdline.empty() && cmdline.back() == '\0') cmdline.pop_back();
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    constexpr std::size_t kShown = 60;
    if (cmdline.size() > kShown) cmdline = cmdline.substr(0, kShown) + "...";
  }
  if (comm.empty() || cmdline.empty()) return comm + cmdline;
  return comm + ": " + cmdline;
}

void fill_from_stat(ShmSegment& seg, const struct stat& st) {
  seg.size = static_cast<std::uint64_t>(st.st_size);
  seg.allocated = static_cast<std::uint64_t>(st.st_blocks) * 512;
  seg.inode = st.st_ino;
  seg.mtime = st.st_mtime;
  seg.uid = st.st_uid;
}

bool in_dir(const Scan& scan, const std::string& path) {
  return !scan.prefix.empty() && starts_with(path, scan.prefix);
}

// A segment seen only through a process: its name is the path /proc shows, less the directory
// (or a memfd's leading "/") and the " (deleted)" mark of an unlinked file.
Entry& entry_for(Scan& scan, const FileKey& key, const std::string& path) {
  auto it = scan.entries.find(key);
  if (it != scan.entries.end()) return it->second;
  Entry& e = scan.entries[key];
  const bool memfd = starts_with(path, kFerryMemfd);
  std::string name = path.substr(memfd ? 1 : scan.prefix.size());
  const std::string deleted = " (deleted)";
  if (name.size() > deleted.size() &&
      name.compare(name.size() - deleted.size(), deleted.size(), deleted) == 0) {
    name.resize(name.size() - deleted.size());
  }
  e.seg.name = name;
  e.seg.inode = key.second;
  e.seg.memfd = memfd;
  if (memfd) {
    e.seg.kind = "ferry";
  } else {
    std::tie(e.seg.kind, e.seg.name_pid) = parse_name(name);
  }
  return e;
}

void scan_directory(Scan& scan) {
  DirPtr d(::opendir(scan.dir.c_str()));
  if (!d) return;
  const int fd = ::dirfd(d.get());
  while (dirent* de = ::readdir(d.get())) {
    struct stat st {};
    if (::fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    Entry& e = scan.entries[{st.st_dev, st.st_ino}];
    e.seg.name = de->d_name;
    e.seg.named = true;
    e.mode = st.st_mode;
    fill_from_stat(e.seg, st);
    std::tie(e.seg.kind, e.seg.name_pid) = parse_name(e.seg.name);
  }
}

// Records what `pid` holds open in the directory. False when its fds cannot be read.
bool scan_fds(Scan& scan, pid_t pid, const std::string& proc) {
  DirPtr d(::opendir((proc + "/fd").c_str()));
  if (!d) return errno == ENOENT;  // gone meanwhile: it holds nothing
  while (dirent* de = ::readdir(d.get())) {
    if (de->d_name[0] == '.') continue;
    const std::string link = proc + "/fd/" + de->d_name;
    char target[4096];
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    // The directory of a process that is not dumpable lists its fds to root, but each link is
    // refused: that is not reading them.
    if (n < 0 && (errno == EACCES || errno == EPERM)) return false;
    if (n <= 0) continue;
    target[n] = '\0';
    const bool memfd = starts_with(target, kFerryMemfd);
    if (!memfd && !in_dir(scan, target)) continue;
    struct stat st {};
    if (::stat(link.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (!memfd && st.st_dev != scan.dev) continue;
    Entry& e = entry_for(scan, {st.st_dev, st.st_ino}, target);
    if (!e.seg.named) fill_from_stat(e.seg, st);
    e.holders.insert(pid);
  }
  return true;
}

// Records what `pid` maps from the directory, and whether it runs ferry. False when its maps
// cannot be read.
bool scan_maps(Scan& scan, pid_t pid, const std::string& proc) {
  FILE* f = std::fopen((proc + "/maps").c_str(), "re");
  if (!f) return errno == ENOENT;
  char line[4608];
  bool ok = true;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long start = 0, end = 0, offset = 0, inode = 0;
    unsigned major = 0, minor = 0;
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %*s %lx %x:%x %lu %n", &start, &end, &offset, &major, &minor,
                    &inode, &path_at) < 6 ||
        path_at == 0) {
      continue;
    }
    std::string path = line + path_at;
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    if (path.find("/libferry_ipc") != std::string::npos) scan.ferry_pids.insert(pid);
    const bool memfd = starts_with(path, kFerryMemfd);
    if (!memfd && (!in_dir(scan, path) || makedev(major, minor) != scan.dev)) continue;
    Entry& e = entry_for(scan, {makedev(major, minor), inode}, path);
    if (!e.seg.named && e.seg.size == 0) {
      // map_files gives the file itself (privileged); otherwise the size stays unknown.
      char range[64];
      std::snprintf(range, sizeof range, "/map_files/%lx-%lx", start, end);
      struct stat st {};
      if (::stat((proc + range).c_str(), &st) == 0) fill_from_stat(e.seg, st);
    }
    e.holders.insert(pid);
  }
  if (std::ferror(f)) ok = errno == ENOENT || errno == ESRCH;
  std::fclose(f);
  return ok;
}

void scan_processes(Scan& scan) {
  DirPtr d(::opendir("/proc"));
  if (!d) return;
  while (dirent* de = ::readdir(d.get())) {
    char* end = nullptr;
    const long id = std::strtol(de->d_name, &end, 10);
    if (*end != '\0' || id <= 0) continue;
    const auto pid = static_cast<pid_t>(id);
    const std::string proc = std::string("/proc/") + de->d_name;
    struct stat st {};
    if (::stat(proc.c_str(), &st) != 0) continue;
    if (!process_alive(pid)) continue;  // a zombie holds nothing
    char comm[64] = {};
    if (FILE* f = std::fopen((proc + "/comm").c_str(), "re")) {
      if (std::fgets(comm, sizeof comm, f) && starts_with(comm, "torch_shm_manag")) {
        scan.torch_manager = pid;
      }
      std::fclose(f);
    }
    const bool fds_ok = scan_fds(scan, pid, proc);
    const bool maps_ok = scan_maps(scan, pid, proc);
    if (!fds_ok || !maps_ok) scan.unreadable.push_back({pid, st.st_uid, command_of(proc)});
  }
}

void classify(const Scan& scan, Entry& e) {
  ShmSegment& s = e.seg;
  s.holders.assign(e.holders.begin(), e.holders.end());
  if (s.kind == "other" && !s.named &&
      std::any_of(s.holders.begin(), s.holders.end(),
                  [&](pid_t p) { return scan.ferry_pids.count(p) != 0; })) {
    s.kind = "ferry";  // an O_TMPFILE segment of a process running ferry
  }
  SegmentFacts f;
  f.uid = s.uid;
  f.mode = e.mode;
  f.name_pid = s.name_pid;
  f.name_pid_alive = s.holders.empty() && s.name_pid > 0 && creator_alive(s.name_pid);
  f.holders = s.holders;
  f.torch = s.kind == "torch";
  f.torch_manager = scan.torch_manager;
  f.hidepid = scan.hidepid;
  f.unreadable = scan.unreadable;
  f.reader = scan.reader;
  SegmentVerdict v = judge_segment(f);
  s.state = v.state;
  s.reason = std::move(v.reason);
  s.force_removable = v.force_removable;
}

}  // namespace

ShmCensus take_shm_census(const std::string& dir) {
  Scan scan;
  scan.dir = dir.empty() ? default_shm_dir() : dir;
  ShmCensus census;
  census.dir = scan.dir;
  struct stat st {};
  // Without the directory there are still the memfds to list.
  if (::stat(scan.dir.c_str(), &st) == 0) {
    scan.dev = st.st_dev;
    char real[PATH_MAX];
    scan.prefix = std::string(::realpath(scan.dir.c_str(), real) ? real : scan.dir.c_str());
    if (scan.prefix.empty() || scan.prefix.back() != '/') scan.prefix += '/';
  }
  scan.hidepid = proc_hides_others();
  scan.reader = reader_rights();

  scan_directory(scan);
  scan_processes(scan);

  for (auto& [key, e] : scan.entries) {
    classify(scan, e);
    census.segments.push_back(std::move(e.seg));
  }
  std::sort(census.segments.begin(), census.segments.end(),
            [](const ShmSegment& a, const ShmSegment& b) {
              return std::make_pair(!a.named, a.name) < std::make_pair(!b.named, b.name);
            });
  for (const UnreadableProcess& p : scan.unreadable) census.unreadable.push_back(p.pid);
  if (!scan.unreadable.empty()) {
    census.unreadable_reason = unreadable_reason(scan.unreadable, scan.reader);
  }
  census.hidepid = scan.hidepid;
  return census;
}

ShmCleanResult clean_shm(const ShmCleanOptions& options) {
  ShmCleanResult result;
  const ShmCensus census = take_shm_census(options.dir);
  const std::int64_t now = std::time(nullptr);
  const int dfd = ::open(census.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    result.errors.push_back(census.dir + ": " + std::strerror(errno));
    return result;
  }
  for (const ShmSegment& s : census.segments) {
    if (!s.named) continue;
    const bool wanted = s.state == SegmentState::orphaned || (options.force && s.force_removable);
    if (!wanted) {
      if (s.state == SegmentState::unknown && s.kind != "other") result.kept.push_back(s);
      continue;
    }
    if (options.older_than.count() > 0 && now - s.mtime < options.older_than.count()) continue;
    // The census took a while on a busy machine: the name must still be the same file, and its
    // creator still gone (a pid reused meanwhile makes it live again).
    struct stat st {};
    if (::fstatat(dfd, s.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_ino != s.inode ||
        creator_alive(s.name_pid)) {
      continue;
    }
    if (!options.dry_run && ::unlinkat(dfd, s.name.c_str(), 0) != 0) {
      result.errors.push_back(s.name + ": " + std::strerror(errno));
      continue;
    }
    result.removed.push_back(s);
    result.bytes_freed += s.allocated;
  }
  ::close(dfd);
  return result;
}

std::string to_json(const ShmCensus& census, bool include_other, int indent) {
  nlohmann::json segments = nlohmann::json::array();
  std::uint64_t allocated = 0, orphaned = 0, orphaned_bytes = 0;
  for (const ShmSegment& s : census.segments) {
    if (s.kind == "other" && !include_other) continue;
    segments.push_back({{"name", s.name},
                        {"kind", s.kind},
                        {"named", s.named},
                        {"memfd", s.memfd},
                        {"size_bytes", s.size},
                        {"allocated_bytes", s.allocated},
                        {"inode", s.inode},
                        {"mtime", s.mtime},
                        {"uid", s.uid},
                        {"name_pid", s.name_pid ? nlohmann::json(s.name_pid) : nlohmann::json()},
                        {"holders", s.holders},
                        {"state", segment_state_name(s.state)},
                        {"reason", s.reason},
                        {"force_removable", s.force_removable}});
    allocated += s.allocated;
    if (s.state == SegmentState::orphaned) {
      ++orphaned;
      orphaned_bytes += s.allocated;
    }
  }
  nlohmann::json doc = {{"schema", "ferry-shm-ls/1"},
                        {"dir", census.dir},
                        {"hidepid", census.hidepid},
                        {"unreadable_pids", census.unreadable},
                        {"unreadable_reason", census.unreadable_reason},
                        {"segments", segments},
                        {"totals",
                         {{"segments", segments.size()},
                          {"allocated_bytes", allocated},
                          {"orphaned", orphaned},
                          {"orphaned_bytes", orphaned_bytes}}}};
  return doc.dump(indent);
}

}  // namespace ferry
