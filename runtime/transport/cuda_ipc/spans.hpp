// The CUDA transport's part for tensors in virtual-memory chunks (LibTorch's expandable
// segments), passed by file descriptor (internal). The rest of cuda_ipc/ does everything a
// cudaMalloc block and a span share (lease, event, import cache, closer); this is what differs:
// which chunks to export, how a record names them, and how the receiver maps them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ipc/cuda/span_export.hpp"
#include "ipc/cuda/span_import.hpp"
#include "ipc/wire.hpp"

namespace ferry::detail {

// The span `t`'s storage lies in, or nullopt (saying why at debug level) where it cannot travel
// by fd after all: then it is copied, with the reason not_exportable.
std::optional<cuda::Span> span_of(const at::Tensor& t);

// Fills the memory part of `r` for `t`, sent through export `e`.
void describe_span(wire::Record& r, const cuda::SpanExport& e, const at::Tensor& t);

// Receiver: fetches the bundle that `r` names from its owner and maps its span on `device`.
// Returns where the span starts here. Throws Error (bad_record when the bundle does not match
// the record; peer_dead, fd_transfer, timeout from the fetch; system from the driver).
std::uint64_t open_span(cuda::SpanImports& spans, const wire::Record& r,
                        const cuda::ProcessIdentity& owner, int device);

}  // namespace ferry::detail
