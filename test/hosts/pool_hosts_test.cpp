// A pool across hosts as a user runs one: the head is a ferry::Pool in this process with a
// HeadHub; each other host is a real `ferry host` process in a network namespace of its own,
// joined to the head's by a veth pair on a bridge, with a private /dev/shm (a mount namespace
// with a tmpfs), so nothing passes between "hosts" but the network. Where namespaces cannot be
// made (not root), each host gets a loopback address of its own (127.0.0.2, .3, ...) instead,
// and the test says so. Workers are spawned (ferry-test-worker's tasks: sleep_echo and
// fail_if_negative), here and on the hosts.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include "../catch.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.hpp"
#include "hosts/head_hub.hpp"
#include "runtime/pool.hpp"
#include "test_net.hpp"

namespace ferry::hosts {
namespace {

using namespace std::chrono_literals;
using Catch::Contains;
using namespace test;  // the test network (test_net.hpp)

const std::string kTestWorker = FERRY_TEST_WORKER;
constexpr auto kHeartbeat = 100ms;
constexpr auto kLostAfter = 1500ms;
const std::string kSecret = "the-job-secret-of-the-hosts-tests";

// `ferry host` as its own process: dies with the test; SIGKILL on destruction if still running.
class HostProcess {
 public:
  HostProcess(TestNet& net, int index, std::uint16_t port, const std::string& secret_file,
              int workers = 1)
      : name_("h" + std::to_string(index)),
        log_("/tmp/ferry-hosts-test-" + std::to_string(::getpid()) + "-" + name_ + ".log") {
    const auto [address, ns] = net.host(index);
    std::vector<std::string> argv;
    if (!ns.empty()) argv = {"ip", "netns", "exec", ns};
    if (private_shm_works()) {
      argv.insert(argv.end(), {"unshare", "-m", "--propagation", "private", "sh", "-c",
                               "mount -t tmpfs -o size=256m tmpfs /dev/shm && exec \"$0\" \"$@\""});
    } else {
      WARN("hosts share this machine's /dev/shm: no mount namespace here (needs root)");
    }
    for (std::string a : {kFerry,
                          std::string("host"),
                          std::string("--join"),
                          net.head_address() + ":" + std::to_string(port),
                          std::string("--workers"),
                          std::to_string(workers),
                          std::string("--start"),
                          std::string("spawn"),
                          std::string("--worker"),
                          kTestWorker,
                          std::string("--secret-file"),
                          secret_file,
                          std::string("--address"),
                          address,
                          std::string("--name"),
                          name_,
                          std::string("--heartbeat-ms"),
                          std::to_string(kHeartbeat.count()),
                          std::string("--lost-after-ms"),
                          std::to_string(kLostAfter.count()),
                          std::string("--join-timeout-ms"),
                          std::string("20000")}) {
      argv.push_back(a);
    }
    pid_ = test::spawn_logged(std::move(argv), {}, log_, log_);
  }
  ~HostProcess() {
    if (!reaped_) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::unlink(log_.c_str());
  }
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  std::string log() const { return slurp(log_); }
  void signal(int sig) const { ::kill(pid_, sig); }
  // Its exit code, waiting at most `limit`; minus the signal that killed it; -1000 if it is still
  // running.
  int wait_exit(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) return -1000;
      std::this_thread::sleep_for(20ms);
    }
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

 private:
  std::string name_, log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

struct Head {
  std::shared_ptr<HeadHub> hub;
  std::unique_ptr<Pool> pool;
  Head(const TestNet& net, const std::string& secret, int local_workers = 1) {
    HubOptions h;
    h.address = net.head_address();
    h.secret = Secret::from_bytes(secret, "the test");
    h.heartbeat = kHeartbeat;
    h.lost_after = kLostAfter;
    hub = std::make_shared<HeadHub>(std::move(h));
    PoolOptions o;
    o.devices.assign(static_cast<std::size_t>(local_workers), "cpu");
    o.start = Start::Spawn;
    o.worker_executable = kTestWorker;
    o.remote = hub;
    o.max_retries = 3;
    pool = std::make_unique<Pool>(o);
  }
  std::uint16_t port() const { return hub->port(); }
};

// sleep_echo's inputs: sleep `us`, return `i` (so each result names its input).
Tensors sleep_echo(std::int64_t us, std::int64_t i) {
  return {at::scalar_tensor(us, at::kLong), at::full({4}, static_cast<double>(i), at::kDouble)};
}

void check_in_order(const std::vector<Tensors>& out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    REQUIRE(out[i].size() == 1);
    REQUIRE(out[i][0].equal(at::full({4}, static_cast<double>(i), at::kDouble)));
  }
}

// Waits for `pred`, at most `limit` (then fails the test rather than hang it).
template <class Pred>
void await(Pred pred, std::chrono::seconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(5ms);
  }
}

