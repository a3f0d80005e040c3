// ferry._C.serve_worker (internal to the extension): a Python process as a pool worker. The
// handshake, the task loop, results and crashes are the C++ worker's (workers/worker_loop.hpp);
// its one task, "python", hands each message to a Python function (ferry/_worker.py).
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

void bind_worker(pybind11::module_& m);

}  // namespace ferry::python
