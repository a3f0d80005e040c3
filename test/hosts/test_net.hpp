// The "network" of the hosts' tests: a bridge in the test's namespace with the head's address and
// a network namespace per host on a veth pair (loopback addresses of their own where namespaces
// cannot be made), a private /dev/shm for each host where mount namespaces allow, and the job's
// secret file. Shared by the tests of a pool across hosts and of a launched job.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../catch.hpp"

namespace ferry::hosts::test {

// The `ferry` program every host of these tests runs.
inline const std::string kFerry = FERRY_BIN;

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A secret file of the job, mode 0600, removed at the end.
struct SecretFile {
  std::string path;
  explicit SecretFile(const std::string& text) {
    char tmpl[] = "/tmp/ferry-hosts-secret-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    ::close(fd);
    path = tmpl;
  }
  ~SecretFile() { ::unlink(path.c_str()); }
};

// Runs a shell command quietly; true when it succeeded.
inline bool sh(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Whether hosts can have a /dev/shm of their own (root, mount namespaces allowed).
inline bool private_shm_works() {
  static const bool works =
      sh("unshare -m --propagation private sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm'");
  return works;
}

// The "network" of one test: a bridge in this namespace with the head's address, and a network
// namespace per host with a veth pair onto the bridge. Names and the subnet come from this
// process's id, so two test processes do not meet. Falls back to loopback addresses.
class TestNet {
 public:
  TestNet() : tag_(std::to_string(::getpid() % 100000) + "n" + std::to_string(made_nets_++ % 100)) {
    const int x = static_cast<int>(::getpid() % 250) + 1;
    subnet_ = "10.117." + std::to_string(x) + ".";
    bridge_ = "fbr" + tag_;
    namespaces_ = sh("ip netns add fns" + tag_ + "-probe") &&
                  sh("ip netns del fns" + tag_ + "-probe") &&
                  sh("ip link add " + bridge_ + " type bridge") &&
                  sh("ip addr add " + subnet_ + "1/24 dev " + bridge_) &&
                  sh("ip link set " + bridge_ + " up");
    if (!namespaces_) {
      sh("ip link del " + bridge_);
      WARN(
          "no network namespaces here (needs root and iproute2): hosts run on loopback "
          "addresses of their own instead");
    }
  }
  ~TestNet() {
    // The veth pairs go at once (a namespace's own devices go when the kernel gets to it).
    for (const auto& veth : veths_) sh("ip link del " + veth);
    for (const auto& ns : made_) sh("ip netns del " + ns);
    if (namespaces_) sh("ip link del " + bridge_);
  }
  bool namespaces() const { return namespaces_; }
  std::string head_address() const { return namespaces_ ? subnet_ + "1" : "127.0.0.1"; }
  // Host i's address and namespace (empty without namespaces), made on first use.
  std::pair<std::string, std::string> host(int i) {
    if (!namespaces_) return {"127.0.0." + std::to_string(1 + i), ""};
    const std::string ns = "fns" + tag_ + "-" + std::to_string(i);
    const std::string outside = "fv" + tag_ + "o" + std::to_string(i);
    const std::string inside = "fv" + tag_ + "i" + std::to_string(i);
    const std::string address = subnet_ + std::to_string(1 + i);
    REQUIRE(sh("ip netns add " + ns));
    made_.push_back(ns);
    REQUIRE(sh("ip link add " + outside + " type veth peer name " + inside));
    veths_.push_back(outside);
    REQUIRE(sh("ip link set " + inside + " netns " + ns));
    REQUIRE(sh("ip link set " + outside + " master " + bridge_));
    REQUIRE(sh("ip link set " + outside + " up"));
    REQUIRE(sh("ip -n " + ns + " addr add " + address + "/24 dev " + inside));
    REQUIRE(sh("ip -n " + ns + " link set " + inside + " up"));
    REQUIRE(sh("ip -n " + ns + " link set lo up"));
    return {address, ns};
  }
  // Drops every packet between host i's namespace and the rest (an nftables rule inside it);
  // false where nft is missing.
  bool cut(int i) {
    const std::string ns = "fns" + tag_ + "-" + std::to_string(i);
    return sh("ip netns exec " + ns +
              " nft 'add table inet ferrycut; "
              "add chain inet ferrycut in { type filter hook input priority 0; policy drop; }; "
              "add chain inet ferrycut out { type filter hook output priority 0; policy drop; }'");
  }

 private:
  static inline int made_nets_ = 0;
  std::string tag_, subnet_, bridge_;
  bool namespaces_ = false;
  std::vector<std::string> made_, veths_;
};

// Forks and runs `argv` (searched on PATH) with the environment `env` (empty: this one), its
// stdout into the file `out` and its stderr into `err` (the same path: both into one file). The
// child dies with this process. Returns its pid.
inline pid_t spawn_logged(std::vector<std::string> argv, std::vector<std::string> env,
                          const std::string& out, const std::string& err) {
  std::vector<char*> args_c, env_c;
  for (auto& a : argv) args_c.push_back(a.data());
  args_c.push_back(nullptr);
  for (auto& e : env) env_c.push_back(e.data());
  env_c.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(120);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int e =
        err == out ? o : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (o >= 0) ::dup2(o, 1);
    if (e >= 0) ::dup2(e, 2);
    if (env.empty()) {
      ::execvp(args_c[0], args_c.data());
    } else {
      ::execvpe(args_c[0], args_c.data(), env_c.data());
    }
    ::_exit(127);
  }
  return pid;
}

}  // namespace ferry::hosts::test
