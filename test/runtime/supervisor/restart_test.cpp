// The restart policy carried out by a real pool: workers killed or crashing during their start
// (ferry-test-worker misbehaving by plan: test/workers/test_worker.cpp), slots given up, and a
// slow start that does not hold up the rest of the supervisor.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>
#include "../../catch.hpp"

#include "ipc/process.hpp"
#include "runtime/pool.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

// A start plan for the test worker, removed (and the variable unset) when the test ends.
struct StartPlan {
  std::string path = "/tmp/ferry-start-plan-" + std::to_string(::getpid());
  explicit StartPlan(const std::string& steps) {
    write(steps);
    ::setenv("FERRY_TEST_START_PLAN", path.c_str(), 1);
  }
  void write(const std::string& steps) const { std::ofstream(path, std::ios::trunc) << steps; }
  ~StartPlan() {
    ::unsetenv("FERRY_TEST_START_PLAN");
    ::unlink(path.c_str());
  }
};

PoolOptions spawned(int workers) {
  PoolOptions o;
  o.devices.assign(workers, "cpu");
  o.start = Start::Spawn;
  o.worker_executable = FERRY_TEST_WORKER;
  o.restart.backoff = 10ms;
  return o;
}

template <class Pred>
bool eventually(Pred p, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (!p()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

std::vector<Tensors> numbers(int n) {
  std::vector<Tensors> in;
  for (int i = 0; i < n; ++i) in.push_back({at::full({2}, static_cast<double>(i))});
  return in;
}

void check_squares(const std::vector<Tensors>& out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    REQUIRE(out[i][0][1].item<double>() == static_cast<double>(i * i));
  }
}

}  // namespace

TEST_CASE("a worker killed during its first start is started again, and the pool starts") {
  StartPlan plan("kill\nkill\n");
  Pool pool(spawned(2));
  const PoolStats s = pool.stats();
  int killed = 0;
  for (const auto& w : s.workers) {
    if (w.last_exit.find("during its start-up, killed by SIGKILL") != std::string::npos) ++killed;
    CHECK_FALSE(w.given_up);
  }
  CHECK(killed >= 1);
  check_squares(pool.map("square", numbers(50)));
}

TEST_CASE("a worker that keeps crashing at start fails the pool with its own exit, fast") {
  StartPlan plan("crash\ncrash\ncrash\ncrash\n");
  PoolOptions o = spawned(1);
  o.restart.max_start_crashes = 3;
  try {
    Pool pool(o);
    FAIL("the pool should not have started");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::handshake);
    CHECK_THAT(e.what(), Catch::Contains("worker 0 (cpu) ended during its start-up, exited with "
                                         "code 3") &&
                             Catch::Contains("3 failed starts in a row by its own fault"));
  }
}

TEST_CASE("a slot whose restarts keep failing is given up, and the pool finishes on the others") {
  StartPlan plan("");
  PoolOptions o = spawned(2);
  o.restart.max_start_crashes = 2;
  Pool pool(o);
  plan.write("crash\ncrash\n");
  const pid_t first = pool.worker_pids()[0];
  REQUIRE(::kill(first, SIGKILL) == 0);
  REQUIRE(eventually([&] { return pool.stats().workers[0].given_up; }, 20s));
  check_squares(pool.map("square", numbers(200)));
  const PoolStats s = pool.stats();
  CHECK(s.workers[0].pid == -1);
  CHECK_THAT(s.workers[0].last_exit, Catch::Contains("exited with code 3"));
  CHECK(s.workers[1].tasks_done >= 200);
  CHECK_FALSE(s.workers[1].given_up);
}

TEST_CASE("when every slot is given up, waiting tasks fail naming the last start error") {
  StartPlan plan("");
  PoolOptions o = spawned(1);
  o.restart.max_start_crashes = 2;
  o.max_retries = 5;
  Pool pool(o);
  plan.write("crash\ncrash\n");
  auto lost = pool.submit("segfault", {});
  try {
    lost.get();
    FAIL("the task should have failed");
  } catch (const TaskError& e) {
    CHECK(e.code() == Errc::worker_lost);
    CHECK_THAT(e.what(), Catch::Contains("no worker can be started") &&
                             Catch::Contains("exited with code 3"));
  }
  CHECK_THROWS_WITH(pool.submit("square", {at::ones({1})}),
                    Catch::Contains("no worker can be started"));
  CHECK(pool.stats().workers[0].given_up);
}

TEST_CASE("while one worker is slow to start, another's death is handled and its work retried") {
  StartPlan plan("");
  PoolOptions o = spawned(3);
  Pool pool(o);
  // The next start takes a minute; the waits below are generous for a loaded machine, and the
  // test ends (killing that start) as soon as they hold.
  plan.write("sleep:60000\n");
  const auto before = pool.worker_pids();
  REQUIRE(::kill(before[0], SIGKILL) == 0);
  // Worker 0 is reaped and its slow restart under way (the plan's line is taken).
  REQUIRE(eventually([&] { return pool.worker_pids()[0] == -1; }, 30s));
  REQUIRE(eventually([&] { return std::ifstream(plan.path).peek() == EOF; }, 30s));
  REQUIRE(::kill(before[1], SIGKILL) == 0);
  // Worker 1 comes back and the pool computes, all while worker 0 is still starting.
  REQUIRE(eventually(
      [&] {
        const pid_t p = pool.worker_pids()[1];
        return p > 0 && p != before[1];
      },
      30s));
  check_squares(pool.map("square", numbers(30)));
  CHECK(pool.worker_pids()[0] == -1);
}

}  // namespace ferry
