#include "python/pool.hpp"

#include <pybind11/stl.h>

#include <future>
#include <memory>
#include <optional>
#include <string>

#include "python/durations.hpp"
#include "python/message.hpp"
#include "python/stats.hpp"
#include "runtime/option_table.hpp"
#include "runtime/worker_protocol.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// The name of the pool's i-th shared storage: in order when sorted, as PoolOptions::shared is.
std::string shared_name(std::size_t i) {
  std::string digits = std::to_string(i);
  return std::string(kSharedPrefix) +
         std::string(6 - std::min<std::size_t>(6, digits.size()), '0') + digits;
}

// A Python object that a pool thread may be the last to let go of: dropped under the GIL.
struct Held {
  py::object object;
  explicit Held(py::object o) : object(std::move(o)) {}
  ~Held() {
    if (!object || !Py_IsInitialized()) {
      object.release();  // an interpreter that has gone cannot take it back
      return;
    }
    py::gil_scoped_acquire gil;
    object = py::object();
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
};

// A submitted task's outcome; get() may be called more than once. What the task's message needs
// besides its bytes (`keep`: fds published for it) is held until the task has ended.
struct Future {
  std::shared_ptr<std::promise<Tensors>> promise = std::make_shared<std::promise<Tensors>>();
  std::shared_future<Tensors> f = promise->get_future().share();
  bool wait(std::optional<double> timeout) const {
    const auto ms = to_timeout(timeout);
    py::gil_scoped_release unlocked;
    if (ms.count() < 0) {
      f.wait();
      return true;
    }
    return f.wait_for(ms) == std::future_status::ready;
  }
  // The GIL is let go only for a result not in yet: a caller that waited (wait()) pays for one
  // release, not two.
  py::tuple get() const {
    if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      py::gil_scoped_release unlocked;
      f.wait();
    }
    return unpack_object(f.get());  // rethrows the task's TaskError
  }
};

