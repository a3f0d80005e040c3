#include "ipc/wire.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>

// Decisions the header leaves open, fixed here so senders and receivers agree:
// - sizes[i] and strides[i] for i >= rank must be 0. make_record() zeroes them, so a non-zero
//   value there can only come from a bug or corruption, and rejecting it keeps one byte
//   pattern per tensor.
// - flags bits other than those below are rejected: a receiver cannot know what an unknown flag
//   would ask of it. kFlagByFd is a cuda record's; its segment_seq names a bundle (from
//   0x80000000, ipc/cuda/span_export.hpp) and its mem_handle is zero.
// - A CPU device_index is -1 or 0: PyTorch writes "cpu" as index -1 and "cpu:0" as 0, and both
//   mean the same memory. A CUDA device_index must be >= 0 because "the current device" means
//   nothing in another process.
// - A kFlagEmptyMessage record describes no tensor: its dtype may be 0 (a non-zero code must
//   still be known), it must have rank 0, msg_count 0 and msg_index 0, its view extent is 0
//   whatever its dtype and storage_offset, and every other check still applies.
// - A kFlagInline record is a CPU tensor with no other flag but kFlagCopied; its owner, segment,
//   block offset and lease fields are zero, block_length is at most kInlineBytes, its view is
//   contiguous from storage_offset 0 and its extent is exactly block_length. Its CUDA section
//   holds the bytes, so it is not checked for zero.

