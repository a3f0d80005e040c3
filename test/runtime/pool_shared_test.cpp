// PoolOptions::shared across real worker processes: the same memory in every worker and in the
// supervisor, for forked and spawned workers alike, kept across a worker's restart, and Hogwild
// training on it.
#include <signal.h>

#include <ATen/CPUGeneratorImpl.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <mutex>
#include <thread>

#include "../test_util.hpp"
#include "runtime/pool.hpp"
#include "runtime/shared_module.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/supervisor/queue_depth.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

PoolOptions shared_pool(int workers, Start start) {
  PoolOptions o;
  o.devices.assign(workers, "cpu");
  o.start = start;
  o.worker_executable = FERRY_TEST_WORKER;
  return o;
}

Start start_of(int i) {
  // ThreadSanitizer cannot follow a multithreaded supervisor's fork (test::kUnderTsan).
  return i == 0 && !test::kUnderTsan ? Start::Fork : Start::Spawn;
}

// GCC 12's AddressSanitizer does not lock its allocator around fork: a worker forked again while
// another thread of the supervisor allocates (a restart while results stream in) can block in its
// first malloc for good. glibc's malloc, which users run, is fork-safe; under ASan such restarts
// spawn.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAsan = true;
#else
constexpr bool kUnderAsan = false;
#endif

TEST_CASE("every worker writes the supervisor's shared tensor in place", "[pool][shared]") {
  for (int i = 0; i < 2; ++i) {
    const Start start = start_of(i);
    DYNAMIC_SECTION(start_name(start)) {
      at::Tensor w = at::zeros({1000}, at::kLong);  // an ordinary tensor: moved in place
      PoolOptions o = shared_pool(2, start);
      o.shared = {{"w", w}};
      Pool pool(o);
      CHECK(is_shared(w));
      std::vector<Tensors> inputs(100, Tensors{at::scalar_tensor(1, at::kLong)});
      pool.map("shared_add", inputs);
      // Both workers added to the one tensor (two adds racing on an element can lose one, as
      // Hogwild accepts, so the total is 100 unless they overlapped).
      CHECK(w.min().item<std::int64_t>() > 50);
      CHECK(w.max().item<std::int64_t>() <= 100);
      // The supervisor's writes reach every worker.
      w.fill_(-7);
      for (const auto& out : pool.map("shared_read", std::vector<Tensors>(4))) {
        CHECK(out.at(0).equal(w));
      }
    }
  }
}

TEST_CASE("a restarted worker gets the same shared memory", "[pool][shared]") {
  at::Tensor w = empty_shared({8}, at::kFloat).fill_(1);
  PoolOptions o = shared_pool(1, start_of(test::kUnderTsan ? 1 : 0));
  o.shared = {{"w", w}};
  Pool pool(o);
  pool.submit("shared_add", {at::scalar_tensor(2.0f)}).get();
  CHECK(w[0].item<float>() == 3.0f);
  const pid_t first = pool.worker_pids().at(0);
  ::kill(first, SIGKILL);
  // The next task runs on the restarted worker, on the same memory.
  const Tensors out = pool.submit("shared_add", {at::scalar_tensor(4.0f)}).get();
  CHECK(out.at(0)[0].item<float>() == 7.0f);
  CHECK(w[0].item<float>() == 7.0f);
  CHECK(pool.worker_pids().at(0) != first);
  CHECK(pool.stats().workers.at(0).restarts == 1);
}

TEST_CASE("a task asking for a name the pool does not share fails with the names it has",
          "[pool][shared]") {
  PoolOptions o = shared_pool(1, start_of(0));
  o.shared = {{"w", at::zeros({2})}};
  o.config = {{"name", "weights"}};
  Pool pool(o);
  try {
    pool.submit("shared_read", {}).get();
    FAIL("no error");
  } catch (const TaskError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'weights'") && Catch::Contains("1 shared: w"));
  }
}

TEST_CASE("bad shared options are refused before any worker starts", "[pool][shared]") {
  PoolOptions o = shared_pool(1, start_of(0));
  SECTION("an undefined tensor") {
    o.shared = {{"w", at::Tensor()}};
    CHECK_THROWS_WITH(Pool(o), Catch::Contains("'w' is an undefined tensor"));
  }
  SECTION("an empty name") {
    o.shared = {{"", at::zeros({1})}};
    CHECK_THROWS_WITH(Pool(o), Catch::Contains("empty name"));
  }
  SECTION("a sparse tensor") {
    o.shared = {{"s", at::zeros({4}).to_sparse()}};
    CHECK_THROWS_WITH(Pool(o), Catch::Contains("shared tensor 's'") && Catch::Contains("Sparse"));
  }
}

TEST_CASE("Hogwild: workers train one shared model and its shared momentum, through a crash",
          "[pool][shared]") {
  // The CPU generator only: torch::manual_seed seeds every GPU too, which initialises CUDA in a
  // CUDA build of LibTorch, and this process then may not fork its workers.
  {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_current_seed(1);
  }
  torch::nn::Linear model(4, 1);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  PoolOptions o = shared_pool(2, start_of(kUnderAsan ? 1 : 0));
  o.shared = share_module(*model, "model.");
  o.shared.merge(share_optimizer(opt));
  Pool pool(o);

  const at::Tensor truth = at::tensor({1.5f, -2.0f, 0.5f, 3.0f}).view({4, 1});
  auto batch = [&](std::size_t) {
    at::Tensor x = empty_shared({16, 4}, at::kFloat).normal_();
    at::Tensor y = empty_shared({16, 1}, at::kFloat);
    y.copy_(x.matmul(truth) + 0.25f);
    return Tensors{x, y};
  };
  std::size_t done = 0;
  auto results = pool.imap_unordered("linear_sgd_step", 600, batch);
  while (auto r = results.next()) {
    r->get();
    if (++done == 200) ::kill(pool.worker_pids().at(1), SIGKILL);  // mid-run
  }
  CHECK(done == 600);
  // What it held when it died, retried: short tasks, so the pool may have let it hold many.
  CHECK(pool.stats().workers.at(1).tasks_lost <= supervisor::QueueDepth::kMaxDepth);
  // Its replacement may still be starting (spawned under ThreadSanitizer): the pool went on.
  const auto deadline = Clock::now() + 60s;
  while (pool.stats().workers.at(1).restarts == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(pool.stats().workers.at(1).restarts == 1);
  // The supervisor's own model learnt what the workers learnt.
  at::NoGradGuard no_grad;
  CHECK(model->weight.view({4, 1}).allclose(truth, 0, 0.05));
  CHECK(std::abs(model->bias.item<float>() - 0.25f) < 0.05f);
  CHECK(o.shared.at("optimizer.0.momentum_buffer").abs().sum().item<float>() > 0);
}

}  // namespace
}  // namespace ferry
