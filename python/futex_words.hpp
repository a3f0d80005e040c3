// Futex wait and wake on a 32-bit word of shared memory that Python owns (internal to the
// extension). ferry.Event keeps its flag in such a word and takes no lock, so a process
// SIGKILLed in the middle of set(), is_set() or wait() leaves nothing held (ferry/_event.py).
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

void bind_futex_words(pybind11::module_& m);

}  // namespace ferry::python
