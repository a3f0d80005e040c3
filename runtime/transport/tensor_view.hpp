// What every transport does with a tensor's view (internal): check that it can travel, describe
// its layout in a record, build a tensor over memory it does not own, count a copy.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

#include "ipc/stats.hpp"
#include "ipc/wire.hpp"

namespace ferry::detail {

// Throws Error(invalid_argument) for a tensor that cannot travel (undefined, sparse, on a
// device other than CPU or CUDA, too many dims), naming its index and the remedy.
void check_sendable(const at::Tensor& t, std::size_t index);

// dtype, rank, sizes, strides, storage offset and block_length of `t` into `r`.
void describe_view(const at::Tensor& t, wire::Record& r);

// A tensor over `nbytes` at `base` on `device`, whose storage calls deleter(ctx) when it dies.
at::Tensor tensor_over(void* base, std::size_t nbytes, void* ctx, c10::DeleterFnPtr deleter,
                       c10::Device device, at::ScalarType dtype, at::IntArrayRef sizes,
                       at::IntArrayRef strides, std::int64_t storage_offset);

// Counts one tensor copied outside a queue's send (by a receiver, or by a link to another host),
// and why (a send counts its own: count_sent()).
void count_copy(CopyReason reason, std::size_t bytes);

}  // namespace ferry::detail
