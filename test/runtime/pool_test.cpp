// The pool across real worker processes: order, errors, crashes, timeouts, start methods,
// back-pressure and shutdown.
#include "runtime/pool.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "../fill_filesystem.hpp"
#include "../workers/sized_detail.hpp"
#include "ipc/cuda/fork_safety.hpp"
#include "ipc/process.hpp"
#include "ipc/wire.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/supervisor/queue_depth.hpp"
#include "runtime/worker_protocol.hpp"
#include "test_pools.hpp"
#include "workers/builtin_tasks.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

using test::cpu_pool;
using test::delayed;

bool all_dead(const std::vector<pid_t>& pids, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  for (;;) {
    bool any = false;
    for (pid_t p : pids) any = any || (p > 0 && process_alive(p));
    if (!any) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST_CASE("map of 10000 tasks with random per-task delays returns every result in input order") {
  Pool pool(cpu_pool(2));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> delay(0, 300);
  std::vector<Tensors> inputs;
  for (int i = 0; i < 10000; ++i) inputs.push_back(delayed(delay(rng), i));
  const std::vector<Tensors> out = pool.map("sleep_echo", inputs);
  REQUIRE(out.size() == inputs.size());
  for (int i = 0; i < 10000; ++i) {
    INFO("result " << i << ": " << out[i][0]);
    REQUIRE(out[i].size() == 1);
    REQUIRE(out[i][0].equal(at::full({4}, i, at::kLong)));
  }
  const PoolStats s = pool.stats();
  CHECK(s.completed == 10000);
  CHECK(s.failed == 0);
  // Both workers took part: the least-loaded choice spreads the work.
  for (const auto& w : s.workers) CHECK(w.tasks_done > 1000);
}

TEST_CASE("SIGKILL of random workers during a long run ends every task exactly once") {
  PoolOptions o = cpu_pool(2);
  o.max_retries = 5;
  Pool pool(o);
  // 10000 tasks and a kill every 40 ms. Under TSan a spawned worker takes seconds to start, so
  // at that pace the workers were dead most of the time and the run passed ctest's 600 s: there,
  // 5000 tasks, and a kill only once 80 more results have come since the last one (with 1000,
  // the results came in bursts between restarts and left 5 or 6 kills, at the check's edge; with
  // 2000, once the pool's hot path got faster, 5 kills in 8 s).
  const int tasks = test::kUnderTsan ? 5000 : 10000;
  const int results_between_kills = test::kUnderTsan ? 80 : 0;
  std::atomic<int> results_so_far{0};
  std::vector<Tensors> inputs;
  for (int i = 0; i < tasks; ++i) inputs.push_back(delayed(i % 7 == 0 ? 200 : 0, i));

  std::atomic<bool> done{false};
  std::atomic<int> kills{0};
  std::thread killer([&] {
    std::mt19937 rng(11);
    int killed_at = 0;
    while (!done) {
      std::this_thread::sleep_for(40ms);
      if (results_so_far - killed_at < results_between_kills) continue;
      const auto pids = pool.worker_pids();
      const pid_t victim = pids[rng() % pids.size()];
      if (victim > 0 && ::kill(victim, SIGKILL) == 0) {
        ++kills;
        killed_at = results_so_far;
      }
    }
  });
  std::vector<int> seen(inputs.size(), 0);
  std::size_t results = 0, errors = 0;
  auto stream = pool.imap_unordered("sleep_echo", inputs);
  while (auto r = stream.next()) {
    ++results_so_far;
    ++seen.at(r->index);
    if (r->error) {
      ++errors;
      try {
        r->get();
      } catch (const TaskError& e) {
        CHECK(e.code() == Errc::worker_lost);
        CHECK_THAT(e.what(), Catch::Contains("SIGKILL"));
      }
    } else {
      ++results;
      REQUIRE(
          r->outputs.at(0).equal(at::full({4}, static_cast<std::int64_t>(r->index), at::kLong)));
    }
  }
  done = true;
  killer.join();
  for (std::size_t i = 0; i < seen.size(); ++i) {
    INFO("task " << i);
    REQUIRE(seen[i] == 1);
  }
  CHECK(results + errors == static_cast<std::size_t>(tasks));
  CHECK(kills > 5);
  const PoolStats s = pool.stats();
  std::uint64_t restarts = 0;
  for (const auto& w : s.workers) restarts += w.restarts;
  // A kill that lands during a restart's handshake fails that start instead of adding one.
  CHECK(restarts > 0);
  CHECK(restarts <= static_cast<std::uint64_t>(kills.load()));
  CHECK(s.retried > 0);
  WARN(kills << " kills, " << s.retried << " retries, " << errors << " tasks lost");
  // The pool still works after all that.
  CHECK(pool.submit("square", {at::full({2}, 3.0)}).get()[0].equal(at::full({2}, 9.0)));
}

TEST_CASE("a task that throws is a TaskError naming worker, device, task and input") {
  Pool pool(cpu_pool(2));
  std::vector<Tensors> inputs;
  for (int i = 0; i < 20; ++i) inputs.push_back({at::scalar_tensor(i == 13 ? -5 : i, at::kLong)});
  try {
    pool.map("fail_if_negative", inputs);
    FAIL("map should have thrown");
  } catch (const TaskError& e) {
    CHECK(e.code() == Errc::task_failed);
    CHECK(e.task() == "fail_if_negative");
    CHECK(e.index() == 13);
    CHECK(e.device() == "cpu");
    CHECK(e.worker() >= 0);
    CHECK(e.pid() > 0);
    CHECK(e.message() == "asked to fail on -5 in fail_if_negative");
    CHECK_THAT(e.what(), Catch::Contains("input 13") && Catch::Contains("worker"));
  }
  // The pool keeps working, with the same worker processes (a throw is not a crash).
  const auto pids = pool.worker_pids();
  CHECK(pool.submit("fail_if_negative", {at::scalar_tensor(4, at::kLong)}).get()[0].item<long>() ==
        4);
  CHECK(pool.worker_pids() == pids);
  const PoolStats s = pool.stats();
  CHECK(s.failed == 1);
  CHECK(s.workers[0].tasks_failed + s.workers[1].tasks_failed == 1);
}

TEST_CASE(
    "a worker that crashes on a task is restarted, the task is retried, then fails naming the "
    "signal") {
  PoolOptions o = cpu_pool(2);
  o.max_retries = 1;
  Pool pool(o);
  auto f = pool.submit("segfault", {});
  try {
    f.get();
    FAIL("the task should have failed");
  } catch (const TaskError& e) {
    CHECK(e.code() == Errc::worker_lost);
    CHECK_THAT(e.what(), Catch::Contains("SIGSEGV") && Catch::Contains("2 attempt"));
  }
  // It was retried on the other worker: both crashed once and both came back.
  const PoolStats s = pool.stats();
  CHECK(s.retried == 1);
  CHECK(s.workers[0].tasks_lost == 1);
  CHECK(s.workers[1].tasks_lost == 1);
  CHECK(pool.submit("square", {at::full({1}, 2.0)}).get()[0].item<double>() == 4.0);
  // A restart counts once its process is ready: the square ran on the first one back, and the
  // other may still be starting (spawned under TSan, it took seconds).
  auto both_back = [&] {
    for (const auto& w : pool.stats().workers) {
      if (w.restarts != 1) return false;
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!both_back() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  for (const auto& w : pool.stats().workers) CHECK(w.restarts == 1);
}

TEST_CASE("a worker whose results find no shared memory fails the task with why, and lives",
          "[tmpfs]") {
  test::in_child([] {
    const std::string shm = test::private_tmpfs(8 << 20);
    ::setenv("FERRY_ARENA_SEGMENT_MB", "1", 1);
    Pool pool(cpu_pool(1));
    const at::Tensor quarter_mib = at::scalar_tensor(std::int64_t{1} << 16, at::kLong);
    // Results stay in the worker's arena while they are held here (256 KiB: not copied out).
    std::vector<Tensors> held{pool.submit("zeros", {quarter_mib}).get()};
    test::fill_filesystem(shm);  // another file takes every free byte
    std::string error;
    for (int i = 0; i < 16 && error.empty(); ++i) {
      try {
        held.push_back(pool.submit("zeros", {quarter_mib}).get());
      } catch (const TaskError& e) {
        error = e.what();
      }
    }
    // Its reply said why without shared memory of its own; before, writing the error needed a
    // block too, and the worker died and was restarted into the same full filesystem.
    if (error.find("could not be sent back") == std::string::npos ||
        error.find("Remedy") == std::string::npos) {
      throw std::runtime_error("no task failed with the shared-memory error; got: '" + error + "'");
    }
    if (pool.stats().workers[0].restarts != 0) throw std::runtime_error("the worker restarted");
    for (const Tensors& r : held) {
      if (r.at(0).abs().sum().item<double>() != 0) throw std::runtime_error("a result changed");
    }
  });
}

TEST_CASE("a large detail that finds no shared memory stays behind, and the failure still comes",
          "[tmpfs]") {
  test::in_child([] {
    const std::string shm = test::private_tmpfs(8 << 20);
    ::setenv("FERRY_ARENA_SEGMENT_MB", "1", 1);
    Pool pool(cpu_pool(1));
    auto fail = [&](std::size_t bytes) {
      try {
        pool.submit("fail_with_sized_detail", {at::scalar_tensor(std::int64_t(bytes), at::kLong)})
            .get();
      } catch (const TaskError& e) {
        return std::make_pair(std::string(e.message()), e.detail().size());
      }
      throw std::runtime_error("the task returned");
    };
    const std::size_t large = std::size_t{2} << 20;
    if (fail(large).second != large) throw std::runtime_error("with room, the detail did not come");
    test::fill_filesystem(shm);
    // Larger than the worker's arena has kept from the first one: it needs a segment more.
    const std::size_t larger = std::size_t{3} << 20;
    const auto [message, detail] = fail(larger);
    if (detail != 0 || message.find(std::to_string(larger) + " bytes") == std::string::npos) {
      throw std::runtime_error("got '" + message + "' and a detail of " + std::to_string(detail) +
                               " bytes");
    }
    if (pool.stats().workers[0].restarts != 0) throw std::runtime_error("the worker restarted");
  });
}

TEST_CASE("a task past its timeout kills its worker and fails naming the timeout") {
  PoolOptions o = cpu_pool(1);
  // Long enough that the restarted worker's first task never hits it on a loaded machine.
  o.task_timeout = 1000ms;
  o.max_retries = 0;
  Pool pool(o);
  const pid_t before = pool.worker_pids()[0];
  auto stuck = pool.submit("hang", {});
  try {
    stuck.get();
    FAIL("the task should have timed out");
  } catch (const TaskError& e) {
    CHECK(e.code() == Errc::worker_lost);
    CHECK_THAT(e.what(), Catch::Contains("timeout of 1000 ms") && Catch::Contains("SIGKILL"));
  }
  CHECK_FALSE(process_alive(before));
  CHECK(pool.submit("square", {at::full({1}, 3.0)}).get()[0].item<double>() == 9.0);
  const PoolStats s = pool.stats();
  CHECK(s.workers[0].timeouts == 1);
  CHECK(s.workers[0].restarts == 1);
}

TEST_CASE("fork is refused after CUDA is initialised, auto then spawns") {
  test::in_child([] {
    cuda::detail::simulate_initialised(true);  // the state only; the refusal path is real
    try {
      Pool refused(cpu_pool(1, Start::Fork));
      std::fprintf(stderr, "fork was not refused\n");
      ::_exit(1);
    } catch (const Error& e) {
      if (e.code() != Errc::invalid_argument || !std::strstr(e.what(), "spawn")) {
        std::fprintf(stderr, "unexpected error: %s\n", e.what());
        ::_exit(1);
      }
    }
    Pool pool(cpu_pool(1, Start::Auto));
    if (pool.stats().workers[0].start != "spawn") ::_exit(2);
    if (pool.submit("square", {at::full({1}, 5.0)}).get()[0].item<double>() != 25.0) ::_exit(3);
  });
}

TEST_CASE("forked workers use their threads even after the supervisor ran a parallel region",
          "[fork]") {
  // The supervisor's own OpenMP team: a child forked by this thread would inherit it and hang
  // at its first parallel op (runtime/fork_threads.hpp). The pool forks from its monitor thread.
  at::set_num_threads(2);
  REQUIRE((at::ones({4'000'000}) * 2).sum().item<double>() == 8e6);
  PoolOptions o = cpu_pool(2);
  o.threads_per_worker = 2;
  Pool pool(o);
  std::vector<std::future<Tensors>> sums;
  for (int i = 0; i < 8; ++i) {
    sums.push_back(pool.submit("parallel_sum", {at::scalar_tensor(4'000'000, at::kLong)}));
  }
  for (auto& f : sums) {
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    const Tensors r = f.get();
    CHECK(r[0].item<double>() == 8e6);
    CHECK(r[1].item<std::int64_t>() == 2);
  }
  at::set_num_threads(1);
}

TEST_CASE("spawned workers run the tasks of the program they were spawned from") {
  Pool pool(cpu_pool(2, Start::Spawn));
  for (const auto& w : pool.stats().workers) CHECK(w.start == "spawn");
  const auto names = pool.tasks();
  CHECK(std::find(names.begin(), names.end(), "sleep_echo") != names.end());
  CHECK(std::find(names.begin(), names.end(), "mlp") != names.end());
  for (pid_t pid : pool.worker_pids()) {
    char exe[4096] = {};
    REQUIRE(::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), exe, sizeof exe - 1) > 0);
    CHECK_THAT(std::string(exe), Catch::EndsWith("ferry-test-worker"));
  }
  std::vector<Tensors> inputs;
  for (int i = 0; i < 200; ++i) inputs.push_back(delayed(0, i));
  const auto out = pool.map("sleep_echo", inputs);
  for (int i = 0; i < 200; ++i) REQUIRE(out[i][0][0].item<std::int64_t>() == i);
}

TEST_CASE("the default ferry-worker executable is found and runs the built-in mlp") {
  PoolOptions o;
  o.devices = {"cpu"};
  o.start = Start::Spawn;
  o.worker_executable = FERRY_WORKER_EXE;
  Pool pool(o);
  const at::Tensor batch = at::randn({8, kMlpFeatures});
  const at::Tensor out = pool.submit("mlp", {batch}).get().at(0);
  CHECK(out.sizes() == at::IntArrayRef({8, kMlpClasses}));
  CHECK(at::allclose(out, reference_mlp(batch), 1e-5, 1e-5));
}

TEST_CASE("worker_args come before the control fd, so an interpreter can start the worker") {
  // The Python package starts `python -c CODE --ferry-control-fd N` this way; a shell shows the
  // same: it runs its $0 (the worker) with the rest of the arguments.
  PoolOptions o;
  o.devices = {"cpu"};
  o.start = Start::Spawn;
  o.worker_executable = "/bin/sh";
  o.worker_args = {"-c", "exec \"$0\" \"$@\"", FERRY_WORKER_EXE};
  Pool pool(o);
  const at::Tensor batch = at::randn({4, kMlpFeatures});
  CHECK(at::allclose(pool.submit("mlp", {batch}).get().at(0), reference_mlp(batch), 1e-5, 1e-5));
}

TEST_CASE("a protocol mismatch is a clear error, said once") {
  const std::string log = "/tmp/ferry-handshake-" + std::to_string(::getpid()) + ".log";
  test::in_child([&] {
    const int fd = ::open(log.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ::dup2(fd, 2);  // the spawned worker inherits this stderr
    ::setenv("FERRY_TEST_WORKER_PROTOCOL", "99", 1);
    try {
      Pool pool(cpu_pool(1, Start::Spawn));
      ::_exit(1);
    } catch (const Error& e) {
      std::fprintf(stderr, "SUPERVISOR: %s\n", e.what());
      ::_exit(e.code() == Errc::handshake ? 0 : 2);
    }
  });
  const std::string text = slurp(log);
  ::unlink(log.c_str());
  INFO(text);
  CHECK_THAT(text, Catch::Contains("SUPERVISOR") && Catch::Contains("protocol version 99"));
  // The worker's refusal reached the supervisor, whose error says it: neither the worker nor a
  // log line repeats it.
  std::size_t said = 0;
  for (auto at = text.find("protocol version 99"); at != std::string::npos;
       at = text.find("protocol version 99", at + 1)) {
    ++said;
  }
  CHECK(said == 1);
}

TEST_CASE("a worker program that never answers the handshake fails the start with its status") {
  PoolOptions o = cpu_pool(1, Start::Spawn);
  o.worker_executable = "/bin/false";
  try {
    Pool pool(o);
    FAIL("the pool should not have started");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::handshake);
    CHECK_THAT(e.what(), Catch::Contains("exited with code 1") && Catch::Contains("/bin/false"));
  }
  o.worker_executable = "/nonexistent/ferry-worker";
  CHECK_THROWS_WITH(Pool(o), Catch::Contains("/nonexistent/ferry-worker"));
}

TEST_CASE("bad options and unknown tasks are errors that name the value") {
  PoolOptions o = cpu_pool(1);
  o.devices = {"gpu0"};
  CHECK_THROWS_WITH(Pool(o), Catch::Contains("'gpu0'"));
  o = cpu_pool(1);
  o.require_tasks = {"no_such_task"};
  CHECK_THROWS_WITH(Pool(o), Catch::Contains("no_such_task"));
  Pool pool(cpu_pool(1));
  CHECK_THROWS_WITH(pool.submit("nope", {}),
                    Catch::Contains("'nope'") && Catch::Contains("square"));
  Tensors many(65, at::zeros({1}));
  CHECK_THROWS_WITH(pool.submit("echo", many), Catch::Contains("65 tensors"));
  CHECK_THROWS_AS(parse_start("vfork"), Error);
}

TEST_CASE("submit blocks while the pool is full, then times out") {
  PoolOptions o = cpu_pool(1);
  o.max_inflight_per_worker = 2;
  Pool pool(o);
  auto a = pool.submit("sleep_echo", delayed(400000, 1));
  auto b = pool.submit("sleep_echo", delayed(0, 2));
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH(pool.submit("sleep_echo", delayed(0, 3), 100ms), Catch::Contains("full"));
  CHECK(Clock::now() - t0 >= 100ms);
  // Room comes back as results do: an unbounded submit now waits for `a`, then goes through.
  auto c = pool.submit("sleep_echo", delayed(0, 3));
  CHECK(c.get()[0][0].item<std::int64_t>() == 3);
  CHECK(a.get()[0][0].item<std::int64_t>() == 1);
  CHECK(b.get()[0][0].item<std::int64_t>() == 2);
}

TEST_CASE("short tasks deepen a worker's queue past its room's 16, and tasks of 64 tensors fit") {
  Pool pool(cpu_pool(1));  // the pool chooses the depth
  {
    auto stream = pool.imap_unordered("echo", std::vector<Tensors>(3000));
    std::size_t n = 0;
    while (auto r = stream.next(60s)) n += r->error ? 0 : 1;
    CHECK(n == 3000);
  }
  // Empty tasks take microseconds: the queue holds far more of them than of the largest.
  const std::size_t limit = pool.stats().workers.at(0).limit;
  REQUIRE(limit > supervisor::QueueDepth::kRoomDepth);
  auto big = [](std::int64_t i) {
    Tensors t;
    for (std::int64_t k = 0; k < static_cast<std::int64_t>(protocol::kMaxTensorsPerTask); ++k) {
      t.push_back(at::full({2}, i * 1000 + k, at::kLong));
    }
    return t;
  };
  // Tasks of the most tensors each take 65 records with the envelope: the queue has room for 15
  // beside a slow task. The book hands the worker no more than that, whatever its depth, so the
  // rest wait in the book and submit() returns at once; sent regardless, they would wait in
  // submit() for the slow task to end (or, sent by a collector, stop the results behind them).
  auto slow = pool.submit("sleep_echo", delayed(1'500'000, 7));
  const std::size_t n = std::min<std::size_t>(limit - 1, 40);
  std::vector<std::future<Tensors>> futures;
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < n; ++i) futures.push_back(pool.submit("echo", big(i)));
  CHECK(Clock::now() - t0 < 1s);
  CHECK(slow.get()[0][0].item<std::int64_t>() == 7);
  for (std::size_t i = 0; i < n; ++i) {
    const Tensors out = futures[i].get();
    REQUIRE(out.size() == protocol::kMaxTensorsPerTask);
    CHECK(out.front()[1].item<std::int64_t>() == static_cast<std::int64_t>(i) * 1000);
    CHECK(out.back()[0].item<std::int64_t>() ==
          static_cast<std::int64_t>(i) * 1000 + static_cast<std::int64_t>(out.size()) - 1);
  }
  const PoolStats s = pool.stats();
  CHECK(s.workers.at(0).tasks_lost == 0);
  CHECK(s.workers.at(0).restarts == 0);
}

TEST_CASE("tasks of megabytes keep a worker's queue shallow, whatever their speed") {
  Pool pool(cpu_pool(1));  // the pool chooses the depth
  // Echo of 4 MiB: a short task that moves 8 MiB, its input and its result.
  std::vector<Tensors> inputs;
  for (std::int64_t i = 0; i < 60; ++i) inputs.push_back({at::full({1 << 20}, i, at::kFloat)});
  auto stream = pool.imap_unordered("echo", inputs);
  std::size_t n = 0;
  while (auto r = stream.next(60s)) {
    REQUIRE_FALSE(r->error);
    CHECK(r->outputs.at(0)[12345].item<float>() == static_cast<float>(r->index));
    ++n;
  }
  CHECK(n == 60);
  // 32 MiB (QueueDepth::kDataCover) of 8 MiB tasks: 4; time alone would allow at least 10.
  CHECK(pool.stats().workers.at(0).limit <= 4);
}

TEST_CASE("close drains by default and cancels on request, no worker outlives it") {
  std::vector<pid_t> pids;
  std::vector<std::future<Tensors>> drained;
  {
    Pool pool(cpu_pool(2));
    pids = pool.worker_pids();
    for (int i = 0; i < 6; ++i) drained.push_back(pool.submit("sleep_echo", delayed(50000, i)));
  }  // the destructor drains
  for (int i = 0; i < 6; ++i) CHECK(drained[i].get()[0][0].item<std::int64_t>() == i);
  CHECK(all_dead(pids, 100ms));

  PoolOptions quick = cpu_pool(1);
  quick.stop_timeout = 200ms;  // the hung task never ends: the worker is killed after this
  Pool pool(quick);
  pids = pool.worker_pids();
  auto running = pool.submit("hang", {});
  auto queued = pool.submit("square", {at::ones({1})});
  std::this_thread::sleep_for(50ms);
  pool.close(Shutdown::Cancel);
  for (auto* f : {&running, &queued}) {
    try {
      f->get();
      FAIL("cancelled task returned");
    } catch (const TaskError& e) {
      CHECK(e.code() == Errc::closed);
    }
  }
  CHECK(all_dead(pids, 100ms));
  CHECK_THROWS_WITH(pool.submit("square", {at::ones({1})}), Catch::Contains("closed"));
}

TEST_CASE("Shutdown::Kill stops busy and idle workers at once, as terminate() does") {
  PoolOptions o = cpu_pool(2);  // the default stop_timeout: 5 s for a worker to finish
  Pool pool(o);
  const auto pids = pool.worker_pids();
  auto running = pool.submit("hang", {});
  std::this_thread::sleep_for(100ms);
  const auto t0 = std::chrono::steady_clock::now();
  pool.close(Shutdown::Kill);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < 1s);  // not the 5 s stop_timeout; the bound leaves room for a loaded machine
  try {
    running.get();
    FAIL("a task of a killed pool returned");
  } catch (const TaskError& e) {
    CHECK(e.code() == Errc::closed);
    CHECK_THAT(e.what(), Catch::Contains("terminated"));
  }
  CHECK(all_dead(pids, 100ms));
}