namespace ferry::wire {

namespace {

std::string i64(std::int64_t v) {
  return std::to_string(v);
}
std::string u64(std::uint64_t v) {
  return std::to_string(v);
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

constexpr std::uint32_t kKnownFlags =
    kFlagCopied | kFlagEmptyMessage | kFlagToDevice | kFlagByFd | kFlagInline;
constexpr std::uint32_t kFirstBundleSeq = 0x80000000u;

bool all_zero(const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// The CUDA section must be all zero in a record that is not a CUDA tensor: one byte pattern
// per tensor, as for unused dims.
bool cuda_section_zero(const Record& r) {
  return all_zero(r.mem_handle, sizeof r.mem_handle) && r.cuda_base == 0 && r.cuda_buffer_id == 0 &&
         all_zero(r.event_handle, sizeof r.event_handle) && r.event_slot == 0 && r.sync == 0 &&
         all_zero(r.sync_reserved, sizeof r.sync_reserved) && r.flag_value == 0 &&
         r.owner_pid_ns == 0 && all_zero(r.owner_boot_id, sizeof r.owner_boot_id);
}

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

std::size_t element_size(std::uint8_t dtype) noexcept {
  switch (static_cast<DType>(dtype)) {
    case DType::uint8:
      return 1;
    case DType::int8:
      return 1;
    case DType::int16:
      return 2;
    case DType::int32:
      return 4;
    case DType::int64:
      return 8;
    case DType::float16:
      return 2;
    case DType::float32:
      return 4;
    case DType::float64:
      return 8;
    case DType::complex32:
      return 4;
    case DType::complex64:
      return 8;
    case DType::complex128:
      return 16;
    case DType::bool_:
      return 1;
    case DType::bfloat16:
      return 2;
    case DType::uint16:
      return 2;
    case DType::uint32:
      return 4;
    case DType::uint64:
      return 8;
    case DType::float8_e5m2:
      return 1;
    case DType::float8_e4m3fn:
      return 1;
    case DType::float8_e5m2fnuz:
      return 1;
    case DType::float8_e4m3fnuz:
      return 1;
  }
  return 0;
}

const char* dtype_name(std::uint8_t dtype) noexcept {
  switch (static_cast<DType>(dtype)) {
    case DType::uint8:
      return "uint8";
    case DType::int8:
      return "int8";
    case DType::int16:
      return "int16";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::float16:
      return "float16";
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::complex32:
      return "complex32";
    case DType::complex64:
      return "complex64";
    case DType::complex128:
      return "complex128";
    case DType::bool_:
      return "bool";
    case DType::bfloat16:
      return "bfloat16";
    case DType::uint16:
      return "uint16";
    case DType::uint32:
      return "uint32";
    case DType::uint64:
      return "uint64";
    case DType::float8_e5m2:
      return "float8_e5m2";
    case DType::float8_e4m3fn:
      return "float8_e4m3fn";
    case DType::float8_e5m2fnuz:
      return "float8_e5m2fnuz";
    case DType::float8_e4m3fnuz:
      return "float8_e4m3fnuz";
  }
  return "unknown";
}

Record make_record() noexcept {
  Record r;
  // memset rather than value-initialisation so the padding is zero too and no stack bytes of
  // the sender end up in a peer's memory.
  std::memset(&r, 0, sizeof r);
  r.magic = kMagic;
  r.version = kVersion;
  return r;
}

std::int64_t view_extent_bytes(const Record& r) noexcept {
  // Total over any bytes, not only validated ones: the fuzzer and the decoder's error path call
  // it on records that failed validation, and it must never index past kMaxDims or overflow.
  // An empty message carries no tensor, so a receiver may touch none of the block.
  if (r.flags & kFlagEmptyMessage) return 0;
  if (r.rank > kMaxDims || r.storage_offset < 0) return -1;
  bool empty = false;
  for (int i = 0; i < r.rank; ++i) {
    if (r.sizes[i] < 0 || r.strides[i] < 0) return -1;
    if (r.sizes[i] == 0) empty = true;
  }
  // PyTorch's computeStorageNbytes also ignores storage_offset and strides for an empty view:
  // it reads no element, so it needs no bytes.
  if (empty) return 0;
  std::int64_t last = r.storage_offset;  // element index of the view's last element
  for (int i = 0; i < r.rank; ++i) {
    std::int64_t span = 0;
    if (__builtin_mul_overflow(r.sizes[i] - 1, r.strides[i], &span)) return -1;
    if (__builtin_add_overflow(last, span, &last)) return -1;
  }
  std::int64_t elements = 0;
  if (__builtin_add_overflow(last, std::int64_t{1}, &elements)) return -1;
  std::int64_t bytes = 0;
  const auto esize = static_cast<std::int64_t>(element_size(r.dtype));
  if (__builtin_mul_overflow(elements, esize, &bytes)) return -1;
  return bytes;
}

std::string validate(const Record& r) {
  if (r.magic != kMagic) {
    return "magic " + hex32(r.magic) + " is not " + hex32(kMagic) + " (\"FRRY\")";
  }
  if (r.version != kVersion) {
    return "version " + u64(r.version) + " is not the supported version " + u64(kVersion);
  }
  if (r.flags & ~kKnownFlags) {
    return "flags " + hex32(r.flags) + " has unknown bits " + hex32(r.flags & ~kKnownFlags);
  }
  const bool empty_message = (r.flags & kFlagEmptyMessage) != 0;
  if (element_size(r.dtype) == 0 && !(empty_message && r.dtype == 0)) {
    return "unknown dtype code " + u64(r.dtype);
  }
  if (r.rank > kMaxDims) {
    return "rank " + u64(r.rank) + " exceeds the limit of " + i64(kMaxDims);
  }
  if (empty_message) {
    if (r.msg_count != 0) {
      return "msg_count " + u64(r.msg_count) + " with kFlagEmptyMessage (expected 0)";
    }
    if (r.msg_index != 0) {
      return "msg_index " + u64(r.msg_index) + " with kFlagEmptyMessage (expected 0)";
    }
    if (r.rank != 0) return "rank " + u64(r.rank) + " with kFlagEmptyMessage (expected 0)";
  } else {
    if (r.msg_count == 0) return "msg_count is 0 without kFlagEmptyMessage";
    if (r.msg_index >= r.msg_count) {
      return "msg_index " + u64(r.msg_index) + " is not below msg_count " + u64(r.msg_count);
    }
  }
  switch (static_cast<DeviceType>(r.device_type)) {
    case DeviceType::cpu:
      if (r.flags & kFlagByFd) return "flags " + hex32(r.flags) + " pass a cpu record by fd";
      if (r.flags & kFlagToDevice) {
        if (r.device_index < 0) {
          return "device_index " + i64(r.device_index) +
                 " for a tensor staged to a cuda device (expected >= 0)";
        }
      } else if (r.device_index != -1 && r.device_index != 0) {
        return "device_index " + i64(r.device_index) + " for a cpu tensor (expected -1 or 0)";
      }
      if (r.flags & kFlagInline) {
        if (r.flags & ~(kFlagInline | kFlagCopied)) {
          return "flags " + hex32(r.flags) + " on an inline record (only kFlagCopied may join)";
        }
        if (r.owner_token != 0 || r.owner_pid != 0 || r.segment_seq != 0 || r.segment_size != 0 ||
            r.block_offset != 0 || r.lease_slot != 0 || r.lease_gen != 0) {
          return "an inline record names an owner, segment, block or lease (expected all 0)";
        }
        if (r.block_length > kInlineBytes) {
          return "block_length " + u64(r.block_length) + " of an inline record exceeds its " +
                 u64(kInlineBytes) + " bytes";
        }
        if (r.storage_offset != 0) {
          return "storage_offset " + i64(r.storage_offset) + " of an inline record (expected 0)";
        }
      } else if (!cuda_section_zero(r)) {
        return "CUDA section is not zero in a cpu record";
      }
      break;
    case DeviceType::cuda:
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
      if (std::string e = validate_sync(r); !e.empty()) return e;
      break;
    default:
      return "unknown device_type " + u64(r.device_type) + " (expected 0 = cpu or 1 = cuda)";
  }
  if (r.storage_offset < 0) return "storage_offset is " + i64(r.storage_offset);
  // The index's text is made only for an error: every record of every message passes here.
  const auto idx = [](int i) { return "[" + i64(i) + "]"; };
  for (int i = 0; i < kMaxDims; ++i) {
    if (i < r.rank) {
      if (r.sizes[i] < 0) return "sizes" + idx(i) + " is " + i64(r.sizes[i]);
      if (r.strides[i] < 0) return "strides" + idx(i) + " is " + i64(r.strides[i]);
    } else {
      if (r.sizes[i] != 0) {
        return "sizes" + idx(i) + " is " + i64(r.sizes[i]) + " beyond rank " + u64(r.rank) +
               " (unused dims must be 0)";
      }
      if (r.strides[i] != 0) {
        return "strides" + idx(i) + " is " + i64(r.strides[i]) + " beyond rank " + u64(r.rank) +
               " (unused dims must be 0)";
      }
    }
  }
  const std::int64_t extent = view_extent_bytes(r);
  if (extent < 0) {
    return "view extent overflows int64 (storage_offset " + i64(r.storage_offset) + ", dtype " +
           dtype_name(r.dtype) + ", rank " + u64(r.rank) + ")";
  }
  if (static_cast<std::uint64_t>(extent) > r.block_length) {
    return "view extent of " + i64(extent) + " bytes exceeds block_length " + u64(r.block_length);
  }
  if ((r.flags & kFlagInline) && extent > 0) {  // an empty view has any strides, as in PyTorch
    if (static_cast<std::uint64_t>(extent) != r.block_length) {
      return "view extent of " + i64(extent) + " bytes is not the inline block_length " +
             u64(r.block_length);
    }
    std::int64_t expected = 1;  // contiguous: each stride the product of the sizes after it
    for (int i = r.rank - 1; i >= 0; --i) {
      if (r.sizes[i] != 1 && r.strides[i] != expected) {
        return "strides" + idx(i) + " is " + i64(r.strides[i]) +
               " in an inline record, whose view must be contiguous (expected " + i64(expected) +
               ")";
      }
      expected *= r.sizes[i];  // no overflow: the extent above did not overflow
    }
  }
  return "";
}

std::string validate_location(const Record& r, std::size_t mapped_size) {
  if (r.segment_size != mapped_size) {
    return "segment_size " + u64(r.segment_size) + " does not match the mapped size " +
           u64(mapped_size);
  }
  std::uint64_t end = 0;
  if (__builtin_add_overflow(r.block_offset, r.block_length, &end)) {
    return "block_offset " + u64(r.block_offset) + " + block_length " + u64(r.block_length) +
           " overflows";
  }
  if (end > mapped_size) {
    return "block_offset " + u64(r.block_offset) + " + block_length " + u64(r.block_length) +
           " = " + u64(end) + " exceeds the mapped size " + u64(mapped_size);
  }
  return "";
}

}  // namespace ferry::wire
