// Plain messages (internal to the extension): an object made only of tensors and plain data,
// encoded and decoded in C++ without Python's pickler.
//
// "Plain" is None, bool, int (64-bit), float, complex, str, bytes, tensors (exact torch.Tensor,
// strided, on the CPU or a CUDA device, not requiring grad), and tuples, lists and dicts of
// them (exact types, at most kMaxDepth deep, each container once). Anything else, or a message
// with more storages than the queue has room for, is not plain, and the caller pickles it as
// before (ferry/_pickle.py), so the two ways give the same object on arrival: tuples stay
// tuples, dict order is kept, the same tensor twice arrives as one tensor, and views of one
// storage stay views of one storage.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ferry::python {

// The payload's first byte: never a pickle's (protocol 2 and later begin with 0x80, PROTO).
constexpr std::uint8_t kPlainMagic = 0xF5;
// Containers nested deeper than this are pickled: the decoder recurses once per level.
constexpr int kMaxDepth = 32;

struct PlainMessage {
  std::string payload;            // the encoded object; tensors refer to bases by index
  std::vector<at::Tensor> bases;  // one uint8 tensor over each storage, in first-use order
};

// `obj` as a plain message, or nothing when it is not plain or needs more than `max_bases`
// storages. Moves CPU storages into the arena in place, as sending them by pickle does. Needs
// the GIL; throws Error when a storage cannot be moved (shared memory full).
std::optional<PlainMessage> encode_plain(pybind11::handle obj, std::size_t max_bases);

// Whether `payload` was made by encode_plain().
bool is_plain(const char* payload, std::size_t size) noexcept;

// The object encode_plain() encoded, its tensors views of `bases` (adopted, so one storage
// received twice is one storage). Needs the GIL; throws Error(bad_record) naming what is wrong
// with a payload this build did not make.
pybind11::object decode_plain(const char* payload, std::size_t size,
                              const std::vector<at::Tensor>& bases);

// _C.encode_plain(obj, max_bases) -> (payload, bases) or None; _C.decode_plain(payload, bases).
void bind_plain_message(pybind11::module_& m);

}  // namespace ferry::python
