// A cpu record whose bytes are a block of its owner's segment (the shm_cpu transport, and a cuda
// tensor staged through it: kFlagToDevice).
//
// A cpu device_index is -1 or 0: PyTorch writes "cpu" as index -1 and "cpu:0" as 0, and both
// mean the same memory. The CUDA section must be all zero: one byte pattern per tensor, as for
// unused dims.
#include "ipc/wire.hpp"
#include "ipc/wire_rules.hpp"

namespace ferry::wire {
namespace {

bool cuda_section_zero(const Record& r) {
  return all_zero(r.mem_handle, sizeof r.mem_handle) && r.cuda_base == 0 && r.cuda_buffer_id == 0 &&
         all_zero(r.event_handle, sizeof r.event_handle) && r.event_slot == 0 && r.sync == 0 &&
         all_zero(r.sync_reserved, sizeof r.sync_reserved) && r.flag_value == 0 &&
         r.owner_pid_ns == 0 && all_zero(r.owner_boot_id, sizeof r.owner_boot_id);
}

}  // namespace

bool carries_cpu(const Record& r) {
  return r.device_type == static_cast<std::uint8_t>(DeviceType::cpu) && !(r.flags & kFlagInline);
}

std::string check_cpu_device(const Record& r) {
  if (r.flags & kFlagByFd) return "flags " + hex32(r.flags) + " pass a cpu record by fd";
  if (r.flags & kFlagToDevice) {
    if (r.device_index < 0) {
      return "device_index " + i64(r.device_index) +
             " for a tensor staged to a cuda device (expected >= 0)";
    }
  } else if (r.device_index != -1 && r.device_index != 0) {
    return "device_index " + i64(r.device_index) + " for a cpu tensor (expected -1 or 0)";
  }
  return "";
}

std::string check_cpu(const Record& r) {
  if (std::string e = check_cpu_device(r); !e.empty()) return e;
  if (!cuda_section_zero(r)) return "CUDA section is not zero in a cpu record";
  return "";
}

}  // namespace ferry::wire
