// File descriptors handed to a pool's workers by name (internal to the extension).
//
// multiprocessing passes an object's fds (a queue's, a Connection's, a Value's memory) to a
// child it starts; a pool's worker is already running, and may unpickle one message many times
// (a retried task, every worker's initializer). ferry/_handles.py therefore publishes each fd in
// this process's segment server (ipc/segment_server.hpp), where a worker of the same user fetches
// it by (pid, token, seq) as often as it needs, until the message's task has ended.
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

void bind_fds(pybind11::module_& m);

}  // namespace ferry::python
