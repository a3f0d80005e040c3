// The LibTorch adapter's core (internal): at::Tensor <-> wire record.
//
// A tensor whose storage is a block of this process's arena is described in place (zero-copy);
// any other tensor is first copied into a fresh block (copy-on-send). Either way the block is
// kept alive by a lease until the receiver drops its view. On the receiving side a record
// becomes an at::Tensor over the owner's mapped segment, whose deleter ends the lease, or, for a
// small copied block, a copy in the receiver's own memory.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ipc/arena.hpp"
#include "ipc/ledger.hpp"
#include "ipc/stats.hpp"
#include "ipc/wire.hpp"

namespace ferry {

class Segment;

namespace detail {

// A block of an arena, shared by the tensor storage that owns it and each lease on it; it goes
// back to the arena when the last of them lets go.
struct BlockHandle {
  // A constructor, not aggregate initialisation: C++20 no longer counts a class with
  // user-declared constructors (the deleted copies below) as an aggregate.
  BlockHandle(Arena* a, Arena::Block b) : arena(a), block(b) {}
  Arena* arena;
  Arena::Block block;
  ~BlockHandle() { arena->free(block); }
  BlockHandle(const BlockHandle&) = delete;
  BlockHandle& operator=(const BlockHandle&) = delete;
};

// A tensor over `nbytes` at `base` on `device`, whose storage calls deleter(ctx) when it dies.
at::Tensor tensor_over(void* base, std::size_t nbytes, void* ctx, c10::DeleterFnPtr deleter,
                       c10::Device device, at::ScalarType dtype, at::IntArrayRef sizes,
                       at::IntArrayRef strides, std::int64_t storage_offset);

// A fresh block of `arena` of `nbytes`, as the DataPtr that owns it.
c10::DataPtr arena_data_ptr(Arena& arena, std::size_t nbytes);

// A CPU tensor of the given layout whose storage is a fresh block of `arena`.
at::Tensor allocate_in_arena(Arena& arena, at::IntArrayRef sizes, at::IntArrayRef strides,
                             at::ScalarType dtype, std::size_t storage_bytes);

// A copy of `t` in a fresh block of `arena`: dense tensors keep their strides, gapped views are
// packed contiguously.
at::Tensor copy_to_arena(Arena& arena, const at::Tensor& t);

// The arena block behind `t`'s storage when it is one of this process's own, else null.
std::shared_ptr<BlockHandle> arena_block_of(const at::Tensor& t);
// True when `t`'s storage was received from a peer.
bool is_received(const at::Tensor& t);
// True when `t`'s storage already lives in shared memory: a block of an arena (this process's,
// or one inherited across fork) or a block received from a peer.
bool in_shared_memory(const at::Tensor& t);
// The token of the peer whose block `data` is a view of, or 0 when it is not a received block.
std::uint64_t received_owner(const c10::DataPtr& data);

// Throws Error(invalid_argument) for a tensor that cannot travel (undefined, sparse, on a
// device other than CPU or CUDA, too many dims), naming its index and the remedy.
void check_sendable(const at::Tensor& t, std::size_t index);

struct Outgoing {
  wire::Record record;
  Ledger::Lease lease;
  std::optional<CopyReason> copied;  // why it was copied first; unset when shared in place
};
// Describes CPU tensor `index` of a message for sending (copying it first when it cannot be
// shared in place) and takes a lease on its block.
Outgoing encode(const at::Tensor& t, std::size_t index, Arena& arena, bool detached);

// The record of arena tensor `shared`, whose storage is `block`, with a lease on the block.
Outgoing describe_in_arena(const at::Tensor& shared, std::shared_ptr<BlockHandle> block,
                           Arena& arena);
// dtype, rank, sizes, strides, storage offset and block_length of `t` into `r`.
void describe_view(const at::Tensor& t, wire::Record& r);
// Counts one tensor copied outside a queue's send (by a receiver, or by a link to another host),
// and why (a send counts its own: count_sent()).
void count_copy(CopyReason reason, std::size_t bytes);

// Copied blocks smaller than this are copied on receipt (FERRY_COPY_ON_RECEIPT_BELOW, read
// once per process). Throws Error(invalid_argument) for a bad value.
std::uint64_t copy_on_receipt_below();

// Builds the received tensor for a validated record whose lease `holder` has claimed. A small
// copied block, or any block of a sender that has exited (`sender_exited`), is copied into this
// process's memory and its lease released at once (decide_receipt); otherwise the tensor is a
// view of the block whose deleter releases the lease, and its storage is noted under its sender
// (track_received).
at::Tensor decode(const wire::Record& r, std::shared_ptr<Segment> data,
                  std::shared_ptr<Segment> ledger, pid_t holder, bool sender_exited = false);

}  // namespace detail
}  // namespace ferry
