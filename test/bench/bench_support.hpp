// What ferry's benchmarks share: forked peers and the pipes that pace them, percentiles, the
// machine and how busy it was, sizes and the columns of their tables, finding a Python peer.
#pragma once

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ferry::bench {

using json = nlohmann::ordered_json;

inline constexpr std::size_t kKiB = 1024;
inline constexpr std::size_t kMiB = 1024 * kKiB;

// Nearest rank, the definition the Python peers use too.
inline double percentile(const std::vector<double>& sorted, int pct) {
  if (sorted.empty()) return 0;
  const std::size_t rank = (static_cast<std::size_t>(pct) * sorted.size() + 99) / 100;
  return sorted[std::min(sorted.size(), std::max<std::size_t>(rank, 1)) - 1];
}

// CLOCK_MONOTONIC is one clock for every process on the machine, so a stamp taken in a producer
// can be subtracted from a time read in the consumer (Python's time.monotonic_ns() reads it too).
inline std::int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Now, in UTC, as ISO 8601 to the second: when a report's run began.
inline std::string utc_now() {
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return when;
}

[[noreturn]] inline void fail_errno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

// Two one-way pipes between a parent and a child it forks. Besides carrying a pipe round trip,
// they pace the measurement (start barriers, end signals) and carry the child's own figures,
// outside the transport measured.
class Link {
 public:
  Link() {
    if (::pipe2(down_, O_CLOEXEC) != 0 || ::pipe2(up_, O_CLOEXEC) != 0) fail_errno("pipe2");
  }
  ~Link() {
    for (int fd : {down_[0], down_[1], up_[0], up_[1]})
      if (fd >= 0) ::close(fd);
  }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Each side closes the ends it does not use, so a peer's death reads as end of file, not a hang.
  void parent_side() { close_ends(down_[0], up_[1]); }
  void child_side() {
    close_ends(down_[1], up_[0]);
    child_ = true;
  }

  template <typename T>
  void send(T v) {
    write_all(child_ ? up_[1] : down_[1], &v, sizeof v);
  }
  template <typename T>
  T recv() {
    T v{};
    read_all(child_ ? down_[0] : up_[0], &v, sizeof v);
    return v;
  }
  void expect(char want, const char* what) {
    if (recv<char>() != want) throw std::runtime_error(std::string("bad signal: ") + what);
  }

 private:
  static void close_ends(int& a, int& b) {
    ::close(a);
    ::close(b);
    a = b = -1;
  }
  static void write_all(int fd, const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail_errno("write to peer");
      c += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  static void read_all(int fd, void* p, std::size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t r = ::read(fd, c, n);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) throw std::runtime_error("peer process exited early");
      if (r < 0) fail_errno("read from peer");
      c += r;
      n -= static_cast<std::size_t>(r);
    }
  }
  int down_[2] = {-1, -1};
  int up_[2] = {-1, -1};
  bool child_ = false;
};

// A forked child running `body`. The child never returns into main: it _exits, so LibTorch's
// and ferry's static destructors run only in the parent. Killed and reaped if the parent bails,
// and killed by the kernel if the parent dies, since its siblings hold pipe ends that would
// otherwise keep it waiting.
class Child {
 public:
  // `name` prefixes what the child prints when `body` throws.
  Child(const std::function<void()>& body, std::string name) : name_(std::move(name)) {
    std::fflush(nullptr);  // or buffered output would be printed twice
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) fail_errno("fork");
    if (pid_ == 0) {
      int code = 0;
      try {
        if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(1);
        body();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name_.c_str(), e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // True once the child has exited, without reaping it (wait() still reports how).
  bool exited() const {
    siginfo_t info{};
    return ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid != 0;
  }

  void wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) {
      if (errno != EINTR) fail_errno("waitpid");
    }
    pid_ = -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw std::runtime_error(name_ + " failed (status " + std::to_string(status) + ")");
    }
  }

 private:
  pid_t pid_ = -1;
  std::string name_;
};

// The value of the first line of `path` that starts with `key`, after `separator` (cpuinfo's
// "key : value", os-release's KEY="value").
inline std::string read_first_match(const char* path, const std::string& key,
                                    char separator = ':') {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    const auto sep = line.find(separator);
    if (sep == std::string::npos) continue;
    auto value = line.substr(sep + 1);
    value.erase(0, value.find_first_not_of(" \t\""));
    value.erase(value.find_last_not_of(" \t\"") + 1);
    return value;
  }
  return {};
}

// MemAvailable from /proc/meminfo, in bytes (0 if unreadable).
inline std::size_t available_memory() {
  const std::string kb = read_first_match("/proc/meminfo", "MemAvailable");
  return kb.empty() ? 0 : static_cast<std::size_t>(std::stoull(kb)) * kKiB;
}

// CPU time of the whole machine (from /proc/stat) and of this process and its reaped children
// (forked peers, the Python baseline), so a run can report how busy everything else was.
struct CpuSample {
  std::int64_t when_ns = monotonic_ns();
  double busy_s = 0, steal_s = 0, own_s = 0;
};

