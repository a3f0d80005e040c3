// Process-wide transport counters: what moved, and how much of it was zero-copy. Cheap relaxed
// atomics; read a consistent-enough snapshot with transport_stats().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace ferry {

// Why a tensor was copied on send instead of shared.
enum class CopyReason : std::uint8_t {
  not_shared,     // an ordinary tensor, not allocated with empty_shared()
  received,       // the tensor was itself received from a peer (forwarding copies)
  foreign_arena,  // its block belongs to another process's arena (inherited across fork)
  detached,       // the caller asked for a detached send
  // CUDA tensors (ipc/cuda/send_policy.hpp):
  same_process,      // the receiver is the sending process itself
  not_exportable,    // managed, stream-ordered pool, VMM or host memory, or a device without IPC
  peer_cannot_open,  // the receiver cannot open the block (other device, already open elsewhere)
  cpu_receiver,      // the receiver cannot use CUDA: the tensor arrives on the CPU
  ledger_full,       // every CUDA lease slot is in use: sent through the CPU transport
  empty,             // an empty CUDA tensor: no allocation to export, it crosses as a record
  // Between hosts (hosts/host_link.hpp):
  other_host,  // the receiver is on another machine: a CUDA tensor crosses as a CPU copy
  count_,
};
const char* copy_reason_name(CopyReason r) noexcept;

// Ways a CUDA send did not order its receiver as its mode asked (ipc/cuda/sync_policy.hpp's
// SyncFallback, in its order: capturing, no_memops, flag_slots_full, event_pool_full).
inline constexpr int kSyncFallbacks = 4;

struct TransportStats {
  std::uint64_t messages_sent = 0, messages_received = 0;
  // Tensors sent, CPU and CUDA: shared in place, or copied (and why), or carried inside their
  // record (small ordinary CPU tensors, at most wire::kInlineBytes: ferry's own envelopes and
  // Python payloads mostly), which is neither.
  std::uint64_t tensors_zero_copy = 0, bytes_zero_copy = 0;
  std::uint64_t tensors_copied = 0, bytes_copied = 0;
  std::uint64_t copies_by_reason[static_cast<int>(CopyReason::count_)] = {};
  std::uint64_t tensors_in_record = 0, bytes_in_record = 0;
  std::uint64_t tensors_received = 0, bytes_received = 0;
  // Of those, small copied tensors taken into this process's memory at once (their lease ended).
  std::uint64_t tensors_copied_on_receipt = 0, bytes_copied_on_receipt = 0;
  // Received storages moved into this process's memory because their sender exited.
  std::uint64_t storages_relocated = 0, bytes_relocated = 0;
  // CPU allocations made while shared allocations were on (runtime/shared_allocations.hpp) that
  // were born in the arena, and those that fell back to LibTorch's allocator because the arena
  // was full (FERRY_SHARED_ALLOCATIONS_MAX, or no room for another segment).
  std::uint64_t shared_allocations = 0, bytes_shared_allocations = 0;
  std::uint64_t shared_allocation_fallbacks = 0, bytes_shared_allocation_fallbacks = 0;
  std::uint64_t segments_created = 0;  // shm segments this process made (arena growth, ledgers)
  std::uint64_t segments_mapped = 0;   // peers' segments mapped here (each at most once)
  std::uint64_t fds_fetched = 0;       // segment fds received by SCM_RIGHTS
  std::uint64_t leases_reclaimed = 0;  // leases taken back from receivers that died
  // Custody (ipc/channel.hpp): this process's segments handed to queues' custody (once per
  // segment and queue), the times a custody refused them, and segments this process took from
  // a custody because their sender had died.
  std::uint64_t segments_entrusted = 0, custody_refusals = 0, segments_from_custody = 0;
  // Leases of messages left in queues that no process holds any more, taken back.
  std::uint64_t leases_abandoned = 0;
  // Bytes of free arena blocks given back to the system after lying unused (FERRY_ARENA_IDLE_MS).
  std::uint64_t bytes_returned = 0;
  // CUDA IPC (runtime/transport/cuda_ipc/); the zero-copy ones are also in tensors_zero_copy.
  std::uint64_t cuda_tensors_zero_copy = 0, cuda_bytes_zero_copy = 0;
  // Handles exported and opened: cudaIpcGetMemHandle and cudaIpcOpenMemHandle calls (once per
  // block, and per block and peer); for expandable segments, chunk fds exported and imported.
  std::uint64_t cuda_handles_exported = 0;
  std::uint64_t cuda_handles_opened = 0;
  std::uint64_t cuda_handle_cache_hits = 0;  // received tensors that reused an open block
  std::uint64_t cuda_handles_closed = 0;
  std::uint64_t cuda_stale_entries = 0;  // import-cache entries dropped for address reuse
  // How CUDA sends ordered their receivers (ipc/cuda/sync_policy.hpp): nothing to wait for (the
  // stream was idle), a timeline write, an interprocess event recorded, the stream synchronised
  // (FERRY_CUDA_SYNC=stream, or no event free); and the sends that could not take their mode's
  // way, by why (kSyncFallbacks).
  std::uint64_t cuda_idle_sends = 0;
  std::uint64_t cuda_memop_writes = 0;
  std::uint64_t cuda_events_recorded = 0;
  std::uint64_t cuda_event_pool_syncs = 0;
  std::uint64_t cuda_sync_fallbacks[kSyncFallbacks] = {};
  // Receivers: timeline waits queued, flag buffers opened (once per sender and device), waits a
  // dead sender left that the closer released; leases of dropped views released at once (idle
  // stream), after an event, after the whole device (FERRY_CUDA_STRICT_RELEASE, or no event).
  std::uint64_t cuda_memop_waits = 0;
  std::uint64_t cuda_flag_buffers_opened = 0;
  std::uint64_t cuda_waits_released = 0;
  std::uint64_t cuda_releases_now = 0, cuda_releases_after_event = 0;
  std::uint64_t cuda_releases_after_device = 0;
  std::uint64_t cuda_peer_deaths = 0;  // senders that died while this process held views
};