TEST_CASE("Shutdown::Kill cuts short a drain another thread is waiting on") {
  Pool pool(cpu_pool(1));
  const auto pids = pool.worker_pids();
  auto running = pool.submit("hang", {});
  std::thread drainer([&] { pool.close(Shutdown::Drain); });  // would wait for ever: a hang
  std::this_thread::sleep_for(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  pool.close(Shutdown::Kill);
  drainer.join();
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK_THROWS_AS(running.get(), TaskError);
  CHECK(all_dead(pids, 100ms));
}

TEST_CASE("a worker's start runs once before its first task, and one that throws fails its tasks") {
  for (const Start start : {cpu_pool(1).start, Start::Spawn}) {  // fork, save under TSan
    Pool pool(cpu_pool(2, start));
    for (int i = 0; i < 4; ++i) {
      CHECK(pool.submit("starts", {}).get().at(0).item<std::int64_t>() == 1);
    }
  }
  PoolOptions o = cpu_pool(1, Start::Spawn);
  o.config["test.start"] = "fail";
  Pool failing(o);
  try {
    failing.submit("square", {at::ones({1})}).get();
    FAIL("a task ran in a worker whose start failed");
  } catch (const TaskError& e) {
    CHECK(e.code() == Errc::task_failed);
    CHECK_THAT(e.message(), Catch::Contains("the worker's start failed: no model here"));
  }
  CHECK(failing.stats().workers.at(0).restarts == 0);  // it lives on, saying why
}

TEST_CASE("a task that fails with a TaskFailure hands its detail to the caller") {
  Pool pool(cpu_pool(1));
  auto bytes = [](std::size_t n) {
    at::Tensor t = at::empty({static_cast<std::int64_t>(n)}, at::kByte);
    for (std::size_t i = 0; i < n; ++i) t[static_cast<std::int64_t>(i)] = static_cast<int>(i % 251);
    return t;
  };
  // Sizes around a piece, and the most a detail may take.
  const std::size_t most = ferry::wire::kInlineBytes * ferry::protocol::kMaxDetailPieces;
  for (std::size_t n :
       {std::size_t{1}, ferry::wire::kInlineBytes, ferry::wire::kInlineBytes + 1, most}) {
    const at::Tensor d = bytes(n);
    try {
      pool.submit("fail_with_detail", {d}).get();
      FAIL("the task returned");
    } catch (const TaskError& e) {
      INFO(n);
      CHECK(e.code() == Errc::task_failed);
      CHECK(e.message() == "failed with a detail of " + std::to_string(n) + " bytes");
      REQUIRE(e.detail().size() == n);
      CHECK(std::memcmp(e.detail().data(), d.data_ptr(), n) == 0);
    }
  }
  // Past the records' room it comes whole through shared memory (a Python task's large
  // exception arrives as itself).
  for (std::size_t n : {most + 1, std::size_t{8} << 20}) {
    try {
      pool.submit("fail_with_sized_detail", {at::scalar_tensor(std::int64_t(n), at::kLong)}).get();
      FAIL("the task returned");
    } catch (const TaskError& e) {
      INFO(n);
      CHECK_THAT(e.message(), Catch::Contains(std::to_string(n) + " bytes"));
      REQUIRE(e.detail().size() == n);
      CHECK(e.detail() == test::sized_detail(n));
    }
  }
  // A plain exception has none.
  try {
    pool.submit("fail_if_negative", {at::full({1}, -1, at::kLong)}).get();
    FAIL("the task returned");
  } catch (const TaskError& e) {
    CHECK(e.detail().empty());
  }
}

TEST_CASE("a stream's next() waits no longer than its timeout, and goes on after one") {
  Pool pool(cpu_pool(1));
  auto results = pool.imap_unordered("sleep_echo", {delayed(400000, 7)});
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(results.next(50ms), Catch::Contains("within 50 ms"));
  CHECK(std::chrono::steady_clock::now() - t0 < 350ms);
  auto r = results.next(5s);
  REQUIRE(r);
  CHECK(r->get()[0][0].item<std::int64_t>() == 7);
  CHECK_FALSE(results.next(0ms));
}

TEST_CASE("a stream of unknown length is read only as room frees up, to its end") {
  Pool pool(cpu_pool(1));
  std::atomic<std::size_t> made{0};
  // Endless: the pool asks for inputs as results are taken, never all of them.
  auto endless = pool.imap_unordered("sleep_echo", [&](std::size_t i) -> std::optional<Tensors> {
    ++made;
    return delayed(0, static_cast<std::int64_t>(i));
  });
  std::set<std::int64_t> seen;
  for (int k = 0; k < 20; ++k) seen.insert(endless.next()->get()[0][0].item<std::int64_t>());
  CHECK(seen.size() == 20);
  CHECK(made <= 20 + pool.capacity() + 1);
  // One that ends: every input once, then the end.
  auto five = pool.imap_unordered("sleep_echo", [](std::size_t i) -> std::optional<Tensors> {
    if (i == 5) return std::nullopt;
    return delayed(0, static_cast<std::int64_t>(i));
  });
  seen.clear();
  while (auto r = five.next()) seen.insert(r->get()[0][0].item<std::int64_t>());
  CHECK(seen == std::set<std::int64_t>{0, 1, 2, 3, 4});
  auto none = pool.imap_unordered(
      "sleep_echo", [](std::size_t) -> std::optional<Tensors> { return std::nullopt; });
  CHECK_FALSE(none.next(1s));
}

TEST_CASE("a stream's top_up makes the inputs the pool has room for now, and next() none then") {
  Pool pool(cpu_pool(1));
  std::atomic<std::size_t> made{0};
  auto slow = pool.imap_unordered("sleep_echo", [&](std::size_t i) -> std::optional<Tensors> {
    if (i == 100) return std::nullopt;
    ++made;
    return delayed(20000, static_cast<std::int64_t>(i));  // 20 ms: the pool stays full
  });
  const std::size_t room = pool.capacity();
  CHECK(slow.top_up() == room);
  CHECK(made == room);
  CHECK(slow.top_up() == 0);  // full: nothing waits, nothing is made
  REQUIRE(slow.next(10s));    // a result taken from what is out: no input made meanwhile
  CHECK(made == room);
  std::size_t got = 1;
  while (slow.next(10s)) ++got;
  CHECK(got == 100);
  CHECK(made == 100);
}

TEST_CASE("a stream's take_ready takes what is in without waiting, and stops before a failure") {
  PoolOptions o = cpu_pool(1);
  o.max_inflight_per_worker = 8;  // the first next() hands over all six: take_ready submits none
  Pool pool(o);
  std::vector<Tensors> inputs;
  for (std::int64_t v : {0, 1, 2, -3, 4, 5}) inputs.push_back({at::full({1}, v, at::kLong)});
  auto stream = pool.imap_unordered("fail_if_negative", std::move(inputs));
  auto first = stream.next(10s);
  REQUIRE(first);
  REQUIRE_FALSE(first->error);
  std::vector<std::size_t> taken{first->index};
  // One worker: its results come in input order. At most `most` per call.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (taken.size() < 3 && std::chrono::steady_clock::now() < until) {
    auto some = stream.take_ready(1);
    REQUIRE(some.size() <= 1);
    for (const auto& r : some) taken.push_back(r.index);
    std::this_thread::sleep_for(1ms);
  }
  CHECK(taken == std::vector<std::size_t>{0, 1, 2});
  // The failure has come, and the two after it: take_ready leaves it, with them, for next().
  std::this_thread::sleep_for(200ms);
  CHECK(stream.take_ready(10).empty());
  auto failed = stream.next(10s);
  REQUIRE(failed);
  CHECK(failed->index == 3);
  CHECK_THROWS_AS(failed->get(), TaskError);
  auto rest = stream.take_ready(10);
  REQUIRE(rest.size() == 2);
  CHECK(rest[0].index == 4);
  CHECK(rest[1].get()[0][0].item<std::int64_t>() == 5);
  CHECK_FALSE(stream.next(1s));  // the stream counted what take_ready took: it has ended
}

