// A job launched as clusters launch one: every rank is the same `ferry run` command, told who it
// is by the variables torchrun, srun or a hand-written env:// launch would set. Rank 0 runs in
// this test's network namespace, every other rank in a namespace of its own with a private
// /dev/shm (test_net.hpp), so nothing passes between ranks but the network. Neither of this
// project's stacks can run torchrun as shipped (docs/multi-host.md), so these start the ranks
// exactly as it would: the same variables, a dead rank restarted with its rank and a higher
// TORCHELASTIC_RESTART_COUNT, and (PyTorch 2.4 and later) torchrun's own store at
// MASTER_ADDR:MASTER_PORT, played here by a TCPStore of this process.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

// c10d's headers before Catch's: glog's CHECK would otherwise replace Catch's.
#include "hosts/host_store.hpp"

#include "../catch.hpp"
#include "../test_util.hpp"
#include "test_net.hpp"

extern char** environ;

namespace ferry::hosts {
namespace {

using namespace std::chrono_literals;
using Catch::Contains;
using namespace test;  // the test network (test_net.hpp)

const std::string kSecret = "the-job-secret-of-the-launch-tests";
using Vars = std::map<std::string, std::string>;

// A port that nothing listens on now, from the kernel: bound, read, closed.
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// One rank: `ferry run ARGS` with this process's environment, less any launcher's, plus `vars`;
// in the namespace `ns` (none: this one). Killed at the end if still running.
class Rank {
 public:
  Rank(const std::string& ns, const Vars& vars, const std::vector<std::string>& args)
      : out_(temp("out")), err_(temp("err")) {
    std::vector<std::string> argv;
    if (!ns.empty()) {
      argv = {"ip", "netns", "exec", ns};
      if (private_shm_works()) {
        argv.insert(argv.end(),
                    {"unshare", "-m", "--propagation", "private", "sh", "-c",
                     "mount -t tmpfs -o size=256m tmpfs /dev/shm && exec \"$0\" \"$@\""});
      }
    }
    argv.push_back(kFerry);
    argv.push_back("run");
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const std::string name = kv.substr(0, kv.find('='));
      if (vars.count(name) || name == "RANK" || name == "WORLD_SIZE" || name == "FERRY_SECRET" ||
          name.rfind("SLURM_", 0) == 0 || name.rfind("TORCHELASTIC_", 0) == 0) {
        continue;
      }
      env.push_back(kv);
    }
    for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
    pid_ = test::spawn_logged(std::move(argv), std::move(env), out_, err_);
  }
  ~Rank() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::unlink(out_.c_str());
    ::unlink(err_.c_str());
  }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

  std::string out() const { return slurp(out_); }
  std::string err() const { return slurp(err_); }
  void kill() const { ::kill(pid_, SIGKILL); }
  // Its exit code, or minus the signal that ended it; fails the test after `limit`.
  int wait_exit(std::chrono::seconds limit = ferry::test::kUnderTsan ? 300s : 90s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) != pid_) {
      if (std::chrono::steady_clock::now() > deadline) {
        INFO(err());
        FAIL("a rank still runs after " << limit.count() << " s");
      }
      std::this_thread::sleep_for(20ms);
    }
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  // Waits until its stderr holds `text`.
  void await_err(const std::string& text, std::chrono::seconds limit = 60s) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (err().find(text) == std::string::npos) {
      INFO(err());
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(20ms);
    }
  }

 private:
  static std::string temp(const char* what) {
    static int made = 0;
    return "/tmp/ferry-launch-test-" + std::to_string(::getpid()) + "-" + std::to_string(made++) +
           "." + what;
  }
  std::string out_, err_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// A job of `world` ranks on `net`: rank 0 here, rank i in host namespace i.
