#include "runtime/transport/cuda_ipc/stream.hpp"

#include "ipc/step_times.hpp"

// c10_cuda is linked only when the LibTorch found has it (FERRY_TORCH_CUDA, set by CMake), so
// the same source builds against the CPU-only LibTorch of a distribution.
#ifdef FERRY_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ferry::detail {

void* current_cuda_stream([[maybe_unused]] int device) {
#ifdef FERRY_TORCH_CUDA
  const steps::Timed step("c10::cuda::getCurrentCUDAStream");
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  return nullptr;
#endif
}

}  // namespace ferry::detail
