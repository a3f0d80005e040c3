// ferry._C: the extension behind `import ferry` (python/ferry/ is the package around it).
// Tensors cross between Python and C++ as the same at::Tensor; every blocking call releases the
// GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <optional>

#include "ipc/diag/shm_check.hpp"
#include "ipc/version.hpp"
#include "python/errors.hpp"
#include "python/fds.hpp"
#include "python/futex_words.hpp"
#include "python/hosts.hpp"
#include "python/message.hpp"
#include "python/plain_message.hpp"
#include "python/pool.hpp"
#include "python/queue.hpp"
#include "python/stats.hpp"
#include "python/storages.hpp"
#include "python/worker.hpp"
#include "runtime/fork_threads.hpp"
#include "runtime/shared_allocations.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/tensor_queue.hpp"

namespace py = pybind11;

namespace {

// ferry.shared_allocations(on) for `with`: the C++ scope is thread-local, as is the thread that
// runs the with-block.
struct Scope {
  bool on;
  std::optional<ferry::SharedAllocations> scope;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ferry's extension: zero-copy tensors between processes (use the ferry package)";
  m.attr("torch_version") = TORCH_VERSION;  // the LibTorch it was built against
  m.attr("version") = ferry::version();     // CMake's project() version: the one place it is set
  ferry::python::bind_errors(m);
  ferry::python::bind_storages(m);
  ferry::python::bind_plain_message(m);
  ferry::python::bind_queue(m);
  ferry::python::bind_pool(m);
  ferry::python::bind_hosts(m);
  ferry::python::bind_worker(m);
  ferry::python::bind_fds(m);
  ferry::python::bind_futex_words(m);

  m.def(
      "empty",
      [](std::vector<std::int64_t> sizes, const at::Tensor& like) {
        return ferry::empty_shared(sizes, at::TensorOptions().dtype(like.scalar_type()));
      },
      py::arg("sizes"), py::arg("like"), "an uninitialised tensor in this process's arena");
  m.def("share_", &ferry::share_, py::arg("t"), "moves t's storage into the arena in place");
  m.def("is_shared", &ferry::is_shared, py::arg("t"), "t's storage is a block of this arena");
  m.def("set_shared_allocations", &ferry::set_shared_allocations, py::arg("on"),
        "the process's setting: CPU tensors LibTorch allocates are born in the arena");
  m.def("shared_allocations_on", &ferry::shared_allocations,
        "whether this thread's allocations are born shared now");
  m.def("shared_allocation_threshold", &ferry::shared_allocation_threshold,
        "allocations below this many bytes stay with LibTorch's allocator");
  py::class_<Scope>(m, "SharedAllocations")
      .def(py::init([](bool on) {
             return new Scope{on, std::nullopt};
           }),
           py::arg("on") = true)
      .def("__enter__",
           [](Scope& s) -> Scope& {
             if (s.scope) {
               throw ferry::Error(ferry::Errc::invalid_argument,
                                  "ferry.shared_allocations() entered twice; make one per with");
             }
             s.scope.emplace(s.on);
             return s;
           })
      .def("__exit__", [](Scope& s, py::args) {
        s.scope.reset();
        return false;
      });
  m.def("after_fork_in_child", &ferry::after_fork_in_child,
        "in a forked child: LibTorch's intra-op threads to FERRY_FORK_THREADS (default 1)");
  m.def(
      "flush",
      [](std::optional<double> timeout) {
        const auto ms = ferry::python::to_timeout(timeout);
        py::gil_scoped_release unlocked;
        return ferry::flush(ms);
      },
      py::arg("timeout"),
      "waits until receivers took what this process sent; returns what is left");
  m.def(
      "flush_at_exit",
      [](std::optional<double> timeout) {
        const auto ms = ferry::python::to_timeout(timeout);
        py::gil_scoped_release unlocked;
        return ferry::flush_at_exit(ms);
      },
      py::arg("timeout"),
      "leaves what queued messages need in their queues' custody, then waits for what it could "
      "not leave there; returns what is left");
  m.def(
      "exit_linger", [] { return ferry::exit_linger().count() / 1000.0; },
      "FERRY_EXIT_LINGER_MS in seconds");
  m.def("transport_stats", &ferry::python::transport_stats_dict);
  m.def("arena_stats", &ferry::python::arena_stats_dict);
  m.def(
      "check_shm",
      [](std::uint64_t need_bytes, unsigned workers, std::string dir, bool cuda) {
        ferry::ShmCheckOptions o;
        o.need_bytes = need_bytes;
        o.workers = workers;
        o.dir = std::move(dir);
        o.cuda = cuda;
        ferry::ShmReport r;
        {
          py::gil_scoped_release unlocked;
          r = ferry::check_shm(o);
        }
        return ferry::to_json(r);
      },
      py::arg("need_bytes"), py::arg("workers"), py::arg("dir"), py::arg("cuda"),
      "ferry-shm check's report, as JSON");
}
