// The current CUDA stream of a device as LibTorch sees it, as a plain cudaStream_t pointer.
#pragma once

namespace ferry::detail {

// LibTorch's current stream on `device` (what a caller's kernels were queued on). With a
// LibTorch built without CUDA it is the legacy default stream (null): no tensor of such a build
// lives on a device anyway.
void* current_cuda_stream(int device);

}  // namespace ferry::detail
