// Shared allocations: tensors LibTorch allocates are born in the arena while they are on, travel
// zero-copy, fall back when the arena is full, and are safe across fork. Real processes, real
// shared memory.
// LibTorch first: its glog defines CHECK, which Catch's must replace.
#include "runtime/shared_allocations.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <sys/resource.h>

#include "../catch.hpp"

#include <cstdlib>
#include <thread>

#include "../test_util.hpp"
#include "ipc/stats.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/tensor_queue.hpp"

using ferry::SharedAllocations;
using ferry::TensorQueue;
using ferry::Tensors;
using namespace std::chrono_literals;

namespace {

constexpr std::int64_t kLarge = 1 << 18;  // float32 elements: 1 MiB
constexpr std::int64_t kSmall = 64;       // 256 bytes

long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

}  // namespace

TEST_CASE("shared allocations: large tensors LibTorch makes are born in the arena, small ones not",
          "[shared_alloc]") {
  CHECK_FALSE(ferry::shared_allocations());  // off until asked
  CHECK_FALSE(ferry::is_shared(at::empty({kLarge})));
  const auto before = ferry::transport_stats();
  {
    SharedAllocations on;
    CHECK(ferry::shared_allocations());
    CHECK(ferry::shared_allocator_installed());
    // A fresh tensor, an operator's output and a model-like chain alike.
    at::Tensor fresh = at::empty({kLarge});
    at::Tensor sum = at::ones({kLarge}) + 1;
    at::Tensor out = at::matmul(at::ones({512, 512}), at::ones({512, 512}));
    CHECK(ferry::is_shared(fresh));
    CHECK(ferry::is_shared(sum));
    CHECK(ferry::is_shared(out));
    CHECK(sum.equal(at::full({kLarge}, 2.0f)));
    CHECK(out[0][0].item<float>() == 512.0f);
    CHECK_FALSE(ferry::is_shared(at::empty({kSmall})));
    // Just under the threshold and at it.
    const auto threshold = static_cast<std::int64_t>(ferry::shared_allocation_threshold());
    CHECK_FALSE(ferry::is_shared(at::empty({threshold - 1}, at::kByte)));
    CHECK(ferry::is_shared(at::empty({threshold}, at::kByte)));
    {
      SharedAllocations off(false);  // scopes nest
      CHECK_FALSE(ferry::is_shared(at::empty({kLarge})));
    }
    CHECK(ferry::is_shared(at::empty({kLarge})));
  }
  CHECK_FALSE(ferry::shared_allocations());
  CHECK_FALSE(ferry::is_shared(at::empty({kLarge})));
  const auto after = ferry::transport_stats();
  CHECK(after.shared_allocations - before.shared_allocations >= 6);
  CHECK(after.shared_allocation_fallbacks == before.shared_allocation_fallbacks);
  // Born-shared blocks went back to the arena with their tensors.
  CHECK(ferry::arena_stats().blocks_in_use == 0);
}

TEST_CASE("shared allocations: a scope is the calling thread's, the process setting everyone's",
          "[shared_alloc]") {
  SharedAllocations on;
  bool other_thread = true;
  std::thread([&] { other_thread = ferry::is_shared(at::empty({kLarge})); }).join();
  CHECK_FALSE(other_thread);
  ferry::set_shared_allocations(true);
  std::thread([&] { other_thread = ferry::is_shared(at::empty({kLarge})); }).join();
  CHECK(other_thread);
  {
    SharedAllocations off(false);  // a thread's scope wins over the process's setting
    CHECK_FALSE(ferry::is_shared(at::empty({kLarge})));
  }
  ferry::set_shared_allocations(false);
}

TEST_CASE(
    "shared allocations: a born-shared tensor is sent zero-copy, the receiver sees its memory",
    "[shared_alloc]") {
  auto q = TensorQueue::create({4});
  auto up = TensorQueue::create({4});
  auto down = TensorQueue::create({4});
  const pid_t child = ferry::test::fork_child([&] {
    Tensors m = q.recv(30s);
    if (!m[0].equal(at::full({kLarge}, 3.0f))) ::_exit(10);
    up.send({}, 30s);
    down.recv(30s);  // the parent has written into the tensor it sent
    if (!m[0].equal(at::full({kLarge}, 4.0f))) ::_exit(11);
  });
  SharedAllocations on;
  at::Tensor t = at::full({kLarge}, 3.0f);
  const auto report = q.send({t}, 30s);
  REQUIRE(report.tensors.size() == 1);
  CHECK_FALSE(report.tensors[0].copied.has_value());  // shared in place, not copied
  up.recv(30s);
  t.fill_(4.0f);
  down.send({}, 30s);
  CHECK(ferry::test::wait_child(child) == 0);
}

