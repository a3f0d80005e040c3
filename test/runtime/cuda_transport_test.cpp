// CUDA tensors across real processes, on a real GPU. Every test skips (exit code 77, with the
// reason printed) where there is no device or LibTorch has no CUDA.
//
// The sending process forks its receivers before it touches CUDA (a child forked after CUDA
// initialisation cannot use it), so the GPU check itself runs in a child too.
#include <signal.h>
#include <unistd.h>

#include "../catch.hpp"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>

#include "../gpu_check.hpp"
#include "../test_util.hpp"
#include "cuda_test_util.hpp"
#include "ipc/cuda/fork_safety.hpp"
#include "ipc/cuda/gate.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/cuda/sync_policy.hpp"
#include "ipc/diag/shm_check.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"
#include "runtime/cuda_ipc.hpp"
#include "runtime/pool.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/tensor_queue.hpp"
#include "workers/builtin_tasks.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

using test::allocator_reuses;
using test::expect;
using test::kCuda;

cuda::BlockInfo block_of(const at::Tensor& t) {
  cuda::BlockInfo b;
  cuda::block_of(t.data_ptr(), &b);
  return b;
}

std::uint64_t reason_count(CopyReason r) {
  return transport_stats().copies_by_reason[static_cast<int>(r)];
}

TEST_CASE("two tensors from one cudaMalloc block reach one peer correct, with one open", "[gpu]") {
  REQUIRE_GPU();
  auto q = TensorQueue::create({8});
  const pid_t child = test::fork_child([&] {
    Tensors a = q.recv(60s);
    Tensors b = q.recv(60s);
    expect(a[0].is_cuda() && b[0].is_cuda(), "the tensors arrive on the device");
    expect(at::equal(a[0].cpu(), at::full({256}, 1.0f)), "first tensor's values");
    expect(at::equal(b[0].cpu(), at::full({256}, 2.0f)), "second tensor's values");
    const TransportStats s = transport_stats();
    expect(s.cuda_handles_opened == 1, "one open, got " + std::to_string(s.cuda_handles_opened));
    expect(s.cuda_handle_cache_hits == 1, "one cache hit");
  });
  at::Tensor x = at::full({256}, 1.0f, kCuda);
  at::Tensor y = at::full({256}, 2.0f, kCuda);
  // The precondition of the classic failure: both live in one allocation of LibTorch's cache.
  REQUIRE(block_of(x).base == block_of(y).base);
  q.send({x}, 60s);
  q.send({y}, 60s);
  REQUIRE(test::wait_child(child) == 0);
  CHECK(transport_stats().cuda_handles_exported == 1);
  CHECK(transport_stats().cuda_tensors_zero_copy == 2);
}

TEST_CASE("1000 tensors of one caching-allocator segment: one open per allocation", "[gpu]") {
  REQUIRE_GPU();
  constexpr int kCount = 1000;
  auto q = TensorQueue::create({64});
  const pid_t child = test::fork_child([&] {
    Tensors held;
    for (int i = 0; i < kCount; ++i) {
      Tensors m = q.recv(60s);
      held.push_back(m[0]);
    }
    const std::int64_t allocations = q.recv(60s)[0].item<std::int64_t>();
    for (int i = 0; i < kCount; ++i) {
      expect(at::equal(held[i].cpu(), at::full({256}, static_cast<float>(i))),
             "values of tensor " + std::to_string(i));
    }
    const TransportStats s = transport_stats();
    expect(static_cast<std::int64_t>(s.cuda_handles_opened) == allocations,
           std::to_string(s.cuda_handles_opened) + " opens for " + std::to_string(allocations) +
               " allocations");
    expect(s.cuda_handle_cache_hits + s.cuda_handles_opened == kCount, "every tensor a view");
  });
  std::vector<at::Tensor> sent;
  std::set<std::uintptr_t> bases;
  for (int i = 0; i < kCount; ++i) {
    sent.push_back(at::full({256}, static_cast<float>(i), kCuda));
    bases.insert(block_of(sent.back()).base);
  }
  REQUIRE(bases.size() < 10);  // 1 KiB tensors share LibTorch's 2 MiB segments
  for (const auto& t : sent) q.send({t}, 60s);
  q.send({at::scalar_tensor(static_cast<std::int64_t>(bases.size()), at::kLong)}, 60s);
  REQUIRE(test::wait_child(child) == 0);
  CHECK(transport_stats().cuda_handles_exported == bases.size());
}

