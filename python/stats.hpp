// ferry's counters as the Python dicts that `ferry.transport_stats()`, `ferry.arena_stats()` and
// `Pool.stats()` return (internal to the extension): every counter under its C++ name.
#pragma once

#include <pybind11/pybind11.h>

#include "runtime/pool.hpp"

namespace ferry::python {

// ferry::transport_stats(), with copies_by_reason as {reason name: count}.
pybind11::dict transport_stats_dict();
// ferry::arena_stats() of this process.
pybind11::dict arena_stats_dict();
// A pool's stats, with "workers" a list of one dict per worker.
pybind11::dict pool_stats_dict(const PoolStats& s);

}  // namespace ferry::python