TEST_CASE("shared allocations: a full arena falls back to LibTorch's allocator, counted",
          "[shared_alloc]") {
  // One segment of 64 MiB may be born shared, and no more; set before the first use reads it.
  ::setenv("FERRY_SHARED_ALLOCATIONS_MAX", "64M", 1);
  SharedAllocations on;
  const auto before = ferry::transport_stats();
  std::vector<at::Tensor> held;
  for (int i = 0; i < 40; ++i) held.push_back(at::full({kLarge * 2}, static_cast<float>(i)));
  const auto after = ferry::transport_stats();
  // 40 tensors of 2 MiB: 31 or 32 fit the segment, the others fell back, and all are correct.
  const auto born = after.shared_allocations - before.shared_allocations;
  const auto fell = after.shared_allocation_fallbacks - before.shared_allocation_fallbacks;
  CHECK(born + fell == 40);
  CHECK(born >= 30);
  CHECK(fell >= 8);
  CHECK(after.bytes_shared_allocation_fallbacks - before.bytes_shared_allocation_fallbacks ==
        fell * kLarge * 2 * 4);
  CHECK(ferry::arena_stats().segments == 1);
  for (int i = 0; i < 40; ++i) CHECK(held[i].equal(at::full({kLarge * 2}, static_cast<float>(i))));
  CHECK_FALSE(ferry::is_shared(held.back()));
  // A fallen-back tensor is still sent, with a copy, and arrives whole.
  auto q = TensorQueue::create({4});
  const auto report = q.send({held.back()}, 30s);
  CHECK(report.tensors[0].copied.has_value());
  CHECK(q.recv(30s)[0].equal(held.back()));
  // Freed blocks are born shared again.
  held.clear();
  CHECK(ferry::is_shared(at::empty({kLarge * 2})));
  ::unsetenv("FERRY_SHARED_ALLOCATIONS_MAX");
}

TEST_CASE(
    "shared allocations: a fresh 64 MiB tensor per message reuses its blocks, faulting no more",
    "[shared_alloc]") {
  constexpr std::int64_t kBig = std::int64_t{16} << 20;  // float32: 64 MiB
  SharedAllocations on;
  auto q = TensorQueue::create({8});
  long faults_late = 0;
  for (int i = 0; i < 12; ++i) {
    const long before = minor_faults();
    at::Tensor t = at::empty({kBig});
    t.fill_(static_cast<float>(i));
    REQUIRE(ferry::is_shared(t));
    q.send({t}, 30s);
    t.reset();
    Tensors m = q.recv(30s);  // this process receives its own tensor: a view of the block
    REQUIRE(m[0][kBig - 1].item<float>() == static_cast<float>(i));
    m.clear();
    if (i >= 4) faults_late += minor_faults() - before;
  }
  // 16 384 pages a tensor if each came fresh; reused blocks are faulted in already.
  CHECK(faults_late < 8 * 1000);
  CHECK(ferry::arena_stats().segments <= 3);
}

TEST_CASE("shared allocations: LibTorch's raw allocator interface works for both kinds",
          "[shared_alloc]") {
  SharedAllocations on;
  c10::Allocator* a = c10::GetCPUAllocator();
  REQUIRE(a->raw_deleter() != nullptr);
  void* big = a->raw_allocate(std::size_t{4} << 20);
  void* small = a->raw_allocate(64);
  std::memset(big, 1, std::size_t{4} << 20);
  std::memset(small, 1, 64);
  CHECK(ferry::arena_stats().blocks_in_use == 1);
  a->raw_deallocate(big);
  a->raw_deallocate(small);
  CHECK(ferry::arena_stats().blocks_in_use == 0);
}

TEST_CASE("shared allocations: fork after allocating, with OpenMP threads busy", "[shared_alloc]") {
  ferry::set_shared_allocations(true);
  // A parallel region first, so a forked child meets OpenMP's team (OMP_NUM_THREADS=2 runs).
  at::Tensor warm = at::ones({1 << 20}).sum();
  at::Tensor parent = at::full({kLarge}, 6.0f);
  REQUIRE(ferry::is_shared(parent));
  const auto base = ferry::arena_stats();
  auto q = TensorQueue::create({4});
  const pid_t child = ferry::test::fork_child([&] {
    // Off in a forked child until it asks; the inherited tensor reads the same values.
    if (ferry::shared_allocations()) ::_exit(10);
    if (ferry::is_shared(at::empty({kLarge}))) ::_exit(11);
    if (!parent.equal(at::full({kLarge}, 6.0f))) ::_exit(12);
    // Sending the inherited block copies it (it is the parent's arena's, not this one's).
    const auto r = q.send({parent}, 30s);
    if (!r.tensors[0].copied) ::_exit(13);
    // Its own allocations, once asked, are in its own arena; threads allocate too.
    ferry::set_shared_allocations(true);
    at::Tensor mine = at::ones({kLarge}) * 2;
    if (!ferry::is_shared(mine)) ::_exit(14);
    at::Tensor reduced = at::ones({1 << 22}).sum();
    if (reduced.item<float>() != static_cast<float>(1 << 22)) ::_exit(15);
    const auto r2 = q.send({mine}, 30s);
    if (r2.tensors[0].copied) ::_exit(16);
    parent.reset();  // freeing the parent's block here leaves the parent's arena alone
    if (ferry::flush(30s) != 0) ::_exit(17);
  });
  Tensors a = q.recv(30s);
  Tensors b = q.recv(30s);
  CHECK(ferry::test::wait_child(child) == 0);
  CHECK(a[0].equal(at::full({kLarge}, 6.0f)));
  CHECK(b[0].equal(at::full({kLarge}, 2.0f)));
  const auto now = ferry::arena_stats();
  CHECK(now.blocks_in_use == base.blocks_in_use);
  CHECK(parent.equal(at::full({kLarge}, 6.0f)));
  ferry::set_shared_allocations(false);
}
