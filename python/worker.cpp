#include "python/worker.hpp"

#include <pybind11/stl.h>

#include <stdexcept>

#include "python/message.hpp"
#include "python/pool.hpp"  // kSharedPrefix, kPythonTask
#include "workers/task_registry.hpp"
#include "workers/worker_loop.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// The prelude of the task this worker runs now, for task_prelude(); tasks run one at a time.
const Tensors* g_prelude = nullptr;

}  // namespace

void bind_worker(py::module_& m) {
  m.def(
      "task_prelude",
      []() -> py::object {
        if (!g_prelude) return py::none();
        return unpack_object(*g_prelude);
      },
      "in a pool worker's task: its prelude as TensorQueue.get gives a message (the task's "
      "function, pickled), or None");
  m.def(
      "serve_worker",
      [](int control_fd, py::function start, py::function handler) {
        // Live as long as the process: the registry keeps them past the interpreter.
        auto* begin = new py::function(std::move(start));
        auto* fn = new py::function(std::move(handler));
        auto* config = new py::dict();  // the Hello's, the same for every task: made once
        auto* shared = new py::list();  // the storages of the pool's shared objects, in order
        set_worker_start([begin, config, shared](TaskContext& ctx) {
          py::gil_scoped_acquire gil;
          for (const auto& [k, v] : *ctx.config) (*config)[py::str(k)] = v;
          for (const auto& [k, t] : *ctx.shared) {
            if (k.rfind(kSharedPrefix, 0) == 0) shared->append(t);
          }
          (*begin)(ctx.worker_id, ctx.device.str(), *config, *shared);
        });
        register_task(kPythonTask, [fn](TaskContext& ctx, Tensors in) -> Tensors {
          py::gil_scoped_acquire gil;
          // (object,) when plain (decoded here), else (payload, bases), and the id of the task's
          // prelude (0: none), which task_prelude() gives the first time; the handler answers
          // (True, payload, bases), or (False, the error with the worker's traceback, the
          // pickled exception or b"")
          g_prelude = ctx.prelude;
          struct Clear {
            ~Clear() { g_prelude = nullptr; }
          } clear;
          py::tuple r = (*fn)(unpack_object(std::move(in)), ctx.prelude_id);
          if (!r[0].cast<bool>()) {
            throw TaskFailure(r[1].cast<std::string>(), r[2].cast<std::string>());
          }
          return pack_message(r[1].cast<py::bytes>(), r[2].cast<std::vector<at::Tensor>>());
        });
        py::gil_scoped_release unlocked;
        return run_worker(control_fd);
      },
      py::arg("control_fd"), py::arg("start"), py::arg("handler"),
      "serves a supervisor's tasks on the inherited control socket, start(worker_id, device, "
      "config, shared) once first, handler(message, prelude_id) per task, with the message as "
      "TensorQueue.get gives it; returns the exit code");
}

}  // namespace ferry::python
