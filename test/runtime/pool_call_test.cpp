// Pool::call: a caller that waits for its task takes the result from the worker itself, and
// the pool's collector takes every result no caller waits for, across real worker processes.
#include <signal.h>

#include <atomic>
#include <random>
#include <thread>

#include "runtime/pool.hpp"
#include "test_pools.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::cpu_pool;
using test::delayed;

bool holds(const Tensors& out, std::int64_t value) {
  return out.size() == 1 && out[0].equal(at::full({4}, value, at::kLong));
}

}  // namespace

TEST_CASE("calls one at a time: each caller takes its own result from the worker") {
  Pool pool(cpu_pool(2));
  for (int i = 0; i < 300; ++i) {
    std::optional<Tensors> out = pool.call("sleep_echo", delayed(0, i)).wait();
    REQUIRE(out);
    REQUIRE(holds(*out, i));
  }
  // Every result went through a caller, none through a collector thread.
  CHECK(pool.stats().results_taken_by_callers == 300);
  CHECK(pool.stats().completed == 300);
}

TEST_CASE("calls beside submitted tasks: every result comes once, the collector takes the rest") {
  PoolOptions o = cpu_pool(1);  // one worker: the calls' and the submits' results share a queue
  Pool pool(o);
  constexpr int kEach = 300;
  std::vector<std::future<Tensors>> submitted;
  std::atomic<int> called{0};
  std::thread caller([&] {
    for (int i = 0; i < kEach; ++i) {
      std::optional<Tensors> out = pool.call("sleep_echo", delayed(i % 5 == 0 ? 300 : 0, i)).wait();
      if (out && holds(*out, i)) ++called;
    }
  });
  for (int i = 0; i < kEach; ++i) submitted.push_back(pool.submit("sleep_echo", delayed(0, -i)));
  for (int i = 0; i < kEach; ++i) {
    REQUIRE(submitted[i].wait_for(30s) == std::future_status::ready);
    CHECK(holds(submitted[i].get(), -i));
  }
  caller.join();
  CHECK(called == kEach);
  const PoolStats s = pool.stats();
  CHECK(s.completed == 2 * kEach);
  CHECK(s.results_taken_by_callers <= static_cast<std::uint64_t>(kEach));  // their own at most
}

TEST_CASE("a call no one waits for any more leaves its result to the pool's collector") {
  Pool pool(cpu_pool(1));
  {
    Pool::Call c = pool.call("sleep_echo", delayed(300000, 7));
    CHECK_FALSE(c.wait(20ms));  // not yet; wait() may be called again
    std::optional<Tensors> out = c.wait(0ms);
    CHECK_FALSE(out);
  }  // dropped while the task runs: its result is the collector's now
  const auto deadline = Clock::now() + 10s;
  while (pool.stats().completed < 1 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  CHECK(pool.stats().completed == 1);
  CHECK(pool.stats().results_taken_by_callers == 0);
  // And a call after it takes its own result again.
  std::optional<Tensors> out = pool.call("sleep_echo", delayed(0, 8)).wait();
  REQUIRE(out);
  CHECK(holds(*out, 8));
}

TEST_CASE("a pool closing with Drain takes the results of calls still held but not waited on") {
  PoolOptions o = cpu_pool(1);
  o.shutdown = Shutdown::Drain;
  o.drain_timeout = 60s;
  Pool pool(o);
  Pool::Call held = pool.call("sleep_echo", delayed(200000, 3));  // never waited on
  const auto start = Clock::now();
  pool.close();  // the collector drains it; without it the drain would wait out its 60 s
  CHECK(Clock::now() - start < 20s);
  CHECK(pool.stats().completed == 1);
  std::optional<Tensors> out = held.wait(0ms);
  REQUIRE(out);
  CHECK(holds(*out, 3));
}

TEST_CASE("a call whose worker is SIGKILLed is retried and its caller gets the result") {
  PoolOptions o = cpu_pool(2);
  o.max_retries = 2;
  Pool pool(o);
  Pool::Call c = pool.call("sleep_echo", delayed(400000, 5));
  std::this_thread::sleep_for(100ms);
  for (pid_t p : pool.worker_pids()) {
    if (p > 0) ::kill(p, SIGKILL);  // whichever holds it
  }
  std::optional<Tensors> out = c.wait(60s);
  REQUIRE(out);
  CHECK(holds(*out, 5));
  CHECK(pool.stats().retried >= 1);
}

TEST_CASE("calls while workers are SIGKILLed at random moments: each ends once, with its value") {
  PoolOptions o = cpu_pool(2);
  o.max_retries = 8;
  Pool pool(o);
  std::atomic<bool> done{false};
  std::atomic<int> calls_done{0}, kills{0};
  std::thread killer([&] {
    std::mt19937 rng(7);
    int killed_at = 0;
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 + rng() % 30));
      if (calls_done - killed_at < 10) continue;  // a kill once some calls have ended since
      const auto pids = pool.worker_pids();
      const pid_t victim = pids[rng() % pids.size()];
      if (victim > 0 && ::kill(victim, SIGKILL) == 0) {
        ++kills;
        killed_at = calls_done;
      }
    }
  });
  int lost = 0;
  const int calls = test::kUnderTsan ? 150 : 400;
  for (int i = 0; i < calls; ++i) {
    Pool::Call c = pool.call("sleep_echo", delayed(i % 3 == 0 ? 2000 : 0, i));
    try {
      std::optional<Tensors> out = c.wait(120s);
      REQUIRE(out);
      REQUIRE(holds(*out, i));
    } catch (const TaskError& e) {
      CHECK(e.code() == Errc::worker_lost);  // its retries spent on kills
      ++lost;
    }
    ++calls_done;
  }
  done = true;
  killer.join();
  CHECK(kills >= 3);
  const PoolStats s = pool.stats();
  CHECK(s.completed + static_cast<std::uint64_t>(lost) == static_cast<std::uint64_t>(calls));
  WARN(kills << " kills, " << s.retried << " retries, " << lost << " calls lost, "
             << s.results_taken_by_callers << " results taken by their callers");
  std::optional<Tensors> after = pool.call("sleep_echo", delayed(0, -1)).wait(60s);
  REQUIRE(after);
  CHECK(holds(*after, -1));
}

TEST_CASE("a call that fails throws its TaskError from wait()") {
  Pool pool(cpu_pool(1));
  Pool::Call c = pool.call("fail_if_negative", {at::full({1}, -3, at::kLong)});
  try {
    c.wait(30s);
    FAIL("no error");
  } catch (const TaskError& e) {
    CHECK(e.code() == Errc::task_failed);
    CHECK_THAT(e.what(), Catch::Contains("asked to fail on -3"));
  }
  // Waiting again says the same.
  CHECK_THROWS_AS(c.wait(1s), TaskError);
  std::optional<Tensors> out = pool.call("fail_if_negative", {at::full({1}, 4, at::kLong)}).wait();
  REQUIRE(out);
  CHECK(out->at(0).item<std::int64_t>() == 4);
}

}  // namespace ferry
