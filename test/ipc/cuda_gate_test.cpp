// ferry's one door into CUDA (ipc/cuda/gate.hpp): a process that used ferry on the CPU alone
// never went through it, so its forked children may still use CUDA. Runs in pool_tests, which
// links every layer, so the whole API can be used here.
#include "ipc/cuda/gate.hpp"

#include <cstring>

#include "../catch.hpp"

#include "../test_util.hpp"
#include "ipc/cuda/fork_safety.hpp"
#include "ipc/diag/shm_check.hpp"
#include "runtime/pool.hpp"
#include "runtime/shared_module.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/tensor_queue.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

TEST_CASE("the CUDA gate keeps ferry's first reason, and a forked child starts without one") {
  test::in_child([] {
    if (cuda::first_entry() != nullptr) ::_exit(1);
    cuda::enter("first");
    cuda::enter("second");
    if (std::strcmp(cuda::first_entry(), "first") != 0) ::_exit(2);
    const pid_t child = test::fork_child([] {
      if (cuda::first_entry() != nullptr) ::_exit(3);
    });
    if (test::wait_child(child, 30s) != 0) ::_exit(4);
  });
}

TEST_CASE("ferry used on the CPU alone never enters CUDA: queues, shared tensors, pools, checks") {
  REQUIRE(cuda::first_entry() == nullptr);
  at::Tensor weights = empty_shared({64, 64}, at::kFloat).normal_();
  ShmCheckOptions check;
  check.workers = 2;
  (void)check_shm(check);

  TensorQueue to_child = TensorQueue::create(), from_child = TensorQueue::create();
  const pid_t child = test::fork_child([&] {
    Tensors got = to_child.recv(30s);
    from_child.send({got.at(0) * 2, at::ones({1000})}, 30s);
    flush(5s);
  });
  to_child.send({weights}, 30s);
  const Tensors back = from_child.recv(30s);
  CHECK(back.at(0).equal(weights * 2));
  REQUIRE(test::wait_child(child, 60s) == 0);

  for (Start start : {Start::Fork, Start::Spawn, Start::Auto}) {
    if (test::kUnderTsan && start != Start::Spawn) continue;  // TSan cannot follow that fork
    PoolOptions o;
    o.devices = {"cpu", "cpu"};
    o.start = start;
    o.worker_executable = FERRY_TEST_WORKER;
    o.shared = {{"w", weights}};
    Pool pool(o);
    const auto out = pool.map("square", {{at::full({3}, 2.0)}, {at::full({3}, 3.0)}});
    CHECK(out.at(1).at(0)[0].item<double>() == 9.0);
  }
  INFO("ferry entered CUDA for: " << (cuda::first_entry() ? cuda::first_entry() : "nothing"));
  CHECK(cuda::first_entry() == nullptr);
  CHECK_FALSE(cuda::initialised());
}

}  // namespace
}  // namespace ferry
