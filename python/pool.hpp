// ferry._C.Pool and ferry._C.PoolOptions (internal to the extension): ferry::Pool with Python
// worker processes, whose one task, "python", runs the pickled call each message carries
// (ferry/_pool.py, _worker.py).
#pragma once

#include <pybind11/pybind11.h>

#include "runtime/pool.hpp"

namespace ferry::python {

// PoolOptions::shared names the storages of the pool's pickled `shared` objects by this prefix
// and their index, zero-padded so that the map keeps them in order.
inline constexpr const char* kSharedPrefix = "python.shared.";

// The task every Python worker registers (python/worker.cpp).
inline constexpr const char* kPythonTask = "python";

// What a pool of Python workers fixes in its options, whatever the caller set: spawned workers
// (a Python process forked from a C++ thread cannot run Python), its one task, and Cancel for
// the destructor (a Python caller's tasks end with the pool object).
PoolOptions python_pool_options(PoolOptions o);

void bind_pool(pybind11::module_& m);

}  // namespace ferry::python