TEST_CASE("a kernel's result is sent with no host sync and read correctly", "[gpu]") {
  REQUIRE_GPU();
  constexpr std::int64_t kFloats = std::int64_t{1} << 26;  // 256 MiB: the kernels take a while
  constexpr int kPasses = 40;
  auto q = TensorQueue::create({4});
  const pid_t child = test::fork_child([&] {
    at::Tensor y = q.recv(60s)[0];
    // Queued behind the sender's event on this process's stream: every pass is visible.
    expect(y.min().item<float>() == kPasses, "min " + std::to_string(y.min().item<float>()));
    expect(y.max().item<float>() == kPasses, "max");
  });
  at::Tensor x = at::zeros({kFloats}, kCuda);
  for (int i = 0; i < kPasses; ++i) x.add_(1);
  const TransportStats before = transport_stats();
  q.send({x}, 60s);  // orders the receiver; does not wait for the kernels
  const TransportStats after = transport_stats();
  const char* mode = std::getenv("FERRY_CUDA_SYNC");
  if (mode != nullptr && std::string(mode) == "stream") {
    CHECK(after.cuda_event_pool_syncs == before.cuda_event_pool_syncs + 1);
  } else {
    // The stream was busy (40 passes over 256 MiB): a timeline write or an event, no host sync.
    CHECK(after.cuda_event_pool_syncs == before.cuda_event_pool_syncs);
    CHECK(after.cuda_memop_writes + after.cuda_events_recorded ==
          before.cuda_memop_writes + before.cuda_events_recorded + 1);
    if (mode != nullptr && std::string(mode) == "event") {
      CHECK(after.cuda_events_recorded == before.cuda_events_recorded + 1);
    }
  }
  REQUIRE(test::wait_child(child) == 0);
}

TEST_CASE("an idle stream's send orders nothing, a busy one's a timeline write (auto)", "[gpu]") {
  REQUIRE_GPU();
  const char* mode = std::getenv("FERRY_CUDA_SYNC");
  if (mode != nullptr && std::string(mode) != "auto") {
    SUCCEED("FERRY_CUDA_SYNC=" << mode << " forces one way: the test of auto does not apply");
    return;
  }
  auto q = TensorQueue::create({8});
  const pid_t child = test::fork_child([&] {
    for (float want : {3.0f, 41.0f}) {
      at::Tensor y = q.recv(60s)[0];
      expect(y.min().item<float>() == want && y.max().item<float>() == want,
             "received " + std::to_string(y.min().item<float>()));
    }
  });
  at::Tensor idle = at::full({1 << 20}, 3.0f, kCuda);
  REQUIRE(cuda::synchronize_device(0).ok());  // nothing pending on the stream now
  const TransportStats t0 = transport_stats();
  q.send({idle}, 60s);
  const TransportStats t1 = transport_stats();
  CHECK(t1.cuda_idle_sends == t0.cuda_idle_sends + 1);
  at::Tensor busy = at::zeros({std::int64_t{1} << 26}, kCuda);
  for (int i = 0; i < 41; ++i) busy.add_(1);
  q.send({busy}, 60s);
  const TransportStats t2 = transport_stats();
  const auto no_memops = static_cast<int>(cuda::SyncFallback::no_memops);
  if (t2.cuda_sync_fallbacks[no_memops] > t1.cuda_sync_fallbacks[no_memops]) {
    WARN("this device failed the memop probe: an event ordered the receiver instead");
    CHECK(t2.cuda_events_recorded == t1.cuda_events_recorded + 1);
  } else {
    CHECK(t2.cuda_memop_writes == t1.cuda_memop_writes + 1);
  }
  REQUIRE(test::wait_child(child) == 0);
}

TEST_CASE("the sender's block lives until the receiver drops it, then returns to LibTorch",
          "[gpu]") {
  REQUIRE_GPU();
  test::check_memory_returns(false);
}

