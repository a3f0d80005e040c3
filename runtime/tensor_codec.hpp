// The LibTorch adapter's core (internal): at::Tensor <-> wire record.
//
// A tensor whose storage is a block of this process's arena is described in place (zero-copy);
// any other tensor is first copied into a fresh block (copy-on-send). Either way the block is
// kept alive by a lease until the receiver drops its view. On the receiving side a record
// becomes an at::Tensor over the owner's mapped segment, whose deleter ends the lease.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "ipc/arena.hpp"
#include "ipc/ledger.hpp"
#include "ipc/wire.hpp"

namespace ferry {

class Segment;

namespace detail {

// A block of an arena, shared by the tensor storage that owns it and each lease on it; it goes
// back to the arena when the last of them lets go.
struct BlockHandle {
  Arena* arena;
  Arena::Block block;
  ~BlockHandle() { arena->free(block); }
  BlockHandle(const BlockHandle&) = delete;
  BlockHandle& operator=(const BlockHandle&) = delete;
};

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

// Describes tensor `index` of a message for sending (copying it first when it cannot be shared
// in place) and takes a lease on its block. Throws Error(invalid_argument) for tensors that
// cannot travel, naming the index and the remedy.
struct Outgoing {
  wire::Record record;
  Ledger::Lease lease;
};
Outgoing encode(const at::Tensor& t, std::size_t index, Arena& arena, bool detached);

// Builds the received tensor for a validated record whose lease `holder` has claimed. The
// tensor's deleter releases the lease.
at::Tensor decode(const wire::Record& r, std::shared_ptr<Segment> data,
                  std::shared_ptr<Segment> ledger, pid_t holder);

}  // namespace detail
}  // namespace ferry
