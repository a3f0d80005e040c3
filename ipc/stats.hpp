// Process-wide transport counters: what moved, and how much of it was zero-copy. Cheap relaxed
// atomics; read a consistent-enough snapshot with transport_stats().
#pragma once

#include <atomic>
#include <cstdint>

namespace ferry {

// Why a tensor was copied on send instead of shared.
enum class CopyReason : std::uint8_t {
  not_shared,     // an ordinary tensor, not allocated with empty_shared()
  received,       // the tensor was itself received from a peer (forwarding copies)
  foreign_arena,  // its block belongs to another process's arena (inherited across fork)
  detached,       // the caller asked for a detached send
  count_,
};
const char* copy_reason_name(CopyReason r) noexcept;

struct TransportStats {
  std::uint64_t messages_sent = 0, messages_received = 0;
  std::uint64_t tensors_zero_copy = 0, bytes_zero_copy = 0;
  std::uint64_t tensors_copied = 0, bytes_copied = 0;
  std::uint64_t copies_by_reason[static_cast<int>(CopyReason::count_)] = {};
  std::uint64_t tensors_received = 0, bytes_received = 0;
  std::uint64_t segments_created = 0;  // shm segments this process made (arena growth, ledgers)
  std::uint64_t segments_mapped = 0;   // peers' segments mapped here (each at most once)
  std::uint64_t fds_fetched = 0;       // segment fds received by SCM_RIGHTS
  std::uint64_t leases_reclaimed = 0;  // leases taken back from receivers that died
};

// A snapshot of this process's counters.
TransportStats transport_stats() noexcept;

namespace detail {
struct StatCounters {
  std::atomic<std::uint64_t> messages_sent{0}, messages_received{0};
  std::atomic<std::uint64_t> tensors_zero_copy{0}, bytes_zero_copy{0};
  std::atomic<std::uint64_t> tensors_copied{0}, bytes_copied{0};
  std::atomic<std::uint64_t> copies_by_reason[static_cast<int>(CopyReason::count_)]{};
  std::atomic<std::uint64_t> tensors_received{0}, bytes_received{0};
  std::atomic<std::uint64_t> segments_created{0}, segments_mapped{0}, fds_fetched{0};
  std::atomic<std::uint64_t> leases_reclaimed{0};
};
StatCounters& counters() noexcept;
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}
}  // namespace detail

}  // namespace ferry