TEST_CASE("a stream's results come back at once although slow tasks fill the pool behind them") {
  // Results of fast tasks gather a moment before their consumer is woken (stream_wake.hpp); none
  // may wait for the slow tasks queued after it, which hold over half the pool's window here.
  Pool pool(cpu_pool(1));
  auto stream = pool.imap_unordered("sleep_echo", 140, [](std::size_t i) {
    return delayed(i < 100 ? 300 : 500000, static_cast<std::int64_t>(i));
  });
  std::size_t fast = 0;
  std::chrono::steady_clock::time_point last_fast;
  while (auto r = stream.next(30s)) {
    if (r->get()[0][0].item<std::int64_t>() >= 100) break;  // the first slow one
    ++fast;
    last_fast = std::chrono::steady_clock::now();
  }
  CHECK(fast == 100);
  // The last fast result was taken as it came, half a second before the slow one, not with it.
  CHECK(std::chrono::steady_clock::now() - last_fast > 250ms);
  pool.close(Shutdown::Cancel);
}

TEST_CASE("workers die with their supervisor, even when it is SIGKILLed") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t supervisor = test::fork_child([&] {
    Pool pool(cpu_pool(2));
    const auto pids = pool.worker_pids();
    [[maybe_unused]] ssize_t n = ::write(fds[1], pids.data(), sizeof(pid_t) * pids.size());
    pool.submit("hang", {});  // one worker busy in a task, one idle
    for (;;) ::pause();
  });
  ::close(fds[1]);  // so the read below ends if the supervisor dies before it writes
  std::vector<pid_t> pids(2);
  REQUIRE(::read(fds[0], pids.data(), sizeof(pid_t) * 2) == sizeof(pid_t) * 2);
  std::this_thread::sleep_for(50ms);
  ::kill(supervisor, SIGKILL);
  test::wait_child(supervisor);
  CHECK(all_dead(pids, 2000ms));
  ::close(fds[0]);
}