// A call whose caller waits for it (Pool.call, for apply()): wait() and get() as Future's, and
// the waiting thread takes the result from the worker itself where it can (Pool::Call).
struct Called {
  std::shared_ptr<Pool::Call> call;
  std::optional<Tensors> out;
  std::exception_ptr error;
  bool wait(std::optional<double> timeout) {
    if (out || error) return true;
    const auto ms = to_timeout(timeout);
    std::optional<Tensors> got;
    std::exception_ptr failed;
    {
      py::gil_scoped_release unlocked;
      try {
        got = call->wait(ms);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    if (failed) {
      error = failed;
      return true;
    }
    if (!got) return false;
    out = std::move(got);
    return true;
  }
  py::tuple get() {
    wait(std::nullopt);
    if (error) std::rethrow_exception(error);
    return unpack_object(*out);
  }
};

double ms_to_seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

}  // namespace

PoolOptions python_pool_options(PoolOptions o) {
  o.start = Start::Spawn;
  o.require_tasks = {kPythonTask};
  o.shutdown = Shutdown::Cancel;
  return o;
}

// The option table (runtime/option_table.hpp) as Python sees it: one dict per option.
py::list option_table_list() {
  py::list out;
  for (const OptionSpec& o : option_table()) {
    py::list uses;
    if (o.uses & kUsePool) uses.append("pool");
    if (o.uses & kUseServe) uses.append("serve");
    if (o.uses & kUseHost) uses.append("host");
    if (o.uses & kUseRun) uses.append("run");
    static const char* const kinds[] = {"count", "seconds", "flag", "text", "list", "choice"};
    py::dict d;
    d["key"] = o.key;
    d["python"] = o.python;
    d["cli"] = o.cli;
    d["kind"] = kinds[static_cast<int>(o.kind)];
    d["least"] = o.least;
    d["most"] = o.most;
    d["default"] = o.fallback;
    d["help"] = o.help;
    d["uses"] = uses;
    d["choices"] = o.choices;
    out.append(d);
  }
  return out;
}

void bind_pool(py::module_& m) {
  m.def("option_table", &option_table_list,
        "the options of a pool and a host, declared once (docs/options.md)");
  m.def(
      "check_option",
      [](const std::string& key, std::int64_t value) { return checked(option(key), value); },
      py::arg("key"), py::arg("value"),
      "value, or InvalidArgument naming it and the option's range (milliseconds for times)");
  m.attr("MAX_TASK_TENSORS") = protocol::kMaxTensorsPerTask;
  m.attr("MAX_SHARED_TENSORS") = kMaxSharedTensors;

  // Workers elsewhere (ferry._C.Hub, where several hosts are built): only passed to Pool.
  py::class_<RemoteWorkers, std::shared_ptr<RemoteWorkers>>(m, "RemoteWorkers");

  py::class_<PoolOptions>(m, "PoolOptions",
                          "ferry::PoolOptions for a pool of Python workers, by keyword; each bad "
                          "value is refused naming it. Times are in seconds.")
      .def(py::init([](const py::kwargs& kwargs) {
             auto o = std::make_unique<PoolOptions>();
             py::object self = py::cast(o.get(), py::return_value_policy::reference);
             for (auto item : kwargs) {
               const std::string key = item.first.cast<std::string>();
               if (!py::hasattr(self, key.c_str()) || key.rfind('_', 0) == 0) {
                 throw Error(Errc::invalid_argument, "PoolOptions has no option '" + key + "'");
               }
               py::setattr(self, key.c_str(), item.second);
             }
             return o;
           }),
           "PoolOptions(devices=[...], executable=..., args=[...], config={...}, and the options "
           "of option_table() that ferry.Pool takes, by their keyword; times in seconds")
      .def_readwrite("devices", &PoolOptions::devices, "one worker per entry: 'cpu', 'cuda:N'")
      .def_readwrite("executable", &PoolOptions::worker_executable, "what a worker runs")
      .def_readwrite("args", &PoolOptions::worker_args, "its arguments before the control fd")
      .def_readwrite("config", &PoolOptions::config, "handed to every task")
      .def_property(
          "retries", [](const PoolOptions& o) { return o.max_retries; },
          [](PoolOptions& o, int v) {
            o.max_retries = static_cast<int>(checked(option("retries"), v));
          },
          option("retries").help)
      .def_property(
          "maxtasks_inflight", [](const PoolOptions& o) { return o.max_inflight_per_worker; },
          [](PoolOptions& o, int v) {
            o.max_inflight_per_worker = static_cast<int>(checked(option("maxtasks_inflight"), v));
          },
          option("maxtasks_inflight").help)
      .def_property(
          "max_tasks_per_worker", [](const PoolOptions& o) { return o.max_tasks_per_worker; },
          [](PoolOptions& o, std::int64_t v) {
            o.max_tasks_per_worker =
                static_cast<std::uint64_t>(checked(option("max_tasks_per_worker"), v));
          },
          option("max_tasks_per_worker").help)
      .def_property(
          "task_timeout",
          [](const PoolOptions& o) -> std::optional<double> {
            if (o.task_timeout.count() == 0) return std::nullopt;
            return ms_to_seconds(o.task_timeout);
          },
          [](PoolOptions& o, std::optional<double> s) {
            o.task_timeout =
                s ? seconds_to_ms("task_timeout", *s, Zero::refused) : std::chrono::milliseconds(0);
          },
          "seconds a task may run before its worker is killed; None: no limit")
      .def_property(
          "start_timeout", [](const PoolOptions& o) { return ms_to_seconds(o.start_timeout); },
          [](PoolOptions& o, double s) {
            o.start_timeout = seconds_to_ms("start_timeout", s, Zero::refused);
          },
          "seconds a worker has to start and answer its handshake")
      .def_property(
          "stop_timeout", [](const PoolOptions& o) { return ms_to_seconds(o.stop_timeout); },
          [](PoolOptions& o, double s) { o.stop_timeout = seconds_to_ms("stop_timeout", s); },
          "seconds a worker has to exit after close() before it is killed")
      .def_property(
          "threads_per_worker", [](const PoolOptions& o) { return o.threads_per_worker; },
          [](PoolOptions& o, int v) {
            o.threads_per_worker = static_cast<int>(checked(option("threads_per_worker"), v));
          },
          option("threads_per_worker").help)
      .def_readwrite("shared_allocations", &PoolOptions::shared_allocations,
                     "tensors the workers make are born in shared memory");

  py::class_<Prelude, std::shared_ptr<Prelude>>(m, "Prelude",
                                                "what many tasks share, sent once per worker: "
                                                "a pickled function")
      .def(py::init([](const py::bytes& payload) {
             return std::const_pointer_cast<Prelude>(make_prelude(pack_message(payload, {})));
           }),
           py::arg("payload"))
      .def_property_readonly("id", [](const Prelude& p) { return p.id; });

  py::class_<Future>(m, "Future")
      .def("wait", &Future::wait, py::arg("timeout") = py::none(),
           "True once the task has ended (within `timeout` seconds)")
      .def("done",
           [](const Future& f) {
             return f.f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
           })
      .def("get", &Future::get,
           "the result as (object,) when it was plain (decoded here), else (payload, bases); "
           "raises the task's error");

  py::class_<Called>(m, "Call")
      .def("wait", &Called::wait, py::arg("timeout") = py::none(),
           "True once the task has ended (within `timeout` seconds)")
      .def("get", &Called::get, "as Future.get");

  // Results come back in batches: every one that is in when the caller wakes, so a stream of
  // small tasks pays for one GIL release and one call per batch, not per result.
  py::class_<Pool::Results>(m, "Results")
      .def(
          "next",
          [](Pool::Results& r, std::optional<double> timeout, std::size_t most) -> py::object {
            if (most == 0) {
              throw Error(Errc::invalid_argument, "Results.next(most=0): give 1 or more");
            }
            const auto ms = to_timeout(timeout);
            std::optional<Pool::Result> got;
            std::vector<Pool::Result> more;
            try {
              r.top_up();  // inputs are made by Python: here, not with the GIL taken per input
              py::gil_scoped_release unlocked;
              got = r.next(ms);
              if (got && !got->error && most > 1) more = r.take_ready(most - 1);
            } catch (const Error& e) {
              if (e.code() != Errc::timeout) throw;
              return py::bool_(false);
            }
            if (!got) return py::none();
            py::list out;
            const std::size_t index = got->index;
            out.append(py::make_tuple(index, unpack_object(got->get())));  // may raise TaskError
            for (Pool::Result& x : more) {
              out.append(py::make_tuple(x.index, unpack_object(std::move(x.outputs))));
            }
            return out;
          },
          py::arg("timeout") = py::none(), py::arg("most") = 64,
          "[(index, (object,) or (payload, bases)), ...]: the next task to finish and those "
          "finished after it, `most` in all, each as Future.get; None after the last, False when "
          "`timeout` passed first; a failed task raises its TaskError (whose .index names it), "
          "after every result before it");

  py::class_<Pool>(m, "Pool")
      .def(py::init([](const PoolOptions& options, const std::vector<at::Tensor>& shared,
                       std::shared_ptr<RemoteWorkers> remote) {
             PoolOptions o = python_pool_options(options);
             for (std::size_t i = 0; i < shared.size(); ++i)
               o.shared.emplace(shared_name(i), shared[i]);
             o.remote = std::move(remote);
             py::gil_scoped_release unlocked;
             return std::make_unique<Pool>(std::move(o));
           }),
           py::arg("options"), py::arg("shared") = std::vector<at::Tensor>{},
           py::arg("remote") = nullptr)
      .def(
          "submit",
          [](Pool& p, const py::bytes& payload, const std::vector<at::Tensor>& bases,
             py::object keep, std::optional<double> timeout, std::shared_ptr<Prelude> prelude) {
            Future out;
            // Nothing to hold, no Held: its end would take the GIL in the collector's thread,
            // which then waits for the caller's Python before it takes the next result.
            auto held = keep.is_none() ? nullptr : std::make_shared<Held>(std::move(keep));
            send_message(payload, bases, timeout, [&](Tensors message, auto ms) {
              p.submit(
                  kPythonTask, std::move(message),
                  [promise = out.promise, held](Pool::Result&& r) mutable {
                    if (r.error) {
                      promise->set_exception(r.error);
                    } else {
                      promise->set_value(std::move(r.outputs));
                    }
                    held.reset();  // what the message needed goes once the task has ended
                  },
                  ms, prelude);
            });
            return out;
          },
          py::arg("payload"), py::arg("bases"), py::arg("keep") = py::none(),
          py::arg("timeout") = py::none(), py::arg("prelude") = nullptr,
          "runs one pickled call; `keep` is held until the task has ended; `prelude` (a "
          "Prelude) goes to each worker once")
      .def(
          "call",
          [](Pool& p, const py::bytes& payload, const std::vector<at::Tensor>& bases,
             py::object keep, std::optional<double> timeout, std::shared_ptr<Prelude> prelude) {
            Called out;
            auto held = keep.is_none() ? nullptr : std::make_shared<Held>(std::move(keep));
            send_message(payload, bases, timeout, [&](Tensors message, auto ms) {
              out.call = std::make_shared<Pool::Call>(
                  p.call(kPythonTask, std::move(message), ms, prelude, std::move(held)));
            });
            return out;
          },
          py::arg("payload"), py::arg("bases"), py::arg("keep") = py::none(),
          py::arg("timeout") = py::none(), py::arg("prelude") = nullptr,
          "runs one pickled call, as submit, for a caller that waits for it: the waiting thread "
          "takes the result from the worker itself where no pool thread is needed")
      .def(
          "imap_unordered",
          [](Pool& p, py::function make, std::shared_ptr<Prelude> prelude) {
            auto fn = std::make_shared<Held>(std::move(make));
            return p.imap_unordered(
                kPythonTask,
                [fn](std::size_t i) -> std::optional<Tensors> {
                  py::gil_scoped_acquire gil;
                  py::object m = fn->object(i);
                  if (m.is_none()) return std::nullopt;
                  auto t = m.cast<py::tuple>();
                  return pack_message(t[0].cast<py::bytes>(), t[1].cast<std::vector<at::Tensor>>());
                },
                std::move(prelude));
          },
          py::arg("make"), py::arg("prelude") = nullptr,
          "results of tasks as they finish; make(i) gives input i as (payload, bases), or None "
          "where the inputs end; it is called as room frees up")
      .def(
          "close",
          [](Pool& p, const std::string& how) {
            Shutdown s = Shutdown::Cancel;
            if (how == "drain") {
              s = Shutdown::Drain;
            } else if (how == "kill") {
              s = Shutdown::Kill;
            } else if (how != "cancel") {
              throw Error(Errc::invalid_argument,
                          "close('" + how + "'): give 'drain', 'cancel' or 'kill'");
            }
            py::gil_scoped_release unlocked;
            p.close(s);
          },
          py::arg("how"),
          "'drain': finish every task, 'cancel': fail what is left, 'kill': that, and kill the "
          "workers at once; then stop them")
      .def("size", &Pool::size)
      .def("capacity", &Pool::capacity)
      .def("worker_pids", &Pool::worker_pids)
      .def("stats", [](const Pool& p) { return pool_stats_dict(p.stats()); });
}

}  // namespace ferry::python
