// ferry._C.Pool (internal to the extension): ferry::Pool with Python worker processes, whose
// one task, "python", runs the pickled call each message carries (ferry/_pool.py, _worker.py).
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

void bind_pool(pybind11::module_& m);

}  // namespace ferry::python
