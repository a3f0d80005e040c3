// ferry._C.Pool (internal to the extension): ferry::Pool with Python worker processes, whose
// one task, "python", runs the pickled call each message carries (ferry/_pool.py, _worker.py).
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

// PoolOptions::shared names the storages of the pool's pickled `shared` objects by this prefix
// and their index, zero-padded so that the map keeps them in order.
inline constexpr const char* kSharedPrefix = "python.shared.";

void bind_pool(pybind11::module_& m);

}  // namespace ferry::python
