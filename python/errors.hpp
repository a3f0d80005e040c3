// ferry::Error as Python exceptions (internal to the extension): one class per error code that a
// Python caller handles differently, all under ferry.Error, each with a `code` attribute.
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

// Creates ferry.Error and its subclasses in `m` and translates every ferry::Error (TaskError
// included) thrown through a binding into the matching one.
void bind_errors(pybind11::module_& m);

}  // namespace ferry::python