struct Job {
  SecretFile secret{kSecret};
  TestNet net;
  std::uint16_t port = free_port();
  int world = 3;
  // Every rank's variables as torchrun (`torchrun` true) or a plain env:// launch sets them.
  Vars vars(int rank, bool torchrun = false, int restart = 0) const {
    Vars v{{"RANK", std::to_string(rank)},
           {"WORLD_SIZE", std::to_string(world)},
           {"MASTER_ADDR", net.head_address()},
           {"MASTER_PORT", std::to_string(port)},
           {"FERRY_SECRET_FILE", secret.path}};
    if (torchrun) {
      v.insert({{"LOCAL_RANK", "0"},
                {"LOCAL_WORLD_SIZE", "1"},
                {"GROUP_RANK", std::to_string(rank)},
                {"TORCHELASTIC_RUN_ID", "launch-test"},
                {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
                {"TORCHELASTIC_MAX_RESTARTS", "1"},
                {"TORCHELASTIC_USE_AGENT_STORE", "False"}});
    }
    return v;
  }
  // Rank i's address and namespace (none for rank 0), made on first use.
  std::pair<std::string, std::string> where(int rank) {
    if (rank == 0) return {net.head_address(), ""};
    auto it = made.find(rank);
    if (it == made.end()) it = made.emplace(rank, net.host(rank)).first;
    return it->second;
  }
  std::string ns(int rank) { return where(rank).second; }
  std::map<int, std::pair<std::string, std::string>> made;
};

// Each rank's pool: one worker, forked (spawned under TSan, which cannot follow a fork from a
// process with threads whose child starts threads: test/CMakeLists.txt).
const std::vector<std::string> kWork = {"--workers", "1",
                                        "--start",   ferry::test::kUnderTsan ? "spawn" : "fork",
                                        "--json",    "--heartbeat-ms",
                                        "100",       "--lost-after-ms",
                                        "3000"};

std::vector<std::string> work(std::initializer_list<std::string> more) {
  std::vector<std::string> a = kWork;
  a.insert(a.end(), more);
  return a;
}

// Rank 0's JSON summary: every task done once, none failed, `hosts` joined; each host slot's
// name and the tasks it did, in the order they joined.
std::vector<std::pair<std::string, std::uint64_t>> check_summary(const Rank& head,
                                                                 std::size_t tasks,
                                                                 std::uint64_t joined) {
  INFO(head.err());
  const nlohmann::json s = nlohmann::json::parse(head.out());
  CHECK(s["tasks"].get<std::size_t>() == tasks);
  CHECK(s["failed"].get<std::size_t>() == 0);
  CHECK(s["broken"].get<std::string>().empty());
  CHECK(s["hosts"]["joined"].get<std::uint64_t>() == joined);
  CHECK(s["hosts"]["refused"].get<std::uint64_t>() == 0);
  std::vector<std::pair<std::string, std::uint64_t>> by_host;
  std::uint64_t done = 0;
  for (const auto& w : s["workers"]) {
    done += w["tasks"].get<std::uint64_t>();
    const std::string device = w["device"].get<std::string>();
    if (device.rfind("host ", 0) == 0)
      by_host.emplace_back(device, w["tasks"].get<std::uint64_t>());
  }
  CHECK(done == tasks);  // each task ended once, wherever it ran
  return by_host;
}

}  // namespace

TEST_CASE("launch: three ranks started with env:// variables form one job", "[hosts][launch]") {
  Job job;
  Rank r1(job.ns(1), job.vars(1), work({"--batches", "900"}));
  Rank r2(job.ns(2), job.vars(2), work({"--batches", "900"}));
  Rank r0(job.ns(0), job.vars(0), work({"--batches", "900"}));
  REQUIRE(r0.wait_exit() == 0);
  const auto hosts = check_summary(r0, 900, 2);
  REQUIRE(hosts.size() == 2);
  for (const auto& [name, done] : hosts) {
    INFO(name);
    CHECK(done > 0);
    CHECK_THAT(name, Contains("/rank"));
  }
  CHECK(r1.wait_exit() == 0);
  CHECK(r2.wait_exit() == 0);
  CHECK_THAT(r1.err(), Contains("as rank 1 of 3 (env://)"));
  CHECK_THAT(r0.err(), Contains("rank 0 of 3 (env://): the head"));
}

