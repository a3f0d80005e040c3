// ferry._C.Hub and ferry._C.join_head (internal to the extension): ferry.Pool spread over several
// hosts (ferry/_pool.py's listen=, ferry/_host.py; docs/multi-host.md). Bound only where ferry's
// hosts are built (c10d and Gloo found); ferry._C.has_hosts says which.
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

void bind_hosts(pybind11::module_& m);

}  // namespace ferry::python
