// The pool the pool tests run on: CPU workers of the test worker program (test/workers).
#pragma once

#include "../test_util.hpp"
#include "runtime/pool.hpp"

namespace ferry::test {

// Fork by default, the start a CPU pool picks; spawn under ThreadSanitizer, which cannot follow a
// multithreaded supervisor's fork (kUnderTsan). Tests of a start method name it.
inline PoolOptions cpu_pool(int workers, Start start = kUnderTsan ? Start::Spawn : Start::Fork) {
  PoolOptions o;
  o.devices.assign(workers, "cpu");
  o.start = start;
  o.worker_executable = FERRY_TEST_WORKER;
  return o;
}

// The inputs of the test worker's "sleep_echo": sleep `micros`, then return [4] x `value`.
inline Tensors delayed(std::int64_t micros, std::int64_t value) {
  return {at::scalar_tensor(micros, at::kLong), at::full({4}, value, at::kLong)};
}

}  // namespace ferry::test
