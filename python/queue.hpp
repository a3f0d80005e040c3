// ferry._C.TensorQueue (internal to the extension).
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

void bind_queue(pybind11::module_& m);

}  // namespace ferry::python
