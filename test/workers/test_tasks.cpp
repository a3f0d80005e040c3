// Tasks for the pool tests, linked both into the test binary (forked workers) and into
// ferry-test-worker (spawned workers): a user's own tasks, registered the way users do.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "runtime/shared_tensor.hpp"
#include "workers/task_registry.hpp"

namespace {

using ferry::TaskContext;
using ferry::Tensors;

// in[0]: microseconds to sleep (int64 scalar); in[1]: a payload, returned plus zero.
FERRY_TASK("sleep_echo", [](TaskContext&, Tensors in) {
  std::this_thread::sleep_for(std::chrono::microseconds(in.at(0).item<std::int64_t>()));
  return Tensors{in.at(1) + 0};
});

// Throws for inputs whose first element is negative.
FERRY_TASK("fail_if_negative", [](TaskContext& ctx, Tensors in) {
  const auto v = in.at(0).item<std::int64_t>();
  if (v < 0) throw std::runtime_error("asked to fail on " + std::to_string(v) + " in " + ctx.task);
  return Tensors{in.at(0) + 0};
});

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

FERRY_TASK("config_echo", [](TaskContext& ctx, Tensors) {
  const std::string v = ctx.config_value("greeting", "none");
  at::Tensor t = at::empty({static_cast<std::int64_t>(v.size())}, at::kByte);
  std::memcpy(t.data_ptr(), v.data(), v.size());
  return Tensors{t};
});

}  // namespace