TEST_CASE("launch: a host rank killed and restarted as torchrun restarts it rejoins, no task lost",
          "[hosts][launch]") {
  Job job;
  const std::vector<std::string> args = work({"--batches", "4000"});
  Rank r0(job.ns(0), job.vars(0, true), args);
  auto r1 = std::make_unique<Rank>(job.ns(1), job.vars(1, true), args);
  Rank r2(job.ns(2), job.vars(2, true), args);
  r1->await_err("as rank 1 of 3 (torchrun)");
  // Tasks in flight on it: a host joins before its workers start, which under TSan (spawned, and
  // slower) takes seconds.
  std::this_thread::sleep_for(ferry::test::kUnderTsan ? 4s : 500ms);
  r1->kill();
  CHECK(r1->wait_exit() == -SIGKILL);
  // The launcher starts the rank again: the same rank, its restart counted.
  Rank again(job.ns(1), job.vars(1, true, 1), args);
  again.await_err("as rank 1 of 3 (torchrun, restart 1)");
  REQUIRE(r0.wait_exit() == 0);
  const auto hosts = check_summary(r0, 4000, 3);
  INFO(r0.out());
  CHECK(nlohmann::json::parse(r0.out())["hosts"]["lost"] == 1);
  // The restarted rank is a slot of its own, and took work.
  std::vector<std::uint64_t> rank1;
  for (const auto& [name, done] : hosts) {
    if (name.find("/rank1") != std::string::npos) rank1.push_back(done);
  }
  REQUIRE(rank1.size() == 2);
  if (!ferry::test::kUnderTsan) CHECK(rank1[0] > 0);
  CHECK(rank1[1] > 0);
  CHECK(again.wait_exit() == 0);
  CHECK(r2.wait_exit() == 0);
}

