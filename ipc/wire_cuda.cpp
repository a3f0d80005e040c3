// A cuda record: a block of its owner's cudaMalloc allocation, opened by IPC handle, or, with
// kFlagByFd, a span of virtual-memory chunks whose segment_seq names the owner's bundle of chunk
// fds (from 0x80000000, ipc/cuda/span_export.hpp) and whose mem_handle is zero. Its
// device_index is >= 0, since "the current device" means nothing in another process, and its
// sync names exactly what its receiver waits on.
#include "ipc/wire.hpp"
#include "ipc/wire_rules.hpp"

namespace ferry::wire {
namespace {

constexpr std::uint32_t kFirstBundleSeq = 0x80000000u;

// A CUDA record's ordering: each kind names exactly what its receiver uses, and nothing else.
std::string validate_sync(const Record& r) {
  const bool handle = !all_zero(r.event_handle, sizeof r.event_handle);
  switch (r.sync) {
    case kSyncNone:
    case kSyncSynced:
      if (r.event_slot != kNoEvent || handle || r.flag_value != 0) {
        return "sync " + u64(r.sync) +
               " (nothing to wait on) with an event slot, handle or flag value (expected "
               "kNoEvent, 0, 0)";
      }
      return "";
    case kSyncEvent:
      if (r.event_slot == kNoEvent) return "sync event without an event slot";
      if (r.flag_value != 0) return "flag_value " + u64(r.flag_value) + " on a sync event record";
      return "";
    case kSyncMemop:
      if (r.event_slot >= kFlagSlots) {
        return "flag slot " + u64(r.event_slot) + " beyond the " + u64(kFlagSlots) +
               " of a flag buffer";
      }
      if (r.flag_value == 0) return "flag_value 0 on a memop record (a flag starts at 0)";
      if (!handle) return "a memop record without its flag buffer's handle";
      return "";
    default:
      return "unknown sync " + u64(r.sync) + " (expected 0 none, 1 event, 2 memop, 3 synced)";
  }
}

}  // namespace

bool carries_cuda(const Record& r) {
  return r.device_type == static_cast<std::uint8_t>(DeviceType::cuda);
}

std::string check_cuda(const Record& r) {
  if (r.device_index < 0) {
    return "device_index " + i64(r.device_index) + " for a cuda tensor (expected >= 0)";
  }
  if (r.flags & (kFlagToDevice | kFlagEmptyMessage | kFlagInline)) {
    return "flags " + hex32(r.flags) +
           " on a cuda record (staged, empty and inline are cpu records)";
  }
  if (r.flags & kFlagByFd) {
    if (r.segment_seq < kFirstBundleSeq) {
      return "segment_seq " + u64(r.segment_seq) +
             " on a cuda record passed by fd (expected a bundle, >= 2^31)";
    }
    if (!all_zero(r.mem_handle, sizeof r.mem_handle)) {
      return "mem_handle is set on a cuda record passed by fd";
    }
  } else if (r.segment_seq != 0) {
    return "segment_seq " + u64(r.segment_seq) + " on a cuda record (expected 0)";
  }
  if (r.cuda_base == 0) return "cuda_base is 0 on a cuda record";
  if (!all_zero(r.sync_reserved, sizeof r.sync_reserved)) return "sync_reserved is not zero";
  return validate_sync(r);
}

}  // namespace ferry::wire
