// The CUDA transport (internal): at::Tensor on a device <-> wire record with a CUDA IPC handle
// (or, for LibTorch's expandable segments, a bundle of fds: spans.hpp), an event to wait on and
// a lease in the sender's CUDA ledger.
//
// Sender (encode.cpp, sender.hpp): find the allocation behind the tensor's storage, export it
// once, take a lease that holds the storage (so LibTorch's caching allocator can neither reuse
// nor free it), record a pooled interprocess event on the current stream. Where zero-copy would
// break a rule, send_policy says what to copy and why; a copy for a receiver that cannot open
// device memory travels through the CPU transport (shm_cpu) and is moved back to the device on
// receipt.
//
// Receiver (decode.cpp, importer.hpp): wait on the event on the current stream, claim the lease,
// open the allocation once (import cache) and return a view at base + offset. When the view dies
// its lease goes to a closer thread, which waits for the device and then releases it; an
// allocation with no views left is closed there too, off the hot path.
#pragma once

#include <ATen/ATen.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "ipc/wire.hpp"
#include "runtime/transport/transport.hpp"

namespace ferry::detail {

// The transport itself (Carrier::cuda_ipc).
const Transport& cuda_ipc_transport();

// Describes CUDA tensor `index` of a message (copying it where send_policy says so) and takes a
// lease on what the record names. Throws Error.
Outgoing encode_cuda(const at::Tensor& t, std::size_t index, Arena& arena, const ReceiverHint& to,
                     bool detached);

// Receiver, inside the channel pop: makes this thread's current stream wait on the record's
// event, maps the sender's CUDA ledger and claims the lease. Returns the ledger segment; throws
// Error (bad_record when the lease does not match).
std::shared_ptr<Segment> claim_cuda(const wire::Record& r, pid_t me);

// Receiver, after the pop: the tensor for a claimed record. Throws Error; the caller releases
// the lease on failure.
at::Tensor decode_cuda(const wire::Record& r, std::shared_ptr<Segment> ledger, pid_t me);

// The device tensor for a record staged through shared memory (wire::kFlagToDevice).
at::Tensor to_staged_device(const at::Tensor& host, const wire::Record& r);

// CUDA sends of this process not yet claimed by a receiver (for flush()).
std::size_t cuda_in_flight();

// True when `t`'s storage is a view on a peer's CUDA allocation.
bool is_cuda_received(const at::Tensor& t);

// ferry::source_alive() (runtime/cuda_ipc.hpp): false for a view on a peer's CUDA allocation
// once that peer has exited.
bool cuda_source_alive(const at::Tensor& t);

// Marks the views on exited process `pid`'s CUDA allocations (notify_peer_exit()).
void cuda_peer_exited(pid_t pid);

}  // namespace ferry::detail
