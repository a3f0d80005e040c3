#include "runtime/transport/cuda_ipc/cuda_ipc.hpp"

#include "runtime/transport/shm_cpu/shm_cpu.hpp"

namespace ferry::detail {
namespace {

// A CUDA record, or a CPU record the sender staged through shared memory for a device: the CPU
// transport carries that one, and this one moves it back to the device.
bool staged(const wire::Record& r) {
  return r.device_type != static_cast<std::uint8_t>(wire::DeviceType::cuda);
}

class CudaIpc final : public Transport {
 public:
  Outgoing encode(const at::Tensor& t, std::size_t index, const SendContext& ctx) const override {
    return encode_cuda(t, index, ctx.arena, ctx.to, ctx.detached);
  }
  void claim(Claim& c, pid_t me, const CustodyLookup& custody) const override {
    if (staged(c.record)) {
      claim_cpu(c, me, custody);
      return;
    }
    c.ledger = claim_cuda(c.record, me);
  }
  at::Tensor decode(Claim& c, pid_t me) const override {
    if (staged(c.record)) return to_staged_device(decode_cpu(c, me), c.record);
    return decode_cuda(c.record, c.ledger, me);
  }
  std::size_t in_flight() const override { return cuda_in_flight(); }
  void peer_exited(pid_t pid) const override { cuda_peer_exited(pid); }
};

}  // namespace

const Transport& cuda_ipc_transport() {
  // Never destroyed: flush_at_exit() asks every transport from an atexit handler, which runs
  // after the statics made since its registration were destroyed.
  static const auto* t = new CudaIpc;
  return *t;
}

}  // namespace ferry::detail
