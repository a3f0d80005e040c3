#include "ipc/stats.hpp"

namespace ferry {

const char* copy_reason_name(CopyReason r) noexcept {
  switch (r) {
    case CopyReason::not_shared:
      return "not_shared";
    case CopyReason::received:
      return "received";
    case CopyReason::foreign_arena:
      return "foreign_arena";
    case CopyReason::detached:
      return "detached";
    case CopyReason::same_process:
      return "same_process";
    case CopyReason::not_exportable:
      return "not_exportable";
    case CopyReason::peer_cannot_open:
      return "peer_cannot_open";
    case CopyReason::cpu_receiver:
      return "cpu_receiver";
    case CopyReason::ledger_full:
      return "ledger_full";
    case CopyReason::empty:
      return "empty";
    case CopyReason::other_host:
      return "other_host";
    case CopyReason::count_:
      break;
  }
  return "unknown";
}

namespace detail {
StatCounters& counters() noexcept {
  static StatCounters c;
  return c;
}
}  // namespace detail

void TransferCounts::add(const SentTensor& t) noexcept {
  if (t.in_record) return;
  if (t.copied) {
    ++tensors_copied;
    bytes_copied += t.bytes;
    ++copies_by_reason[static_cast<int>(*t.copied)];
  } else {
    ++tensors_zero_copy;
    bytes_zero_copy += t.bytes;
  }
}

TransferCounts SendReport::counts(std::size_t from) const noexcept {
  TransferCounts c;
  for (std::size_t i = from; i < tensors.size(); ++i) c.add(tensors[i]);
  return c;
}

namespace detail {

void count_sent(const SentTensor& t) noexcept {
  auto& c = counters();
  if (t.in_record) {
    bump(c.tensors_in_record);
    bump(c.bytes_in_record, t.bytes);
    return;
  }
  if (t.copied) {
    bump(c.tensors_copied);
    bump(c.bytes_copied, t.bytes);
    bump(c.copies_by_reason[static_cast<int>(*t.copied)]);
    return;
  }
  bump(c.tensors_zero_copy);
  bump(c.bytes_zero_copy, t.bytes);
  if (t.cuda) {
    bump(c.cuda_tensors_zero_copy);
    bump(c.cuda_bytes_zero_copy, t.bytes);
  }
}

}  // namespace detail

TransportStats transport_stats() noexcept {
  auto& c = detail::counters();
  auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  TransportStats s;
  s.messages_sent = ld(c.messages_sent);
  s.messages_received = ld(c.messages_received);
  s.tensors_zero_copy = ld(c.tensors_zero_copy);
  s.bytes_zero_copy = ld(c.bytes_zero_copy);
  s.tensors_copied = ld(c.tensors_copied);
  s.bytes_copied = ld(c.bytes_copied);
  for (int i = 0; i < static_cast<int>(CopyReason::count_); ++i) {
    s.copies_by_reason[i] = ld(c.copies_by_reason[i]);
  }
  s.tensors_in_record = ld(c.tensors_in_record);
  s.bytes_in_record = ld(c.bytes_in_record);
  s.tensors_received = ld(c.tensors_received);
  s.bytes_received = ld(c.bytes_received);
  s.tensors_copied_on_receipt = ld(c.tensors_copied_on_receipt);
  s.bytes_copied_on_receipt = ld(c.bytes_copied_on_receipt);
  s.storages_relocated = ld(c.storages_relocated);
  s.bytes_relocated = ld(c.bytes_relocated);
  s.shared_allocations = ld(c.shared_allocations);
  s.bytes_shared_allocations = ld(c.bytes_shared_allocations);
  s.shared_allocation_fallbacks = ld(c.shared_allocation_fallbacks);
  s.bytes_shared_allocation_fallbacks = ld(c.bytes_shared_allocation_fallbacks);
  s.segments_created = ld(c.segments_created);
  s.segments_mapped = ld(c.segments_mapped);
  s.fds_fetched = ld(c.fds_fetched);
  s.leases_reclaimed = ld(c.leases_reclaimed);
  s.segments_entrusted = ld(c.segments_entrusted);
  s.custody_refusals = ld(c.custody_refusals);
  s.segments_from_custody = ld(c.segments_from_custody);
  s.leases_abandoned = ld(c.leases_abandoned);
  s.bytes_returned = ld(c.bytes_returned);
  s.cuda_tensors_zero_copy = ld(c.cuda_tensors_zero_copy);
  s.cuda_bytes_zero_copy = ld(c.cuda_bytes_zero_copy);
  s.cuda_handles_exported = ld(c.cuda_handles_exported);
  s.cuda_handles_opened = ld(c.cuda_handles_opened);
  s.cuda_handle_cache_hits = ld(c.cuda_handle_cache_hits);
  s.cuda_handles_closed = ld(c.cuda_handles_closed);
  s.cuda_stale_entries = ld(c.cuda_stale_entries);
  s.cuda_events_recorded = ld(c.cuda_events_recorded);
  s.cuda_event_pool_syncs = ld(c.cuda_event_pool_syncs);
  s.cuda_peer_deaths = ld(c.cuda_peer_deaths);
  s.cuda_idle_sends = ld(c.cuda_idle_sends);
  s.cuda_memop_writes = ld(c.cuda_memop_writes);
  for (int i = 0; i < kSyncFallbacks; ++i) s.cuda_sync_fallbacks[i] = ld(c.cuda_sync_fallbacks[i]);
  s.cuda_memop_waits = ld(c.cuda_memop_waits);
  s.cuda_flag_buffers_opened = ld(c.cuda_flag_buffers_opened);
  s.cuda_waits_released = ld(c.cuda_waits_released);
  s.cuda_releases_now = ld(c.cuda_releases_now);
  s.cuda_releases_after_event = ld(c.cuda_releases_after_event);
  s.cuda_releases_after_device = ld(c.cuda_releases_after_device);
  return s;
}

}  // namespace ferry
