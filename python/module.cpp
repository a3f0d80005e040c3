// ferry._C: the extension behind `import ferry` (python/ferry/ is the package around it).
// Tensors cross between Python and C++ as the same at::Tensor; every blocking call releases the
// GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include "ipc/diag/shm_check.hpp"
#include "ipc/stats.hpp"
#include "python/errors.hpp"
#include "python/hosts.hpp"
#include "python/message.hpp"
#include "python/pool.hpp"
#include "python/queue.hpp"
#include "python/storages.hpp"
#include "python/worker.hpp"
#include "runtime/fork_threads.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/tensor_queue.hpp"

namespace py = pybind11;

namespace {

py::dict transport_stats_dict() {
  const ferry::TransportStats s = ferry::transport_stats();
  py::dict d;
#define FERRY_STAT(name) d[#name] = s.name
  FERRY_STAT(messages_sent);
  FERRY_STAT(messages_received);
  FERRY_STAT(tensors_zero_copy);
  FERRY_STAT(bytes_zero_copy);
  FERRY_STAT(tensors_copied);
  FERRY_STAT(bytes_copied);
  FERRY_STAT(tensors_received);
  FERRY_STAT(bytes_received);
  FERRY_STAT(tensors_copied_on_receipt);
  FERRY_STAT(bytes_copied_on_receipt);
  FERRY_STAT(storages_relocated);
  FERRY_STAT(bytes_relocated);
  FERRY_STAT(segments_created);
  FERRY_STAT(segments_mapped);
  FERRY_STAT(fds_fetched);
  FERRY_STAT(leases_reclaimed);
  FERRY_STAT(cuda_tensors_zero_copy);
  FERRY_STAT(cuda_bytes_zero_copy);
  FERRY_STAT(cuda_handles_exported);
  FERRY_STAT(cuda_handles_opened);
  FERRY_STAT(cuda_handle_cache_hits);
  FERRY_STAT(cuda_handles_closed);
  FERRY_STAT(cuda_events_recorded);
  FERRY_STAT(cuda_event_pool_syncs);
  FERRY_STAT(cuda_peer_deaths);
#undef FERRY_STAT
  py::dict reasons;
  for (int r = 0; r < static_cast<int>(ferry::CopyReason::count_); ++r) {
    reasons[ferry::copy_reason_name(static_cast<ferry::CopyReason>(r))] = s.copies_by_reason[r];
  }
  d["copies_by_reason"] = reasons;
  return d;
}

py::dict arena_stats_dict() {
  const ferry::ArenaStats a = ferry::arena_stats();
  py::dict d;
  d["segments"] = a.segments;
  d["bytes_reserved"] = a.bytes_reserved;
  d["bytes_in_use"] = a.bytes_in_use;
  d["blocks_in_use"] = a.blocks_in_use;
  d["leases_outstanding"] = a.leases_outstanding;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ferry's extension: zero-copy tensors between processes (use the ferry package)";
  m.attr("torch_version") = TORCH_VERSION;  // the LibTorch it was built against
  ferry::python::bind_errors(m);
  ferry::python::bind_storages(m);
  ferry::python::bind_queue(m);
  ferry::python::bind_pool(m);
  ferry::python::bind_hosts(m);
  ferry::python::bind_worker(m);

  m.def(
      "empty",
      [](std::vector<std::int64_t> sizes, const at::Tensor& like) {
        return ferry::empty_shared(sizes, at::TensorOptions().dtype(like.scalar_type()));
      },
      py::arg("sizes"), py::arg("like"), "an uninitialised tensor in this process's arena");
  m.def("share_", &ferry::share_, py::arg("t"), "moves t's storage into the arena in place");
  m.def("is_shared", &ferry::is_shared, py::arg("t"), "t's storage is a block of this arena");
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
  m.def("transport_stats", &transport_stats_dict);
  m.def("arena_stats", &arena_stats_dict);
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
