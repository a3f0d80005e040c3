// Tasks for the pool tests, linked both into the test binary (forked workers) and into
// ferry-test-worker (spawned workers): a user's own tasks, registered the way users do.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <ATen/Parallel.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <memory>

#include "runtime/shared_module.hpp"
#include "runtime/shared_tensor.hpp"
#include "sized_detail.hpp"
#include "workers/task_registry.hpp"

namespace {

using ferry::TaskContext;
using ferry::Tensors;

// in[0]: microseconds to sleep (int64 scalar); in[1]: a payload, returned plus zero.
FERRY_TASK("sleep_echo", [](TaskContext&, Tensors in) {
  std::this_thread::sleep_for(std::chrono::microseconds(in.at(0).item<std::int64_t>()));
  return Tensors{in.at(1) + 0};
});

// in[0]: how many float32 zeros to return (int64 scalar): a large result from a small input.
FERRY_TASK("zeros", [](TaskContext&, Tensors in) {
  return Tensors{at::zeros({in.at(0).item<std::int64_t>()}, at::kFloat)};
});

// Throws for inputs whose first element is negative.
FERRY_TASK("fail_if_negative", [](TaskContext& ctx, Tensors in) {
  const auto v = in.at(0).item<std::int64_t>();
  if (v < 0) throw std::runtime_error("asked to fail on " + std::to_string(v) + " in " + ctx.task);
  return Tensors{in.at(0) + 0};
});

// Fails with a TaskFailure whose detail is in[0] (uint8 bytes) and whose message says its size.
FERRY_TASK("fail_with_detail", [](TaskContext&, Tensors in) -> Tensors {
  const at::Tensor& d = in.at(0);
  throw ferry::TaskFailure(
      "failed with a detail of " + std::to_string(d.numel()) + " bytes",
      std::string(static_cast<const char*>(d.data_ptr()), static_cast<std::size_t>(d.numel())));
});

// Fails as fail_with_detail, with a detail of in[0] bytes (a long scalar): sized_detail(n).
FERRY_TASK("fail_with_sized_detail", [](TaskContext&, Tensors in) -> Tensors {
  const auto n = static_cast<std::size_t>(in.at(0).item<std::int64_t>());
  throw ferry::TaskFailure("failed with a detail of " + std::to_string(n) + " bytes",
                           ferry::test::sized_detail(n));
});

// The program's start for each worker (set_worker_start): counts its runs, and throws when the
// pool's config says "test.start" = "fail".
int g_starts = 0;
[[maybe_unused]] const bool g_start_set = [] {
  ferry::set_worker_start([](TaskContext& ctx) {
    ++g_starts;
    if (ctx.config_value("test.start") == "fail") throw std::runtime_error("no model here");
  });
  return true;
}();

// How many times this worker's start ran before the task (1: once, before its first task).
FERRY_TASK("starts",
           [](TaskContext&, Tensors) { return Tensors{at::scalar_tensor(g_starts, at::kLong)}; });

// A parallel sum of in[0] (an int64 scalar) twos, and the worker's intra-op threads: what a
// forked worker would hang at if it inherited its parent's OpenMP team.
Tensors parallel_sum(TaskContext&, Tensors in) {
  const at::Tensor twos = at::full({in.at(0).item<std::int64_t>()}, 2.0, at::kDouble);
  return Tensors{twos.sum(), at::scalar_tensor(at::get_num_threads(), at::kLong)};
}
FERRY_TASK("parallel_sum", parallel_sum);

FERRY_TASK("hang", [](TaskContext&, Tensors) -> Tensors {
  for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(100));
});

FERRY_TASK("segfault", [](TaskContext&, Tensors) -> Tensors {
  ::raise(SIGSEGV);
  return {};
});

// The worker's pid and id, in shared memory (so the result travels zero-copy).
FERRY_TASK("whoami", [](TaskContext& ctx, Tensors) {
  at::Tensor t = ferry::empty_shared({2}, at::kLong);
  t[0] = static_cast<std::int64_t>(::getpid());
  t[1] = ctx.worker_id;
  return Tensors{t};
});

// in[0] plus the task's prelude's first tensor, and the prelude's id (0, and in[0] alone, when
// it has none): what a task sees of a prelude it shares with others.
Tensors prelude_add(TaskContext& ctx, Tensors in) {
  at::Tensor sum = in.at(0).clone();
  if (ctx.prelude) sum += ctx.prelude->at(0);
  return {sum, at::scalar_tensor(static_cast<std::int64_t>(ctx.prelude_id), at::kLong)};
}
FERRY_TASK("prelude_add", prelude_add);

FERRY_TASK("config_echo", [](TaskContext& ctx, Tensors) {
  const std::string v = ctx.config_value("greeting", "none");
  at::Tensor t = at::empty({static_cast<std::int64_t>(v.size())}, at::kByte);
  std::memcpy(t.data_ptr(), v.data(), v.size());
  return Tensors{t};
});

// Adds in[0] to the pool's shared tensor "w" in place and returns a copy of what it now holds.
FERRY_TASK("shared_add", [](TaskContext& ctx, Tensors in) {
  const at::Tensor& w = ctx.shared_tensor("w");
  w.add_(in.at(0));
  return Tensors{w.clone()};
});

// A copy of the shared tensor named by the config's "name" (default "w").
FERRY_TASK("shared_read", [](TaskContext& ctx, Tensors) {
  return Tensors{ctx.shared_tensor(ctx.config_value("name", "w")).clone()};
});

// One SGD step (momentum 0.9) of a 4-input linear model on the minibatch (x, y), Hogwild: the
// model and the momentum are the pool's shared "model." and "optimizer." tensors. Returns the
// loss before the step.
struct LinearTrainer {
  torch::nn::Linear model{4, 1};
  torch::optim::SGD opt{model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)};
};

Tensors linear_sgd_step(TaskContext& ctx, Tensors in) {
  static std::unique_ptr<LinearTrainer> t;  // one per worker process, made at its first task
  if (!t) {
    t = std::make_unique<LinearTrainer>();
    ferry::adopt_shared(*t->model, *ctx.shared, "model.");
    ferry::adopt_shared(t->opt, *ctx.shared);
  }
  t->opt.zero_grad();
  at::Tensor loss = at::mse_loss(t->model->forward(in.at(0)), in.at(1));
  loss.backward();
  t->opt.step();
  return Tensors{loss.detach()};
}
FERRY_TASK("linear_sgd_step", linear_sgd_step);

}  // namespace
