#include "runtime/shared_tensor.hpp"

#include "../catch.hpp"

#include "../test_util.hpp"
#include "ipc/error.hpp"
#include "runtime/tensor_queue.hpp"

using ferry::Errc;
using ferry::Error;

TEST_CASE("empty_shared makes ordinary CPU tensors that live in the arena", "[shared]") {
  auto t = ferry::empty_shared({3, 4}, at::kDouble);
  REQUIRE(t.sizes() == at::IntArrayRef({3, 4}));
  REQUIRE(t.is_contiguous());
  REQUIRE(t.scalar_type() == at::kDouble);
  REQUIRE(ferry::is_shared(t));
  REQUIRE(ferry::is_shared(t.t()));  // views share the storage
  REQUIRE_FALSE(ferry::is_shared(at::ones({2})));
  t.fill_(2);
  REQUIRE((t.matmul(t.t()).sum().item<double>()) == 144.0);
  REQUIRE(ferry::empty_shared({0}).numel() == 0);
  REQUIRE(ferry::empty_shared({}, at::kFloat).dim() == 0);
  REQUIRE(ferry::empty_shared({2}, at::TensorOptions().requires_grad(true)).requires_grad());
}

TEST_CASE("to_shared copies values and keeps dense strides", "[shared]") {
  auto src = at::arange(12, at::kFloat).view({3, 4}).t();
  auto s = ferry::to_shared(src);
  REQUIRE(ferry::is_shared(s));
  REQUIRE(s.equal(src));
  REQUIRE(s.strides() == src.strides());
  auto gapped = at::arange(12, at::kFloat).view({3, 4}).slice(1, 0, 4, 2);
  REQUIRE(ferry::to_shared(gapped).equal(gapped));
}

TEST_CASE("share_ moves a storage into the arena in place, and every view follows", "[shared]") {
  at::Tensor t = at::arange(100, at::kFloat);
  at::Tensor view = t.slice(0, 10, 20);
  const void* before = t.data_ptr();
  REQUIRE(ferry::share_(t).is_same(t));
  REQUIRE(ferry::is_shared(t));
  REQUIRE(ferry::is_shared(view));
  REQUIRE(t.data_ptr() != before);
  REQUIRE(view.data_ptr<float>() == t.data_ptr<float>() + 10);
  REQUIRE(at::equal(t, at::arange(100, at::kFloat)));
  view.fill_(-1);
  REQUIRE(t[15].item<float>() == -1);
  // Resizing would reallocate out of shared memory, where peers would not see it.
  REQUIRE_THROWS(t.resize_({1000}));
  // Already shared: left as it is (idempotent); an empty storage has nothing to move.
  const void* shared_at = t.data_ptr();
  ferry::share_(t);
  REQUIRE(t.data_ptr() == shared_at);
  at::Tensor none = at::empty({0});
  REQUIRE_NOTHROW(ferry::share_(none));
  REQUIRE_FALSE(ferry::is_shared(none));
  // A received tensor is in shared memory already: share_ keeps it a view of its sender's.
  auto q = ferry::TensorQueue::create();
  q.send({ferry::empty_shared({4}).fill_(3)});
  at::Tensor received = q.recv(std::chrono::seconds(5)).at(0);
  const void* received_at = received.data_ptr();
  ferry::share_(received);
  REQUIRE(received.data_ptr() == received_at);
  REQUIRE_THROWS_AS(ferry::share_(at::eye(3).to_sparse()), Error);
}

TEST_CASE("empty_shared refuses bad requests by name", "[shared]") {
  REQUIRE_THROWS_WITH(ferry::empty_shared({2, -1}), Catch::Contains("-1"));
  REQUIRE_THROWS_WITH(ferry::empty_shared({2}, at::TensorOptions().layout(at::kSparse)),
                      Catch::Contains("strided"));
}

TEST_CASE("when /dev/shm is full, allocation and send fail cleanly, never SIGBUS",
          "[shared][tmpfs]") {
  ferry::test::in_child([] {
    ferry::test::private_tmpfs(24 << 20);  // the child's own /dev/shm: 24 MiB
    ::setenv("FERRY_ARENA_SEGMENT_MB", "4", 1);
    auto q = ferry::TensorQueue::create({4});
    auto ok = ferry::empty_shared({1 << 20}, at::kFloat);  // 4 MiB: fits
    ok.fill_(1);
    try {
      ferry::empty_shared({32 << 20}, at::kFloat);  // 128 MiB
      throw std::runtime_error("a 128 MiB tensor fit in a 24 MiB /dev/shm");
    } catch (const Error& e) {
      if (e.code() != Errc::shm_exhausted) throw;
    }
    try {
      q.send({at::ones({32 << 20})}, std::chrono::seconds(1));  // copy-on-send needs room too
      throw std::runtime_error("copy-on-send of 128 MiB fit");
    } catch (const Error& e) {
      if (e.code() != Errc::shm_exhausted) throw;
    }
    // Nothing was lost: the queue and the arena still work.
    q.send({ok}, std::chrono::seconds(1));
    if (!q.recv(std::chrono::seconds(1))[0].equal(ok)) throw std::runtime_error("wrong data");
  });
}
