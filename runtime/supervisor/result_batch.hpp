// What a collector thread takes from its worker's result queue per wake-up: the message it waited
// for, then every one already queued behind it, up to a bound, in the order they were sent. The
// board is then locked once for all of them (result_collector.hpp): a wake-up and a hold of the
// board's lock per result were most of a short task's cost on the supervisor's side.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <vector>

#include "runtime/tensor_queue.hpp"

namespace ferry::supervisor {

struct ResultBatch {
  std::vector<Tensors> messages;  // in the order they were sent
  // What ended the taking, after the messages before it (closed, the worker's death, a message
  // that could not be read); null when it ended because the queue was empty or `most` was taken.
  std::exception_ptr failed;
};

// Waits up to `timeout` for a message on `q`, then takes those queued behind it, `most` in all
// (at least 1). Never throws: a failure comes back in `failed`, after what was taken before it.
ResultBatch take_results(TensorQueue& q, std::size_t most,
                         std::chrono::milliseconds timeout = kForever) noexcept;

}  // namespace ferry::supervisor
