// What both sides of the CUDA transport call (internal): failures as errors at the API edge, and
// a copy on the device.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "ipc/cuda/ipc_api.hpp"

namespace ferry::detail {

// A failed CUDA call as Error(system): what ferry was doing, what CUDA said, and the way around
// CUDA IPC that always exists.
void check(const cuda::Status& s, const std::string& doing);

// A copy of `t` on its device: dense tensors keep their strides, others become contiguous.
at::Tensor copy_on_device(const at::Tensor& t);

}  // namespace ferry::detail