TEST_CASE("a receiver SIGKILLed holding views: the sender's memory is reclaimed", "[gpu]") {
  REQUIRE_GPU();
  const auto reclaimed = transport_stats().leases_reclaimed;
  test::check_memory_returns(true);
  CHECK(transport_stats().leases_reclaimed == reclaimed + 1);
}

TEST_CASE(
    "a CUDA message whose sender is SIGKILLed before it is taken fails with peer_dead naming it, "
    "and the queue works on",
    "[gpu]") {
  REQUIRE_GPU();
  auto q = TensorQueue::create({8});
  const pid_t child = test::fork_child([&] {
    const at::Tensor x = at::arange(1000, kCuda);
    expect(x.sum().item<std::int64_t>() == 499500, "the tensor is made");  // an idle stream
    q.send({x, at::full({5000}, 3.0)}, 60s);
    q.send({at::full({5000}, 4.0)}, 60s);  // CPU only: its segments are in the custody
    ::raise(SIGKILL);
  });
  REQUIRE(test::wait_child(child) == 128 + SIGKILL);
  try {
    q.recv(30s);
    FAIL("the CUDA message arrived after its sender died");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::peer_dead);
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("pid " + std::to_string(child)));
    CHECK_THAT(what, Catch::Contains("t.cpu()"));  // the remedy
  }
  const Tensors m = q.recv(30s);
  REQUIRE(m.size() == 1);
  CHECK(m[0].eq(4).all().item<bool>());
}

TEST_CASE("a re-exported tensor is copied by the process that forwards it", "[gpu]") {
  REQUIRE_GPU();
  auto q = TensorQueue::create({4});
  auto back = TensorQueue::create({4});
  auto done = TensorQueue::create({4});
  const pid_t child = test::fork_child([&] {
    Tensors m = q.recv(60s);
    const auto before = reason_count(CopyReason::received);
    back.send({m[0]}, 60s);  // forwards what it received: must be a copy of its own
    expect(reason_count(CopyReason::received) == before + 1, "counted as a re-export");
    done.recv(60s);  // the parent reads the copy's memory, which lives in this process
  });
  at::Tensor x = at::arange(1000, kCuda);
  q.send({x}, 60s);
  at::Tensor forwarded = back.recv(60s)[0];
  CHECK(forwarded.is_cuda());
  CHECK(at::equal(forwarded.cpu(), x.cpu()));
  done.send({}, 60s);
  REQUIRE(test::wait_child(child) == 0);
}

// Sends `x` through `q` to this same process and returns what arrives, checking that one copy
// was counted for `reason` and that the values (not the memory) are x's.
// by_sender: the sender copies (and its send reports why); else the receiver does.
at::Tensor round_trip_copy(TensorQueue q, const at::Tensor& x, CopyReason reason,
                           const TensorQueue::SendOptions& opt, bool by_sender = true) {
  const auto before = reason_count(reason);
  const SendReport sent = q.send({x}, opt);
  REQUIRE(sent.tensors.size() == 1);
  CHECK(sent.tensors[0].cuda);
  CHECK(sent.tensors[0].copied == (by_sender ? std::optional<CopyReason>(reason) : std::nullopt));
  at::Tensor y = q.recv(60s)[0];
  CHECK(reason_count(reason) == before + 1);
  CHECK(y.data_ptr() != x.data_ptr());
  CHECK(at::equal(y.cpu(), x.cpu()));
  return y;
}

