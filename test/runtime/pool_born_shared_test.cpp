// A pool's workers allocate in shared memory (PoolOptions::shared_allocations): what a task makes
// comes back without a copy, and stays the caller's after the worker is gone. Real workers.
#include "runtime/pool.hpp"

#include <thread>

#include "ipc/stats.hpp"
#include "runtime/peer_exit.hpp"
#include "runtime/shared_tensor.hpp"
#include "test_pools.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kLarge = 1 << 18;  // float32 elements: 1 MiB

using test::cpu_pool;

TEST_CASE("a pool's results are born shared and come back zero-copy, or copied when switched off") {
  const bool on = GENERATE(true, false);
  PoolOptions o = cpu_pool(1);
  o.shared_allocations = on;
  Pool pool(o);
  const at::Tensor count = at::scalar_tensor(kLarge, at::kLong);
  Tensors r = pool.submit("zeros", {count}).get();
  Tensors s = pool.submit("square", {at::full({kLarge}, 3.0f)}).get();
  CHECK(r.at(0).equal(at::zeros({kLarge})));
  CHECK(s.at(0).equal(at::full({kLarge}, 9.0f)));
  const WorkerStats w = pool.stats().workers.at(0);
  INFO("shared_allocations " << on);
  if (on) {
    CHECK(w.tensors_zero_copy == 2);
    CHECK(w.bytes_zero_copy == 2 * kLarge * 4);
    CHECK(w.tensors_copied == 0);
  } else {
    CHECK(w.tensors_zero_copy == 0);
    CHECK(w.tensors_copied == 2);
    CHECK(w.bytes_copied == 2 * kLarge * 4);
  }
  // A small result is copied either way: it is copied again on receipt, so a view of it would
  // only pin the worker's segment (docs/architecture.md, "What a receiver holds").
  pool.submit("square", {at::full({1024}, 2.0f)}).get();  // 4 KiB: over a record's room
  const WorkerStats w2 = pool.stats().workers.at(0);
  CHECK(w2.tensors_copied == w.tensors_copied + 1);
}

TEST_CASE("results born in a worker's shared memory outlive the worker, and its memory goes") {
  const auto before = transport_stats();
  std::vector<Tensors> results;
  {
    Pool pool(cpu_pool(2));
    std::vector<Tensors> inputs;
    for (int i = 0; i < 8; ++i) inputs.push_back({at::full({kLarge}, static_cast<float>(i))});
    results = pool.map("square", inputs);
    const PoolStats s = pool.stats();
    std::uint64_t zero_copy = 0;
    for (const WorkerStats& w : s.workers) zero_copy += w.tensors_zero_copy;
    CHECK(zero_copy == 8);
  }  // both workers have exited
  // Every result moves into this process's own memory once its worker is known to be gone.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (transport_stats().storages_relocated - before.storages_relocated < 8 &&
         std::chrono::steady_clock::now() < deadline) {
    release_dead_peers();
    std::this_thread::sleep_for(10ms);
  }
  CHECK(transport_stats().storages_relocated - before.storages_relocated == 8);
  for (int i = 0; i < 8; ++i) {
    CHECK(results[i].at(0).equal(at::full({kLarge}, static_cast<float>(i * i))));
  }
}

}  // namespace
}  // namespace ferry
