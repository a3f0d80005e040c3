// A small cpu record whose bytes are in the record itself (kFlagInline), where a cuda record
// has its CUDA section, so that section is not checked for zero. Its device is any cpu record's;
// kFlagCopied is the only other flag it takes; its owner, segment, block offset and lease fields
// are zero, block_length is at most kInlineBytes, and its view is contiguous from
// storage_offset 0 with an extent of exactly block_length.
#include "ipc/wire.hpp"
#include "ipc/wire_rules.hpp"

namespace ferry::wire {

bool carries_inline(const Record& r) {
  return r.device_type == static_cast<std::uint8_t>(DeviceType::cpu) && (r.flags & kFlagInline);
}

std::string check_inline(const Record& r) {
  if (std::string e = check_cpu_device(r); !e.empty()) return e;
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
  return "";
}

std::string check_inline_view(const Record& r, std::int64_t extent) {
  if (extent == 0) return "";  // an empty view has any strides, as in PyTorch
  if (static_cast<std::uint64_t>(extent) != r.block_length) {
    return "view extent of " + i64(extent) + " bytes is not the inline block_length " +
           u64(r.block_length);
  }
  std::int64_t expected = 1;  // contiguous: each stride the product of the sizes after it
  for (int i = r.rank - 1; i >= 0; --i) {
    if (r.sizes[i] != 1 && r.strides[i] != expected) {
      return "strides[" + i64(i) + "] is " + i64(r.strides[i]) +
             " in an inline record, whose view must be contiguous (expected " + i64(expected) + ")";
    }
    expected *= r.sizes[i];  // no overflow: the extent did not overflow
  }
  return "";
}

}  // namespace ferry::wire