// The stats of the slot of host `name` (hosts join in any order).
WorkerStats host_stats(const Pool& pool, const std::string& name) {
  for (const WorkerStats& w : pool.stats().workers) {
    if (w.remote && w.device.rfind("host " + name + " ", 0) == 0) return w;
  }
  FAIL("no slot for host " << name);
  return {};
}

// Tasks done by the remote slots of `pool`, by slot.
std::vector<std::uint64_t> remote_done(const Pool& pool) {
  std::vector<std::uint64_t> done;
  for (const WorkerStats& w : pool.stats().workers) {
    if (w.remote) done.push_back(w.tasks_done);
  }
  return done;
}

// The head and two hosts, h1 (`a`) and h2 (`b`), both joined.
struct TwoHostJob {
  SecretFile secret{kSecret};
  TestNet net;
  Head head{net, kSecret};
  HostProcess a{net, 1, head.port(), secret.path};
  HostProcess b{net, 2, head.port(), secret.path};
  TwoHostJob() { REQUIRE(head.hub->wait_for_hosts(2, 60s)); }
};

// Maps `count` 10 ms sleep_echo tasks over the head and its hosts, calling `act` once host
// `a` has done 5 of them (so tasks are in flight there when it acts); every result must come
// back, in input order, whatever `act` did to the host.
void map_acting_on(Head& head, const HostProcess& a, std::int64_t count,
                   const std::function<void()>& act) {
  std::vector<Tensors> inputs;
  for (std::int64_t i = 0; i < count; ++i) inputs.push_back(sleep_echo(10000, i));
  std::thread actor([&] {
    await([&] { return host_stats(*head.pool, a.name()).tasks_done >= 5; });
    act();
  });
  const std::vector<Tensors> out = head.pool->map("sleep_echo", inputs);
  actor.join();
  check_in_order(out);
}

}  // namespace

TEST_CASE("hosts: a map over the head and three hosts gives each result once, in input order",
          "[hosts]") {
  const SecretFile secret(kSecret);
  TestNet net;
  Head head(net, kSecret);
  std::vector<std::unique_ptr<HostProcess>> hosts;
  for (int i = 1; i <= 3; ++i) {
    hosts.push_back(std::make_unique<HostProcess>(net, i, head.port(), secret.path));
  }
  REQUIRE(head.hub->wait_for_hosts(3, 60s));
  std::vector<Tensors> inputs;
  for (std::int64_t i = 0; i < 240; ++i) inputs.push_back(sleep_echo(2000, i));
  const std::vector<Tensors> out = head.pool->map("sleep_echo", inputs);
  check_in_order(out);
  const PoolStats s = head.pool->stats();
  CHECK(s.completed == 240);
  CHECK(s.retried == 0);
  const auto done = remote_done(*head.pool);
  REQUIRE(done.size() == 3);
  for (const auto d : done) CHECK(d > 0);  // every host took work
  // A task's own failure on a host comes back as that task's error, with the host's words.
  auto failing = head.pool->submit("fail_if_negative", {at::scalar_tensor(-7, at::kLong)});
  std::string said;
  try {
    failing.get();
  } catch (const std::exception& e) {
    said = e.what();
  }
  CHECK_THAT(said, Contains("asked to fail on -7"));
  head.pool->close();
  for (auto& h : hosts) CHECK(h->wait_exit(20s) == 0);  // the head's job ended: exit 0
  CHECK(head.hub->stats().lost == 0);
}

TEST_CASE("hosts: a host SIGKILLed mid-run loses no task, the others finish its work", "[hosts]") {
  TwoHostJob job;
  Head& head = job.head;
  HostProcess& a = job.a;
  map_acting_on(head, a, 200, [&] { a.signal(SIGKILL); });
  const PoolStats s = head.pool->stats();
  CHECK(s.completed == 200);
  CHECK(s.failed == 0);
  CHECK(s.retried >= 1);  // its tasks in flight ran again elsewhere
  CHECK(head.hub->stats().lost == 1);
  const WorkerStats lost = host_stats(*head.pool, a.name());
  CHECK(lost.given_up);
  CHECK(lost.tasks_lost >= 1);
}

