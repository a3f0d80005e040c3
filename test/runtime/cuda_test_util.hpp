// What the GPU tests of the CUDA transport share: a child's expectations, the device's options,
// and the check that a sent tensor's memory is held while a receiver views it and returns to
// LibTorch after. Every caller has passed REQUIRE_GPU().
#pragma once

#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.hpp"
#include "runtime/tensor_queue.hpp"

namespace ferry::test {

// In a child: a failed expectation ends it with code 1, saying what failed.
inline void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "child %d: expectation failed: %s\n", static_cast<int>(::getpid()),
               what.c_str());
  std::fflush(nullptr);
  ::_exit(1);
}

inline const at::TensorOptions kCuda = at::TensorOptions().device(at::kCUDA, 0).dtype(at::kFloat);

// Waits until the CUDA caching allocator hands out `address` again for a tensor of `floats`
// elements: proof that the block behind it was given back. Keeps the tries alive so each new
// one must land elsewhere.
inline bool allocator_reuses(std::uintptr_t address, std::int64_t floats,
                             std::chrono::seconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  std::vector<at::Tensor> tries;
  while (std::chrono::steady_clock::now() < deadline) {
    tries.push_back(at::empty({floats}, kCuda));
    if (reinterpret_cast<std::uintptr_t>(tries.back().data_ptr()) == address) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Sends a 64 MiB tensor (an allocation of its own) to a forked receiver that holds it: the
// sender's memory stays held for it. Then the receiver drops the tensor, or is SIGKILLed holding
// it, and LibTorch has the memory back. `sent` sees the tensor before it is sent (a test may
// skip there, given the receiver's pid).
inline void check_memory_returns(bool kill_receiver,
                                 const std::function<void(const at::Tensor&, pid_t)>& sent = {}) {
  using namespace std::chrono_literals;
  constexpr std::int64_t kFloats = 16 << 20;
  auto q = TensorQueue::create({4});
  auto up = TensorQueue::create({4});
  auto down = TensorQueue::create({4});
  const pid_t child = fork_child([&] {
    at::Tensor y = q.recv(60s)[0];
    expect(y.sum().item<float>() == static_cast<float>(kFloats), "values");
    up.send({}, 60s);  // holding
    down.recv(60s);
    y.reset();
    up.send({}, 60s);  // dropped
    down.recv(60s);
  });
  std::uintptr_t address = 0;
  {
    at::Tensor x = at::ones({kFloats}, kCuda);
    if (sent) sent(x, child);
    address = reinterpret_cast<std::uintptr_t>(x.data_ptr());
    q.send({x}, 60s);
  }  // the sender's own reference is gone; the receiver's lease holds the storage
  up.recv(60s);
  CHECK_FALSE(allocator_reuses(address, kFloats, 1s));  // still held for the receiver
  if (kill_receiver) {
    ::kill(child, SIGKILL);
    CHECK(wait_child(child) == 128 + SIGKILL);
  } else {
    down.send({}, 60s);
    up.recv(60s);
  }
  CHECK(allocator_reuses(address, kFloats, 5s));  // released: LibTorch has it back
  if (!kill_receiver) {
    down.send({}, 60s);
    REQUIRE(wait_child(child) == 0);
  }
}

}  // namespace ferry::test
