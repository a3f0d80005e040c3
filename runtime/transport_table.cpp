#include "runtime/transport_table.hpp"

#include "runtime/transport/cuda_ipc/cuda_ipc.hpp"
#include "runtime/transport/shm_cpu/shm_cpu.hpp"

namespace ferry::detail {

const Transport& transport(Carrier c) {
  switch (c) {
    case Carrier::cuda_ipc:
      return cuda_ipc_transport();
    case Carrier::shm_cpu:
      break;
  }
  return shm_cpu_transport();
}

std::array<const Transport*, 2> all_transports() {
  return {&shm_cpu_transport(), &cuda_ipc_transport()};
}

}  // namespace ferry::detail
