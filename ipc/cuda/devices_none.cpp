// The probe of a build without nvcc: it reports the build, not the machine, since the machine
// may well have a GPU that this build cannot use.
#include "ipc/cuda/devices.hpp"

namespace ferry::cuda {

CudaStatus probe() noexcept {
  CudaStatus s;
  s.built_with_cuda = false;
  s.error = "ferry was built without CUDA";
  return s;
}

}  // namespace ferry::cuda
