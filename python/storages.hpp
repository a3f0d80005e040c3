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

namespace ferry::python {

void bind_storages(pybind11::module_& m);

}  // namespace ferry::python
