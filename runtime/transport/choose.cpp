#include "runtime/transport/transport.hpp"

namespace ferry::detail {

Carrier choose(const Sending& t) noexcept {
  if (t.cuda) return Carrier::cuda_ipc;
  if (!t.shared && t.contiguous && t.bytes <= wire::kInlineBytes) return Carrier::in_record;
  return Carrier::shm_cpu;
}

Carrier choose(const wire::Record& r) noexcept {
  if (r.device_type == static_cast<std::uint8_t>(wire::DeviceType::cuda)) return Carrier::cuda_ipc;
  // A CUDA tensor the sender copied to the host for a receiver that cannot open its memory:
  // shm_cpu's block, which cuda_ipc moves back to the device on decode.
  if (r.flags & wire::kFlagToDevice) return Carrier::cuda_ipc;
  if (r.flags & wire::kFlagInline) return Carrier::in_record;
  return Carrier::shm_cpu;
}

const char* carrier_name(Carrier c) noexcept {
  switch (c) {
    case Carrier::shm_cpu:
      return "shm_cpu";
    case Carrier::cuda_ipc:
      return "cuda_ipc";
    case Carrier::in_record:
      return "in_record";
  }
  return "unknown";
}

}  // namespace ferry::detail
