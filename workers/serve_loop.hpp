// The loop at the heart of a worker process: receive a message, apply a function, send the
// result back, until the inbound queue is closed or its senders are gone.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>

#include "runtime/tensor_queue.hpp"

namespace ferry {

using MessageFn = std::function<Tensors(const Tensors&)>;

// Serves messages from `in` to `out` through `fn`. Returns the number of messages handled when
// `in` is closed and drained or every sender has exited (after waiting, up to 5 s, for the
// replies still queued to be taken: see flush()); any other ferry::Error propagates, as
// does an exception thrown by `fn`.
std::size_t serve(TensorQueue& in, TensorQueue& out, const MessageFn& fn);

}  // namespace ferry