TEST_CASE("launch: under torchrun's own store, rank 0 says there where it listens",
          "[hosts][launch]") {
  Job job;
  job.world = 2;
  // torchrun (PyTorch 2.4 and later) serves its store at MASTER_ADDR:MASTER_PORT for the ranks.
  const auto agent_store = listen_store(job.net.head_address(), job.port, 30s);
  Vars v0 = job.vars(0, true), v1 = job.vars(1, true);
  v0["TORCHELASTIC_USE_AGENT_STORE"] = v1["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  Rank r1(job.ns(1), v1, work({"--batches", "300"}));
  Rank r0(job.ns(0), v0, work({"--batches", "300"}));
  REQUIRE(r0.wait_exit() == 0);
  CHECK(check_summary(r0, 300, 1).size() == 1);
  CHECK(r1.wait_exit() == 0);
  // A second rank 0 of the same run finds the first one's claim.
  Rank twice(job.ns(0), v0, work({"--batches", "10"}));
  CHECK(twice.wait_exit() == 3);
  CHECK_THAT(twice.err(), Contains("already claimed rank 0"));
}

TEST_CASE("launch: srun's variables, the head the first node of the step's list",
          "[hosts][launch]") {
  Job job;
  job.world = 2;
  const std::string head = job.net.head_address();
  const std::string host = job.where(1).first;
  // SLURM derives no port; with no MASTER_PORT, ferry takes one from the job's id.
  const std::string job_id = std::to_string(10000 + job.port % 10000);
  auto vars = [&](int rank) {
    return Vars{{"SLURM_PROCID", std::to_string(rank)},
                {"SLURM_NTASKS", "2"},
                {"SLURM_STEP_ID", "0"},
                {"SLURM_JOB_ID", job_id},
                {"SLURM_STEP_NODELIST", head + "," + host},
                {"FERRY_SECRET_FILE", job.secret.path}};
  };
  Rank r1(job.ns(1), vars(1), work({"--batches", "300"}));
  Rank r0(job.ns(0), vars(0), work({"--batches", "300"}));
  REQUIRE(r0.wait_exit() == 0);
  CHECK(check_summary(r0, 300, 1).size() == 1);
  CHECK(r1.wait_exit() == 0);
  CHECK_THAT(r1.err(), Contains("as rank 1 of 2 (SLURM)"));
  CHECK_THAT(r0.err(), Contains(":" + std::to_string(20000 + std::stoi(job_id) % 10000)));
}

TEST_CASE("launch: without the job's secret every rank refuses to start", "[hosts][launch]") {
  Job job;
  for (int rank : {0, 1}) {
    Vars v = job.vars(rank);
    v.erase("FERRY_SECRET_FILE");
    Rank r("", v, work({"--batches", "10"}));
    CHECK(r.wait_exit() == 3);
    CHECK_THAT(r.err(), Contains("rank " + std::to_string(rank) + " of 3 (env://)") &&
                            Contains("no shared secret") && Contains("FERRY_SECRET_FILE"));
  }
}

TEST_CASE("launch: ranks given different tasks both stop, naming the difference",
          "[hosts][launch]") {
  Job job;
  job.world = 2;
  Rank r1(job.ns(1), job.vars(1), work({"--task", "square", "--batches", "10"}));
  Rank r0(job.ns(0), job.vars(0), work({"--task", "mlp", "--batches", "10"}));
  CHECK(r0.wait_exit() == 3);
  CHECK(r1.wait_exit() == 3);
  CHECK_THAT(r1.err(), Contains("ranks disagree on the task") &&
                           Contains("was given --task square, rank 0 runs mlp"));
  CHECK_THAT(r0.err(), Contains("refused or declined the job"));
}

TEST_CASE("launch: a world that never fills ends rank 0 with exit 3, naming who is missing",
          "[hosts][launch]") {
  Job job;
  Rank r0("", job.vars(0), work({"--batches", "10", "--join-timeout-ms", "1500"}));
  CHECK(r0.wait_exit() == 3);
  CHECK_THAT(r0.err(), Contains("0 of the other 2 rank(s) joined within 1500 ms"));
}

TEST_CASE("launch: --launch off runs on this machine alone, whatever the variables say",
          "[hosts][launch]") {
  Job job;
  // A rank of some other job that runs ferry on its own machine: no head anywhere.
  Rank alone("", job.vars(1), work({"--batches", "20", "--launch", "off"}));
  REQUIRE(alone.wait_exit() == 0);
  INFO(alone.err());
  const nlohmann::json s = nlohmann::json::parse(alone.out());
  CHECK(s["tasks"] == 20);
  CHECK_FALSE(s.contains("hosts"));
}

TEST_CASE("launch: rank 0 where MASTER_ADDR does not point, given twice, or unresolvable",
          "[hosts][launch]") {
  Job job;
  job.world = 2;
  {  // rank 0 started on a machine MASTER_ADDR does not name
    Vars v = job.vars(0);
    v["MASTER_ADDR"] = "192.0.2.1";  // TEST-NET-1: nobody's
    Rank r("", v, work({"--batches", "10"}));
    CHECK(r.wait_exit() == 3);
    CHECK_THAT(r.err(), Contains("'192.0.2.1' (192.0.2.1) is not an address of this machine"));
  }
  {  // two ranks given rank 0 on one machine: the second cannot take the port
    Rank first("", job.vars(0), work({"--batches", "10", "--join-timeout-ms", "20000"}));
    first.await_err("the head, on");
    Rank second("", job.vars(0), work({"--batches", "10"}));
    CHECK(second.wait_exit() == 3);
    CHECK_THAT(second.err(), Contains("a second rank given rank 0"));
    first.kill();
  }
  {
    Vars v = job.vars(0);
    v["MASTER_ADDR"] = "no-such-head.invalid";
    Rank r("", v, work({"--batches", "10"}));
    CHECK(r.wait_exit() == 3);
    CHECK_THAT(r.err(), Contains("cannot resolve its own address 'no-such-head.invalid'"));
  }
}

}  // namespace ferry::hosts
