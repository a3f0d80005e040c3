#include "python/stats.hpp"

#include "ipc/cuda/sync_policy.hpp"
#include "ipc/stats.hpp"
#include "runtime/shared_tensor.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace ferry::python {

py::dict transport_stats_dict() {
  const TransportStats s = transport_stats();
  py::dict reasons;
  for (int r = 0; r < static_cast<int>(CopyReason::count_); ++r) {
    reasons[copy_reason_name(static_cast<CopyReason>(r))] = s.copies_by_reason[r];
  }
  py::dict fallbacks;
  for (int f = 0; f < kSyncFallbacks; ++f) {
    fallbacks[cuda::sync_fallback_name(static_cast<cuda::SyncFallback>(f))] =
        s.cuda_sync_fallbacks[f];
  }
  return py::dict(
      "messages_sent"_a = s.messages_sent, "messages_received"_a = s.messages_received,
      "tensors_zero_copy"_a = s.tensors_zero_copy, "bytes_zero_copy"_a = s.bytes_zero_copy,
      "tensors_copied"_a = s.tensors_copied, "bytes_copied"_a = s.bytes_copied,
      "tensors_in_record"_a = s.tensors_in_record, "bytes_in_record"_a = s.bytes_in_record,
      "tensors_received"_a = s.tensors_received, "bytes_received"_a = s.bytes_received,
      "tensors_copied_on_receipt"_a = s.tensors_copied_on_receipt,
      "bytes_copied_on_receipt"_a = s.bytes_copied_on_receipt,
      "storages_relocated"_a = s.storages_relocated, "bytes_relocated"_a = s.bytes_relocated,
      "shared_allocations"_a = s.shared_allocations,
      "bytes_shared_allocations"_a = s.bytes_shared_allocations,
      "shared_allocation_fallbacks"_a = s.shared_allocation_fallbacks,
      "bytes_shared_allocation_fallbacks"_a = s.bytes_shared_allocation_fallbacks,
      "segments_created"_a = s.segments_created, "segments_mapped"_a = s.segments_mapped,
      "fds_fetched"_a = s.fds_fetched, "leases_reclaimed"_a = s.leases_reclaimed,
      "segments_entrusted"_a = s.segments_entrusted, "custody_refusals"_a = s.custody_refusals,
      "segments_from_custody"_a = s.segments_from_custody,
      "leases_abandoned"_a = s.leases_abandoned, "bytes_returned"_a = s.bytes_returned,
      "cuda_tensors_zero_copy"_a = s.cuda_tensors_zero_copy,
      "cuda_bytes_zero_copy"_a = s.cuda_bytes_zero_copy,
      "cuda_handles_exported"_a = s.cuda_handles_exported,
      "cuda_handles_opened"_a = s.cuda_handles_opened,
      "cuda_handle_cache_hits"_a = s.cuda_handle_cache_hits,
      "cuda_handles_closed"_a = s.cuda_handles_closed,
      "cuda_events_recorded"_a = s.cuda_events_recorded,
      "cuda_event_pool_syncs"_a = s.cuda_event_pool_syncs,
      "cuda_peer_deaths"_a = s.cuda_peer_deaths, "cuda_idle_sends"_a = s.cuda_idle_sends,
      "cuda_memop_writes"_a = s.cuda_memop_writes, "cuda_sync_fallbacks"_a = fallbacks,
      "cuda_memop_waits"_a = s.cuda_memop_waits,
      "cuda_flag_buffers_opened"_a = s.cuda_flag_buffers_opened,
      "cuda_waits_released"_a = s.cuda_waits_released, "cuda_releases_now"_a = s.cuda_releases_now,
      "cuda_releases_after_event"_a = s.cuda_releases_after_event,
      "cuda_releases_after_device"_a = s.cuda_releases_after_device,
      "copies_by_reason"_a = reasons);
}

py::dict arena_stats_dict() {
  const ArenaStats a = arena_stats();
  return py::dict("segments"_a = a.segments, "bytes_reserved"_a = a.bytes_reserved,
                  "bytes_in_use"_a = a.bytes_in_use, "blocks_in_use"_a = a.blocks_in_use,
                  "leases_outstanding"_a = a.leases_outstanding,
                  "bytes_returned"_a = a.bytes_returned);
}

py::dict pool_stats_dict(const PoolStats& s) {
  py::list workers;
  for (const WorkerStats& w : s.workers) {
    workers.append(py::dict(
        "id"_a = w.id, "device"_a = w.device, "pid"_a = w.pid, "tasks_done"_a = w.tasks_done,
        "tasks_failed"_a = w.tasks_failed, "tasks_lost"_a = w.tasks_lost, "restarts"_a = w.restarts,
        "replaced"_a = w.replaced, "preludes_sent"_a = w.preludes_sent, "timeouts"_a = w.timeouts,
        "last_exit"_a = w.last_exit, "given_up"_a = w.given_up, "limit"_a = w.limit,
        "remote"_a = w.remote, "tensors_zero_copy"_a = w.tensors_zero_copy,
        "bytes_zero_copy"_a = w.bytes_zero_copy, "tensors_copied"_a = w.tensors_copied,
        "bytes_copied"_a = w.bytes_copied));
  }
  return py::dict("workers"_a = workers, "submitted"_a = s.submitted, "completed"_a = s.completed,
                  "failed"_a = s.failed, "retried"_a = s.retried,
                  "input_tensors_zero_copy"_a = s.input_tensors_zero_copy,
                  "input_bytes_zero_copy"_a = s.input_bytes_zero_copy,
                  "input_tensors_copied"_a = s.input_tensors_copied,
                  "input_bytes_copied"_a = s.input_bytes_copied,
                  "results_taken_by_callers"_a = s.results_taken_by_callers);
}

}  // namespace ferry::python