inline CpuSample sample_cpu() {
  CpuSample c;
  std::ifstream in("/proc/stat");
  std::string label;
  // user nice system idle iowait irq softirq steal (guest time is already inside user)
  double f[8] = {};
  in >> label;
  for (double& v : f) in >> v;
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  c.busy_s = (f[0] + f[1] + f[2] + f[5] + f[6]) / hz;
  c.steal_s = f[7] / hz;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    struct rusage ru {};
    ::getrusage(who, &ru);
    c.own_s += static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
               static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  }
  return c;
}

inline json activity(const CpuSample& a, const CpuSample& b) {
  const double wall = static_cast<double>(b.when_ns - a.when_ns) / 1e9;
  const double own = b.own_s - a.own_s;
  return {{"wall_s", wall},
          {"bench_cpu_s", own},
          {"other_cpu_s", std::max(0.0, (b.busy_s - a.busy_s) - own)},
          {"steal_s", b.steal_s - a.steal_s}};
}

// `gpu` says what the run did with GPUs.
inline json machine_info(const std::string& gpu) {
  json m;
  const std::string cpu = read_first_match("/proc/cpuinfo", "model name");
  m["cpu_model"] = cpu.empty() ? "unknown" : cpu;
  m["cores"] = ::sysconf(_SC_NPROCESSORS_ONLN);
  struct utsname u {};
  if (::uname(&u) == 0) {
    m["kernel"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  }
  m["memory_gib"] = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                    static_cast<double>(::sysconf(_SC_PAGESIZE)) / static_cast<double>(1u << 30);
  const std::string flags = read_first_match("/proc/cpuinfo", "flags");
  m["virtual_machine"] = (" " + flags + " ").find(" hypervisor ") != std::string::npos;
  const std::string os = read_first_match("/etc/os-release", "PRETTY_NAME=", '=');
  if (!os.empty()) m["os"] = os;
#ifdef TORCH_VERSION
  m["libtorch"] = TORCH_VERSION;
#endif
  m["gpu"] = gpu;
  return m;
}

inline std::optional<std::size_t> parse_size(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  std::size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0 || digits > 12) return std::nullopt;
  const std::size_t value = std::stoull(s.substr(0, digits));
  std::string unit = s.substr(digits);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (unit.empty() || unit == "b") return value;
  if (unit == "k" || unit == "kib" || unit == "kb") return value * kKiB;
  if (unit == "m" || unit == "mib" || unit == "mb") return value * kMiB;
  if (unit == "g" || unit == "gib" || unit == "gb") return value * kMiB * 1024;
  return std::nullopt;
}

inline std::string size_name(std::size_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes >= kKiB && bytes % kKiB == 0) return std::to_string(bytes / kKiB) + " KiB";
  return std::to_string(bytes) + " B";
}

inline std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Three significant digits or so, whatever the magnitude.
inline std::string num(double v) {
  if (v >= 1e6) return fmt("%.2fM", v / 1e6);
  if (v >= 1e4) return fmt("%.1fk", v / 1e3);
  if (v >= 100) return fmt("%.0f", v);
  if (v >= 10) return fmt("%.1f", v);
  return fmt("%.2f", v);
}

inline std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

template <typename T>
std::string join(const std::vector<T>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Runs `python script args` and reads the one JSON object it prints: {"status": "ok", ...its
// keys}, or {"status": "skipped" | "failed", "reason": ...} (no interpreter or script, the peer's
// own {"skipped": why}, a failed run or no JSON).
inline json run_python_peer(const std::string& python, const std::string& script,
                            const std::string& args) {
  if (::access(python.c_str(), X_OK) != 0)
    return {{"status", "skipped"}, {"reason", python + " not found"}};
  if (::access(script.c_str(), R_OK) != 0)
    return {{"status", "skipped"}, {"reason", script + " not found"}};
  const std::string name = script.substr(script.rfind('/') + 1);
  const std::string cmd = shell_quote(python) + " " + shell_quote(script) + " " + args;
  std::fflush(nullptr);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) {
    return {{"status", "failed"}, {"reason", std::string("popen: ") + std::strerror(errno)}};
  }
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    const std::string how =
        WIFEXITED(status)     ? "exited with code " + std::to_string(WEXITSTATUS(status))
        : WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                              : "failed (status " + std::to_string(status) + ")";
    return {{"status", "failed"}, {"reason", name + " " + how + "; command: " + cmd}};
  }
  json peer = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (peer.is_discarded() || !peer.is_object()) {
    return {{"status", "failed"}, {"reason", name + " printed no JSON object"}};
  }
  if (peer.contains("skipped")) return {{"status", "skipped"}, {"reason", peer["skipped"]}};
  json result = {{"status", "ok"}};
  result.update(peer);
  return result;
}

// `script` beside this executable (the build copies the peers there), else `fallback` (its
// source).
inline std::string peer_script(const std::string& script, const std::string& fallback) {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string path(exe, static_cast<std::size_t>(n));
    path = path.substr(0, path.rfind('/') + 1) + script;
    if (::access(path.c_str(), R_OK) == 0) return path;
  }
  return fallback;
}

}  // namespace ferry::bench
