#include "runtime/cuda_ipc.hpp"

#include "runtime/transport/cuda_ipc/cuda_ipc.hpp"

namespace ferry {

bool source_alive(const at::Tensor& t) {
  return detail::cuda_source_alive(t);
}

}  // namespace ferry
