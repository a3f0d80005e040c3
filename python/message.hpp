// A Python message as ferry tensors (internal to the extension): the pickled object's bytes in
// one uint8 tensor of this process's arena (so it travels zero-copy), then the storages of the
// tensors the pickle refers to, one "base" tensor each (ferry/_pickle.py decides which).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "python/durations.hpp"
#include "runtime/tensor_queue.hpp"

namespace ferry::python {

// [payload, bases...]. Needs the GIL (reads `payload`).
Tensors pack_message(const pybind11::bytes& payload, const std::vector<at::Tensor>& bases);
Tensors pack_message(const char* payload, std::size_t size, const std::vector<at::Tensor>& bases);
// (payload bytes, [bases...]) from a message made by pack_message. Needs the GIL.
pybind11::tuple unpack_message(Tensors message);
// The object itself as a 1-tuple when the message is plain (python/plain_message.hpp), decoded
// here; else what unpack_message() returns, for ferry/_pickle.py to unpickle. Needs the GIL.
pybind11::tuple unpack_object(Tensors message);

// Packs (payload, bases) under the GIL, then returns send(message, timeout) with the GIL
// released, so that other Python threads run while the send blocks.
template <class Send>
auto send_message(const pybind11::bytes& payload, const std::vector<at::Tensor>& bases,
                  std::optional<double> timeout, Send&& send) {
  Tensors message = pack_message(payload, bases);
  const auto ms = to_timeout(timeout);
  pybind11::gil_scoped_release unlocked;
  return send(std::move(message), ms);
}

}  // namespace ferry::python