TEST_CASE("same-process, CPU-only and detached sends copy, each with its reason", "[gpu]") {
  REQUIRE_GPU();
  const at::Tensor x = at::arange(1000, kCuda);
  TensorQueue::SendOptions opt;
  opt.timeout = 60s;
  {
    INFO("a receiver known to be this process: the sender copies on the device");
    auto self = TensorQueue::create({4});
    self.set_receiver(::getpid(), 0);
    CHECK(round_trip_copy(self, x, CopyReason::same_process, opt).is_cuda());
  }
  {
    INFO("a shared queue read back by its sender: the receiver copies");
    CHECK(round_trip_copy(TensorQueue::create({4}), x, CopyReason::same_process, opt, false)
              .is_cuda());
  }
  {
    INFO("a CPU-only receiver gets a CPU tensor through shared memory");
    auto cpu_peer = TensorQueue::create({4});
    cpu_peer.set_receiver(::getpid() + 1, -1);
    CHECK(round_trip_copy(cpu_peer, x, CopyReason::cpu_receiver, opt).device().is_cpu());
  }
  {
    INFO("a detached send is a copy the receiver owns alone");
    TensorQueue::SendOptions detached = opt;
    detached.detached = true;
    CHECK(round_trip_copy(TensorQueue::create({4}), x, CopyReason::detached, detached).is_cuda());
  }
  {
    INFO("an empty tensor has nothing to export: it crosses as a record, and arrives on the GPU");
    auto q = TensorQueue::create({4});
    const SendReport sent = q.send({at::empty({0, 3}, kCuda)}, opt);
    CHECK(sent.tensors.at(0).copied == CopyReason::empty);
    const at::Tensor y = q.recv(60s).at(0);
    CHECK(y.is_cuda());
    CHECK(y.sizes() == at::IntArrayRef({0, 3}));
  }
}

TEST_CASE("a pool of cuda:0 workers takes CUDA inputs by handle and returns CUDA results",
          "[gpu]") {
  REQUIRE_GPU();
  PoolOptions o;
  o.devices = {"cuda:0", "cuda:0"};
  o.worker_executable = FERRY_WORKER_EXE;
  Pool pool(o);  // workers start before this process touches CUDA
  std::vector<Tensors> inputs;
  for (int i = 0; i < 64; ++i) {
    inputs.push_back({at::randn({32, kMlpFeatures}, at::TensorOptions().dtype(at::kFloat))
                          .to(at::Device(at::kCUDA, 0))});
  }
  std::vector<Tensors> out = pool.map("mlp", inputs);
  REQUIRE(out.size() == inputs.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    REQUIRE(out[i][0].is_cuda());
    CHECK(at::allclose(out[i][0].cpu(), reference_mlp(inputs[i][0].cpu()), 1e-4, 1e-5));
  }
  const PoolStats s = pool.stats();
  CHECK(s.input_tensors_zero_copy == inputs.size());
  CHECK(s.input_tensors_copied == 0);
  CHECK(transport_stats().cuda_handles_opened >= 1);  // the results, opened here
  for (const auto& t : out) CHECK(source_alive(t[0]));
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST_CASE("a CPU-only parent that used every ferry API forks a child that then uses CUDA",
          "[gpu]") {
  REQUIRE_GPU();
  // Queues to a forked child and back, shared tensors, pools by fork and spawn, the shm check.
  at::Tensor weights = empty_shared({64, 64}, at::kFloat).normal_();
  ShmCheckOptions check;
  check.workers = 2;
  (void)check_shm(check);
  TensorQueue to_child = TensorQueue::create(), from_child = TensorQueue::create();
  const pid_t echo = test::fork_child([&] {
    from_child.send({to_child.recv(60s).at(0) * 2}, 60s);
    flush(5s);
  });
  to_child.send({weights}, 60s);
  expect(from_child.recv(60s).at(0).equal(weights * 2), "the queue's round trip");
  REQUIRE(test::wait_child(echo, 60s) == 0);
  for (Start start : {Start::Fork, Start::Spawn}) {
    PoolOptions o;
    o.devices = {"cpu", "cpu"};
    o.start = start;
    o.worker_executable = FERRY_WORKER_EXE;
    o.shared = {{"w", weights}};
    Pool pool(o);
    CHECK(pool.submit("square", {at::full({2}, 3.0)}).get()[0][0].item<double>() == 9.0);
  }
  INFO("ferry entered CUDA for: " << (cuda::first_entry() ? cuda::first_entry() : "nothing"));
  REQUIRE(cuda::first_entry() == nullptr);
  REQUIRE_FALSE(cuda::initialised());

  const pid_t child = test::fork_child([] {
    const at::Tensor x = at::arange(4, kCuda);
    expect((x * 2).sum().item<float>() == 12.0f, "a kernel's result in the forked child");
  });
  CHECK(test::wait_child(child, 120s) == 0);
}

}  // namespace
}  // namespace ferry
