// ferry._C.Pool (internal to the extension): ferry::Pool with Python worker processes, whose
// one task, "python", runs the pickled call each message carries (ferry/_pool.py, _worker.py).
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>
#include <vector>

#include "runtime/pool.hpp"

namespace ferry::python {

// PoolOptions::shared names the storages of the pool's pickled `shared` objects by this prefix
// and their index, zero-padded so that the map keeps them in order.
inline constexpr const char* kSharedPrefix = "python.shared.";

// The options of a pool of Python workers (spawned: `executable` `args`, e.g. python -c BOOT),
// whose one task runs the pickled calls; times in seconds (0: no limit).
PoolOptions python_pool_options(std::vector<std::string> devices, std::string executable,
                                std::vector<std::string> args,
                                std::map<std::string, std::string> config, int max_retries,
                                int max_inflight_per_worker, double task_timeout,
                                double start_timeout, int threads_per_worker);

void bind_pool(pybind11::module_& m);

}  // namespace ferry::python
