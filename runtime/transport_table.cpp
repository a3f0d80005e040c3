#include "runtime/transport_table.hpp"

#include "runtime/transport/cuda_ipc/cuda_ipc.hpp"
#include "runtime/transport/in_record/in_record.hpp"
#include "runtime/transport/shm_cpu/shm_cpu.hpp"

namespace ferry::detail {

const Transport& transport(Carrier c) {
  switch (c) {
    case Carrier::cuda_ipc:
      return cuda_ipc_transport();
    case Carrier::in_record:
      return in_record_transport();
    case Carrier::shm_cpu:
      break;
  }
  return shm_cpu_transport();
}

std::array<const Transport*, 3> all_transports() {
  return {&shm_cpu_transport(), &cuda_ipc_transport(), &in_record_transport()};
}

Sending sending(const at::Tensor& t, bool detached) {
  Sending s;
  if (!t.defined() || t.layout() != at::kStrided) return s;  // shm_cpu's checks name the fault
  s.cuda = t.is_cuda();
  if (s.cuda || !t.device().is_cpu()) return s;
  s.shared = !detached && arena_block_of(t) != nullptr;
  // A lazy conjugate or negative view holds other bytes than its values: shm_cpu resolves it.
  s.contiguous = t.is_contiguous() && !t.is_conj() && !t.is_neg();
  s.bytes = t.nbytes();
  return s;
}

}  // namespace ferry::detail