TEST_CASE(
    "hosts: a host frozen by SIGSTOP is dropped after lost_after and its tasks run "
    "elsewhere, when it wakes it finds itself dropped and exits",
    "[hosts]") {
  TwoHostJob job;
  Head& head = job.head;
  HostProcess& a = job.a;
  std::chrono::steady_clock::time_point stopped;
  map_acting_on(head, a, 150, [&] {
    stopped = std::chrono::steady_clock::now();
    a.signal(SIGSTOP);
  });
  const auto noticed = std::chrono::steady_clock::now() - stopped;
  CHECK(head.hub->stats().lost == 1);
  CHECK(head.pool->stats().failed == 0);
  CHECK(host_stats(*head.pool, a.name()).given_up);
  CHECK(noticed < kLostAfter + 10s);  // seconds, not Gloo's 30-minute default
  a.signal(SIGCONT);
  const int code = a.wait_exit(20s);
  INFO(a.log());
  CHECK(code == 3);  // it finds the head gone from its link: lost the head
  CHECK_THAT(a.log(), Contains("lost the head"));
}

TEST_CASE(
    "hosts: a host whose network is cut (nftables drop) is dropped after lost_after, no "
    "task is lost",
    "[hosts]") {
  const SecretFile secret(kSecret);
  TestNet net;
  if (!net.namespaces()) {
    WARN("SKIP: cutting one host's network needs network namespaces (root, iproute2)");
    return;
  }
  Head head(net, kSecret);
  HostProcess a(net, 1, head.port(), secret.path), b(net, 2, head.port(), secret.path);
  REQUIRE(head.hub->wait_for_hosts(2, 60s));
  if (!sh("command -v nft")) {
    WARN("SKIP: cutting one host's network needs nft (apt-get install nftables)");
    return;
  }
  std::chrono::steady_clock::time_point when;
  bool cut = false;
  map_acting_on(head, a, 150, [&] {
    when = std::chrono::steady_clock::now();
    cut = net.cut(1);
  });
  REQUIRE(cut);
  CHECK(std::chrono::steady_clock::now() - when < kLostAfter + 10s);
  CHECK(head.hub->stats().lost == 1);
  CHECK(head.pool->stats().failed == 0);
  CHECK(host_stats(*head.pool, a.name()).given_up);
  CHECK(host_stats(*head.pool, b.name()).tasks_done > 0);
  const int code = a.wait_exit(20s);  // cut off, it stops hearing the head
  INFO(a.log());
  CHECK(code == 3);
}

TEST_CASE("hosts: a host with the wrong secret gets nothing and is told so", "[hosts]") {
  const SecretFile good(kSecret), bad("a-different-secret-of-enough-bytes");
  TestNet net;
  Head head(net, kSecret);
  HostProcess intruder(net, 1, head.port(), bad.path);
  CHECK(intruder.wait_exit(30s) == 3);
  // The head's answer to its challenge is already wrong, so the host sends no proof at all.
  CHECK_THAT(intruder.log(), Contains("does not hold this job's secret"));
  CHECK(head.hub->stats().refused == 1);
  CHECK(head.hub->stats().joined == 0);
  // The pool goes on with its own workers.
  check_in_order(head.pool->map("sleep_echo", {sleep_echo(0, 0), sleep_echo(0, 1)}));
}

TEST_CASE("hosts: a host that joins a running job takes work", "[hosts]") {
  const SecretFile secret(kSecret);
  TestNet net;
  Head head(net, kSecret);
  HostProcess first(net, 1, head.port(), secret.path);
  REQUIRE(head.hub->wait_for_hosts(1, 60s));
  const std::size_t before = head.pool->capacity();
  std::unique_ptr<HostProcess> late;
  // Half way through the stream a second host starts; the second half waits for it to join.
  auto make = [&](std::size_t i) {
    if (i == 200) {
      late = std::make_unique<HostProcess>(net, 2, head.port(), secret.path);
      REQUIRE(head.hub->wait_for_hosts(2, 60s));
    }
    return sleep_echo(10000, static_cast<std::int64_t>(i));
  };
  auto stream = head.pool->imap_unordered("sleep_echo", 400, make);
  std::size_t n = 0;
  while (auto r = stream.next()) {
    CHECK(r->get()[0].equal(at::full({4}, static_cast<double>(r->index), at::kDouble)));
    ++n;
  }
  CHECK(n == 400);
  CHECK(head.pool->capacity() > before);
  const auto done = remote_done(*head.pool);
  REQUIRE(done.size() == 2);
  CHECK(done.at(1) > 0);  // the late host ran some
}

TEST_CASE("hosts: SIGTERM to a host says goodbye, the head runs its tasks elsewhere at once",
          "[hosts]") {
  TwoHostJob job;
  Head& head = job.head;
  HostProcess& a = job.a;
  map_acting_on(head, a, 150, [&] { a.signal(SIGTERM); });
  CHECK(a.wait_exit(20s) == 128 + SIGTERM);
  CHECK_THAT(a.log(), Contains("stopped; the head was told"));
  CHECK(host_stats(*head.pool, a.name()).last_exit == "it left");
}

}  // namespace ferry::hosts
