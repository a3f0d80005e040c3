#include "python/errors.hpp"

#include <string>

#include "ipc/error.hpp"
#include "runtime/task_error.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

struct Classes {
  PyObject* error = nullptr;          // ferry.Error (RuntimeError)
  PyObject* invalid = nullptr;        // ferry.InvalidArgument (Error, ValueError)
  PyObject* timeout = nullptr;        // ferry.Timeout (Error, TimeoutError)
  PyObject* closed = nullptr;         // ferry.ShutDown (Error[, queue.ShutDown])
  PyObject* peer_dead = nullptr;      // ferry.PeerDead (Error, queue.Empty)
  PyObject* shm_exhausted = nullptr;  // ferry.ShmExhausted (Error, MemoryError)
  PyObject* task = nullptr;           // ferry.TaskError (Error)
  PyObject* worker_lost = nullptr;    // ferry.WorkerLost (TaskError)
};
Classes g;

PyObject* make_class(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string qualified = std::string("ferry.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (!cls) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // the module holds a reference for as long as it lives
  return cls;
}

PyObject* class_for(Errc code) {
  switch (code) {
    case Errc::invalid_argument:
      return g.invalid;
    case Errc::timeout:
      return g.timeout;
    case Errc::closed:
      return g.closed;
    case Errc::peer_dead:
      return g.peer_dead;
    case Errc::shm_exhausted:
      return g.shm_exhausted;
    case Errc::task_failed:
      return g.task;
    case Errc::worker_lost:
      return g.worker_lost;
    default:
      return g.error;
  }
}

// Raises `cls(message)` with the attributes in `attrs` set on the instance.
void raise(PyObject* cls, const std::string& message, const py::dict& attrs) {
  py::object instance;
  try {
    instance = py::reinterpret_borrow<py::object>(cls)(py::str(message));
  } catch (py::error_already_set& e) {
    e.restore();  // the class itself failed: that error is the one to see
    return;
  }
  for (auto item : attrs) py::setattr(instance, item.first, item.second);
  PyErr_SetObject(cls, instance.ptr());
}

}  // namespace

void bind_errors(py::module_& m) {
  m.def(
      "describe_task_error",
      [](const std::string& code, const std::string& task, std::size_t index, int worker,
         const std::string& device, pid_t pid, const std::string& message) {
        return describe_task_error(code == "worker_lost" ? Errc::worker_lost
                                   : code == "closed"    ? Errc::closed
                                                         : Errc::task_failed,
                                   task, index, worker, device, pid, message);
      },
      py::arg("code"), py::arg("task"), py::arg("index"), py::arg("worker"), py::arg("device"),
      py::arg("pid"), py::arg("message"),
      "a TaskError's text for these fields, as ferry says it (the Python pool names the "
      "function this way)");
  py::object runtime_error = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  g.error = make_class(m, "Error",
                       "A ferry failure; `code` names it (ferry::Errc, e.g. 'shm_exhausted').",
                       py::make_tuple(runtime_error));
  py::object error = py::reinterpret_borrow<py::object>(g.error);
  g.invalid =
      make_class(m, "InvalidArgument", "A value passed to ferry is out of range.",
                 py::make_tuple(error, py::reinterpret_borrow<py::object>(PyExc_ValueError)));
  g.timeout =
      make_class(m, "Timeout", "A wait ran out before its condition held.",
                 py::make_tuple(error, py::reinterpret_borrow<py::object>(PyExc_TimeoutError)));
  // Python 3.13's queue.ShutDown is the same event (a queue shut down for every user); where it
  // exists, ferry.ShutDown is one, so either name catches it.
  py::tuple shutdown_bases = py::make_tuple(error);
  py::module_ queue = py::module_::import("queue");
  if (py::hasattr(queue, "ShutDown"))
    shutdown_bases = py::make_tuple(error, queue.attr("ShutDown"));
  g.closed = make_class(m, "ShutDown", "The queue or pool was shut down.", shutdown_bases);
  // A get that ends because every producer exited is, to code written for multiprocessing, a
  // get that found nothing: `except queue.Empty` catches it too.
  g.peer_dead = make_class(m, "PeerDead", "Every process on the other side of a queue has exited.",
                           py::make_tuple(error, queue.attr("Empty")));
  g.shm_exhausted = make_class(
      m, "ShmExhausted",
      "The shared-memory filesystem has no room; the message names the sizes and the remedy.",
      py::make_tuple(error, py::reinterpret_borrow<py::object>(PyExc_MemoryError)));
  g.task =
      make_class(m, "TaskError", "A pool task failed; the message carries the worker's traceback.",
                 py::make_tuple(error));
  g.worker_lost =
      make_class(m, "WorkerLost", "A pool task's worker died or timed out on every attempt.",
                 py::make_tuple(py::reinterpret_borrow<py::object>(g.task)));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TaskError& e) {
      py::dict attrs;
      attrs["code"] = errc_name(e.code());
      attrs["task"] = e.task();
      attrs["index"] = e.index();
      attrs["worker"] = e.worker();
      attrs["device"] = e.device();
      attrs["pid"] = e.pid();
      attrs["message"] = e.message();
      attrs["detail"] = py::bytes(e.detail());
      raise(class_for(e.code()), e.what(), attrs);
    } catch (const Error& e) {
      py::dict attrs;
      attrs["code"] = errc_name(e.code());
      raise(class_for(e.code()), e.what(), attrs);
    }
  });
}

}  // namespace ferry::python
