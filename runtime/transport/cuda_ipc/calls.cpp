#include "runtime/transport/cuda_ipc/calls.hpp"

#include "ipc/error.hpp"
#include "ipc/step_times.hpp"

namespace ferry::detail {

void check(const cuda::Status& s, const std::string& doing) {
  if (!s.ok()) {
    throw Error(Errc::system, doing + ": " + s.error +
                                  ". Remedy: check the device and driver (ferry-shm check); "
                                  "sending t.cpu() avoids CUDA IPC");
  }
}

at::Tensor copy_on_device(const at::Tensor& t) {
  const steps::Timed step("copy on the device");
  if (t.is_non_overlapping_and_dense()) {
    return at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t);
  }
  return at::empty(t.sizes(), t.options()).copy_(t);
}

}  // namespace ferry::detail