// How one tensor of a sent message travelled.
struct SentTensor {
  std::uint64_t bytes = 0;
  bool cuda = false;
  std::optional<CopyReason> copied;  // why it was copied; unset when it was shared in place
  bool in_record = false;            // carried inside its record: neither shared nor copied
};

// Tensors and bytes shared in place and copied, and the copies by reason; those carried inside
// their records are in neither.
struct TransferCounts {
  std::uint64_t tensors_zero_copy = 0, bytes_zero_copy = 0;
  std::uint64_t tensors_copied = 0, bytes_copied = 0;
  std::uint64_t copies_by_reason[static_cast<int>(CopyReason::count_)] = {};
  void add(const SentTensor& t) noexcept;
};

// What TensorQueue::send did with a message: each tensor in order.
struct SendReport {
  std::vector<SentTensor> tensors;
  // The counts over tensors [from, end): a caller's own header tensor can be left out.
  TransferCounts counts(std::size_t from = 0) const noexcept;
};

// A snapshot of this process's counters.
TransportStats transport_stats() noexcept;

namespace detail {
struct StatCounters {
  std::atomic<std::uint64_t> messages_sent{0}, messages_received{0};
  std::atomic<std::uint64_t> tensors_zero_copy{0}, bytes_zero_copy{0};
  std::atomic<std::uint64_t> tensors_copied{0}, bytes_copied{0};
  std::atomic<std::uint64_t> copies_by_reason[static_cast<int>(CopyReason::count_)]{};
  std::atomic<std::uint64_t> tensors_in_record{0}, bytes_in_record{0};
  std::atomic<std::uint64_t> tensors_received{0}, bytes_received{0};
  std::atomic<std::uint64_t> tensors_copied_on_receipt{0}, bytes_copied_on_receipt{0};
  std::atomic<std::uint64_t> storages_relocated{0}, bytes_relocated{0};
  std::atomic<std::uint64_t> shared_allocations{0}, bytes_shared_allocations{0};
  std::atomic<std::uint64_t> shared_allocation_fallbacks{0}, bytes_shared_allocation_fallbacks{0};
  std::atomic<std::uint64_t> segments_created{0}, segments_mapped{0}, fds_fetched{0};
  std::atomic<std::uint64_t> leases_reclaimed{0};
  std::atomic<std::uint64_t> segments_entrusted{0}, custody_refusals{0}, segments_from_custody{0};
  std::atomic<std::uint64_t> leases_abandoned{0}, bytes_returned{0};
  std::atomic<std::uint64_t> cuda_tensors_zero_copy{0}, cuda_bytes_zero_copy{0};
  std::atomic<std::uint64_t> cuda_handles_exported{0}, cuda_handles_opened{0};
  std::atomic<std::uint64_t> cuda_handle_cache_hits{0}, cuda_handles_closed{0};
  std::atomic<std::uint64_t> cuda_stale_entries{0}, cuda_events_recorded{0};
  std::atomic<std::uint64_t> cuda_event_pool_syncs{0}, cuda_peer_deaths{0};
  std::atomic<std::uint64_t> cuda_idle_sends{0}, cuda_memop_writes{0};
  std::atomic<std::uint64_t> cuda_sync_fallbacks[kSyncFallbacks]{};
  std::atomic<std::uint64_t> cuda_memop_waits{0}, cuda_flag_buffers_opened{0};
  std::atomic<std::uint64_t> cuda_waits_released{0};
  std::atomic<std::uint64_t> cuda_releases_now{0}, cuda_releases_after_event{0};
  std::atomic<std::uint64_t> cuda_releases_after_device{0};
};
StatCounters& counters() noexcept;
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}
// Counts a tensor a send put in the queue.
void count_sent(const SentTensor& t) noexcept;
}  // namespace detail

}  // namespace ferry
