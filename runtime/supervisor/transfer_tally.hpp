// How tensors travelled, in the four counts a pool reports (ipc/stats.hpp's TransferCounts:
// tensors and bytes shared in place, and copied), added on from one holder to the next: a
// worker's send into its result envelope, the envelope into its slot's WorkerStats, a task's
// inputs into the pool's totals. Here once, so a count added to them is carried everywhere.
#pragma once

#include "ipc/stats.hpp"
#include "runtime/supervisor/pool_stats.hpp"

namespace ferry {

// Adds `from`'s four counts to `to`'s; both name them as TransferCounts does (a
// ResultEnvelope, a WorkerStats).
template <typename To, typename From>
void add_transfer_counts(To& to, const From& from) noexcept {
  to.tensors_zero_copy += from.tensors_zero_copy;
  to.bytes_zero_copy += from.bytes_zero_copy;
  to.tensors_copied += from.tensors_copied;
  to.bytes_copied += from.bytes_copied;
}

// The pool's own counts are its tasks' inputs', as they first travelled to a worker.
inline void add_transfer_counts(PoolStats& to, const TransferCounts& from) noexcept {
  to.input_tensors_zero_copy += from.tensors_zero_copy;
  to.input_bytes_zero_copy += from.bytes_zero_copy;
  to.input_tensors_copied += from.tensors_copied;
  to.input_bytes_copied += from.bytes_copied;
}

}  // namespace ferry
