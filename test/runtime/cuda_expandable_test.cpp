// CUDA tensors from LibTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=
// expandable_segments:True on both sides), across real processes on a real GPU: they travel by
// file descriptor, zero-copy. Every test skips (exit code 77, with the reason printed) where
// there is no device, or where LibTorch has no expandable segments (before PyTorch 2.1).
//
// The allocator reads its settings once, at first use, so each test sets them before anything
// touches CUDA; forked receivers inherit them.
#include <signal.h>
#include <unistd.h>

#include "../catch.hpp"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "../gpu_check.hpp"
#include "../test_util.hpp"
#include "cuda_test_util.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/cuda/vmm_api.hpp"
#include "ipc/stats.hpp"
#include "runtime/tensor_queue.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

using test::expect;
using test::kCuda;

void use_expandable_segments() {
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", 1);
}

// Skips (killing the receiver already forked) unless `t` lies in memory that travels by fd.
void require_fd_exportable(const at::Tensor& t, pid_t receiver) {
  cuda::BlockInfo b;
  (void)cuda::block_of(t.data_ptr(), &b);
  if (b.kind == cuda::MemoryKind::vmm && b.fd_exportable) return;
  ::kill(receiver, SIGKILL);
  (void)test::wait_child(receiver);
  std::fprintf(stderr,
               "SKIP: GPU test: this LibTorch's expandable segments are not in effect or not "
               "exportable by fd (memory kind: %s)\n",
               cuda::memory_kind_name(b.kind));
  std::fflush(nullptr);
  std::_Exit(77);
}

// The chunks (physical allocations) a tensor's storage lies in.
std::set<std::uint64_t> chunks_of(const at::Tensor& t) {
  std::set<std::uint64_t> out;
  const auto start = reinterpret_cast<std::uint64_t>(t.storage().data());
  for (std::uint64_t at = start; at < start + t.storage().nbytes();) {
    cuda::Chunk c;
    REQUIRE(cuda::device_vmm().chunk_at(at, &c).ok());
    out.insert(c.base);
    at = c.base + c.size;
  }
  return out;
}

TEST_CASE("expandable segments: tensors travel by fd, zero-copy, each chunk imported once",
          "[gpu]") {
  use_expandable_segments();
  REQUIRE_GPU();
  constexpr std::int64_t kBig = 32 << 20;  // 128 MiB: across several of LibTorch's 20 MiB chunks
  auto q = TensorQueue::create({8});
  auto up = TensorQueue::create({4});
  const pid_t child = test::fork_child([&] {
    Tensors x = q.recv(60s);
    Tensors y = q.recv(60s);
    Tensors big = q.recv(60s);
    const std::int64_t chunks = q.recv(60s)[0].item<std::int64_t>();
    expect(x[0].is_cuda() && big[0].is_cuda(), "the tensors arrive on the device");
    expect(at::equal(x[0].cpu(), at::full({256}, 1.0f)), "x's values");
    expect(at::equal(y[0].cpu(), at::full({256}, 2.0f)), "y's values");
    expect(big[0].sum().item<double>() == static_cast<double>(kBig), "the big tensor's values");
    const TransportStats s = transport_stats();
    expect(static_cast<std::int64_t>(s.cuda_handles_opened) == chunks,
           std::to_string(s.cuda_handles_opened) + " imports for " + std::to_string(chunks) +
               " chunks");
    expect(s.cuda_handle_cache_hits >= 1, "y reused x's mapping");
    big[0].fill_(3.0f);
    expect(big[0].sum().item<double>() == 3.0 * kBig, "written here");
    up.send({}, 60s);
  });
  at::Tensor x = at::full({256}, 1.0f, kCuda);
  require_fd_exportable(x, child);
  at::Tensor y = at::full({256}, 2.0f, kCuda);
  at::Tensor big = at::ones({kBig}, kCuda);
  std::set<std::uint64_t> chunks = chunks_of(x);
  for (const auto& t : {y, big}) {
    const auto more = chunks_of(t);
    chunks.insert(more.begin(), more.end());
  }
  REQUIRE(chunks_of(big).size() > 1);  // the case legacy IPC never meets
  q.send({x}, 60s);
  q.send({y}, 60s);
  q.send({big}, 60s);
  q.send({at::scalar_tensor(static_cast<std::int64_t>(chunks.size()), at::kLong)}, 60s);
  up.recv(60s);
  // The receiver's writes are in the sender's memory: nothing was copied.
  CHECK(big.sum().item<double>() == 3.0 * kBig);
  REQUIRE(test::wait_child(child) == 0);
  const TransportStats s = transport_stats();
  CHECK(s.cuda_tensors_zero_copy == 3);
  CHECK(s.tensors_copied == 0);
}

TEST_CASE("expandable segments: the sender's memory returns once the receiver drops it", "[gpu]") {
  use_expandable_segments();
  REQUIRE_GPU();
  test::check_memory_returns(false, require_fd_exportable);
}

TEST_CASE("expandable segments: a receiver SIGKILLed holding views: the memory is reclaimed",
          "[gpu]") {
  use_expandable_segments();
  REQUIRE_GPU();
  test::check_memory_returns(true, require_fd_exportable);
}

}  // namespace
}  // namespace ferry