TEST_CASE(
    "a worker process runs its tasks per life, then a fresh one takes over, no task lost "
    "or run twice") {
  PoolOptions o = cpu_pool(2);
  o.max_tasks_per_worker = 3;
  Pool pool(o);
  const int n = 40;
  std::vector<decltype(pool.submit("whoami", {}))> results;
  for (int i = 0; i < n; ++i) results.push_back(pool.submit("whoami", {}));
  std::map<std::int64_t, int> per_process;
  for (auto& r : results) ++per_process[r.get().at(0)[0].item<std::int64_t>()];
  int tasks = 0;
  for (const auto& [pid, count] : per_process) {
    CHECK(count <= 3);
    tasks += count;
  }
  CHECK(tasks == n);
  CHECK(per_process.size() >= static_cast<std::size_t>((n + 2) / 3));
  // Each fresh process ran the program's start again.
  CHECK(pool.submit("starts", {}).get().at(0).item<std::int64_t>() == 1);
  const PoolStats s = pool.stats();
  std::uint64_t replaced = 0;
  for (const WorkerStats& w : s.workers) {
    CHECK(w.restarts == 0);  // a replacement is no restart
    CHECK(w.tasks_lost == 0);
    replaced += w.replaced;
  }
  CHECK(replaced + s.workers.size() >= per_process.size());
}

