#include "python/pool.hpp"

#include <pybind11/stl.h>

#include <future>
#include <memory>

#include "python/message.hpp"
#include "python/stats.hpp"
#include "runtime/pool.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

constexpr const char* kTask = "python";  // registered by serve_worker() in every Python worker

// The name of the pool's i-th shared storage: in order when sorted, as PoolOptions::shared is.
std::string shared_name(std::size_t i) {
  std::string digits = std::to_string(i);
  return std::string(kSharedPrefix) +
         std::string(6 - std::min<std::size_t>(6, digits.size()), '0') + digits;
}

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000.0));
}

// A submitted task's outcome; get() may be called more than once.
struct Future {
  std::shared_future<Tensors> f;
  bool wait(std::optional<double> timeout) const {
    const auto ms = to_timeout(timeout);
    py::gil_scoped_release unlocked;
    if (ms.count() < 0) {
      f.wait();
      return true;
    }
    return f.wait_for(ms) == std::future_status::ready;
  }
  py::tuple get() const {
    {
      py::gil_scoped_release unlocked;
      f.wait();
    }
    return unpack_message(f.get());  // rethrows the task's TaskError
  }
};

// A Python callable that a pool thread may be the last to let go of: dropped under the GIL.
struct HeldFunction {
  py::function fn;
  explicit HeldFunction(py::function f) : fn(std::move(f)) {}
  ~HeldFunction() {
    py::gil_scoped_acquire gil;
    fn = py::function();
  }
};

}  // namespace

PoolOptions python_pool_options(std::vector<std::string> devices, std::string executable,
                                std::vector<std::string> args,
                                std::map<std::string, std::string> config, int max_retries,
                                int max_inflight_per_worker, double task_timeout,
                                double start_timeout, int threads_per_worker) {
  PoolOptions o;
  o.devices = std::move(devices);
  o.start = Start::Spawn;  // a Python process forked from a C++ thread cannot run Python
  o.worker_executable = std::move(executable);
  o.worker_args = std::move(args);
  o.config = std::move(config);
  o.require_tasks = {kTask};
  o.max_retries = max_retries;
  o.max_inflight_per_worker = max_inflight_per_worker;
  o.task_timeout = seconds_to_ms(task_timeout);
  o.start_timeout = seconds_to_ms(start_timeout);
  o.threads_per_worker = threads_per_worker;
  o.shutdown = Shutdown::Cancel;
  return o;
}

void bind_pool(py::module_& m) {
  // Workers elsewhere (ferry._C.Hub, where several hosts are built): only passed to Pool.
  py::class_<RemoteWorkers, std::shared_ptr<RemoteWorkers>>(m, "RemoteWorkers");

  py::class_<Future>(m, "Future")
      .def("wait", &Future::wait, py::arg("timeout") = py::none(),
           "True once the task has ended (within `timeout` seconds)")
      .def("done",
           [](const Future& f) {
             return f.f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
           })
      .def("get", &Future::get, "(payload, bases) of the result, or raises the task's error");

  py::class_<Pool::Results>(m, "Results")
      .def(
          "next",
          [](Pool::Results& r) -> py::object {
            std::optional<Pool::Result> got;
            {
              py::gil_scoped_release unlocked;
              got = r.next();
            }
            if (!got) return py::none();
            const std::size_t index = got->index;
            return py::make_tuple(index, unpack_message(got->get()));
          },
          "(index, (payload, bases)) of the next task to finish, None after the last; a failed "
          "task raises its TaskError (whose .index names it)");

  py::class_<Pool>(m, "Pool")
      .def(py::init([](std::vector<std::string> devices, std::string executable,
                       std::vector<std::string> args, std::map<std::string, std::string> config,
                       int max_retries, int max_inflight_per_worker, double task_timeout,
                       double start_timeout, int threads_per_worker,
                       const std::vector<at::Tensor>& shared,
                       std::shared_ptr<RemoteWorkers> remote) {
             PoolOptions o =
                 python_pool_options(std::move(devices), std::move(executable), std::move(args),
                                     std::move(config), max_retries, max_inflight_per_worker,
                                     task_timeout, start_timeout, threads_per_worker);
             for (std::size_t i = 0; i < shared.size(); ++i)
               o.shared.emplace(shared_name(i), shared[i]);
             o.remote = std::move(remote);
             py::gil_scoped_release unlocked;
             return std::make_unique<Pool>(std::move(o));
           }),
           py::arg("devices"), py::arg("executable"), py::arg("args"), py::arg("config"),
           py::arg("max_retries"), py::arg("max_inflight_per_worker"), py::arg("task_timeout"),
           py::arg("start_timeout"), py::arg("threads_per_worker"), py::arg("shared"),
           py::arg("remote") = nullptr)
      .def(
          "submit",
          [](Pool& p, const py::bytes& payload, const std::vector<at::Tensor>& bases,
             std::optional<double> timeout) {
            return send_message(payload, bases, timeout, [&](Tensors message, auto ms) {
              return Future{p.submit(kTask, std::move(message), ms).share()};
            });
          },
          py::arg("payload"), py::arg("bases"), py::arg("timeout") = py::none())
      .def(
          "imap_unordered",
          [](Pool& p, std::size_t count, py::function make) {
            auto held = std::make_shared<HeldFunction>(std::move(make));
            auto results = p.imap_unordered(kTask, count, [held](std::size_t i) {
              py::gil_scoped_acquire gil;
              py::tuple m = held->fn(i);
              return pack_message(m[0].cast<py::bytes>(), m[1].cast<std::vector<at::Tensor>>());
            });
            return results;
          },
          py::arg("count"), py::arg("make"),
          "results of `count` tasks as they finish; make(i) gives input i as (payload, bases)")
      .def(
          "close",
          [](Pool& p, bool drain) {
            py::gil_scoped_release unlocked;
            p.close(drain ? Shutdown::Drain : Shutdown::Cancel);
          },
          py::arg("drain"))
      .def("size", &Pool::size)
      .def("capacity", &Pool::capacity)
      .def("worker_pids", &Pool::worker_pids)
      .def("stats", [](const Pool& p) { return pool_stats_dict(p.stats()); });
}

}  // namespace ferry::python
