// Storages and views for the Python package (internal to the extension).
//
// A Python message carries each storage once, as a uint8 "base" tensor over all of it, and every
// tensor as a view (dtype, offset, sizes, strides) of its base, so views of one storage arrive
// as views of one storage. On the receiving side adopt() maps a base to the one storage this
// process already holds for the same memory, so the same storage also comes back across
// messages, as torch.multiprocessing's storage cache does.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <cstddef>
#include <cstdint>
#include <tuple>

namespace ferry::python {

// (device type, device index, address, bytes): no two live storages of one process share it,
// except views of the same received block, which is what adopt() merges.
using StorageKey = std::tuple<int, int, std::uintptr_t, std::size_t>;
StorageKey key_of(const c10::Storage& s);

// The uint8 tensor over the whole storage of `t`. Throws Error(invalid_argument) for a tensor
// with no storage.
at::Tensor storage_base(const at::Tensor& t);

// The base this process already holds for the same memory as `base`, or `base` itself (noted).
at::Tensor adopt(const at::Tensor& base);

// Whether ferry carries `t` by its storage (strided, unquantized, CPU or CUDA, at most 12
// dimensions); any other tensor is pickled by value.
bool carried_by_storage(const at::Tensor& t);

// `t` ready to travel by its storage: a lazy conjugate or negative view resolved (those bits are
// not in the storage), a CPU storage moved into the arena in place.
at::Tensor prepared_for_storage(const at::Tensor& t);

void bind_storages(pybind11::module_& m);

}  // namespace ferry::python