TEST_CASE("statistics count results zero-copied and copied, per worker") {
  Pool pool(cpu_pool(1));
  pool.submit("whoami", {}).get();                 // result made in shared memory: zero-copy
  pool.submit("square", {at::ones({256})}).get();  // an ordinary tensor: copied once
  const WorkerStats w = pool.stats().workers.at(0);
  CHECK(w.tensors_zero_copy == 1);
  CHECK(w.bytes_zero_copy == 16);
  CHECK(w.tensors_copied == 1);
  CHECK(w.bytes_copied == 256 * 4);
  CHECK(w.tasks_done == 2);
  // Inputs, as their send reported: the ordinary one copied, one in shared memory not.
  pool.submit("square", {ferry::empty_shared({8}, at::kFloat).fill_(2)}).get();
  const PoolStats s = pool.stats();
  CHECK(s.input_tensors_copied == 1);
  CHECK(s.input_bytes_copied == 256 * 4);
  CHECK(s.input_tensors_zero_copy == 1);
  CHECK(s.input_bytes_zero_copy == 8 * 4);
}

TEST_CASE("configuration reaches every task's context") {
  PoolOptions o = cpu_pool(1);
  o.config["greeting"] = "ahoy";
  Pool pool(o);
  const at::Tensor t = pool.submit("config_echo", {}).get().at(0);
  CHECK(std::string(static_cast<const char*>(t.data_ptr()), t.numel()) == "ahoy");
}

}  // namespace
}  // namespace ferry
