// The CPU storages ferry makes (internal): tensors over a block of this process's arena, which
// travel in place, and views of a peer's block, which the receiver holds by a lease. Which of
// them a tensor is, is read from its storage's deleter.
#pragma once

#include <ATen/ATen.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ipc/arena.hpp"
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

// A fresh block of `arena` of `nbytes`, as the DataPtr that owns it.
c10::DataPtr arena_data_ptr(Arena& arena, std::size_t nbytes);

// A block of `arena` as a DataPtr whose context is its own address, as LibTorch's raw allocator
// interface requires (shared allocations hand these out as LibTorch's CPU allocator): the block is
// found again by address, by arena_block_of() and by release_born_shared().
c10::DataPtr born_shared_data_ptr(Arena& arena, Arena::Block block);
// Lets go of the born-shared block at `data`; false when `data` is not one.
bool release_born_shared(void* data) noexcept;

// A CPU tensor of the given layout whose storage is a fresh block of `arena`.
at::Tensor allocate_in_arena(Arena& arena, at::IntArrayRef sizes, at::IntArrayRef strides,
                             at::ScalarType dtype, std::size_t storage_bytes);

// A copy of `t` in a fresh block of `arena`: dense tensors keep their strides, gapped views are
// packed contiguously.
at::Tensor copy_to_arena(Arena& arena, const at::Tensor& t);

// The arena block behind `t`'s storage when it is one of this process's own, else null.
std::shared_ptr<BlockHandle> arena_block_of(const at::Tensor& t);
// True when `t`'s storage is a block of any process's arena (one inherited across fork too).
bool in_an_arena(const at::Tensor& t);

// A tensor viewing the block `r` names in the sender's segment `data`, whose storage releases
// `holder`'s lease in `ledger` when it dies.
at::Tensor received_view(const wire::Record& r, std::shared_ptr<Segment> data,
                         std::shared_ptr<Segment> ledger, pid_t holder);
// True when `t`'s storage was received from a peer.
bool is_received(const at::Tensor& t);
// True when `t`'s storage already lives in shared memory: a block of an arena (this process's,
// or one inherited across fork) or a block received from a peer.
bool in_shared_memory(const at::Tensor& t);
// The token of the peer whose block `data` is a view of, or 0 when it is not a received block.
std::uint64_t received_owner(const c10::DataPtr& data);

}  // namespace detail
}  // namespace ferry
