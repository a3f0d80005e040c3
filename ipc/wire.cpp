#include "ipc/wire.hpp"

#include <cstring>

#include "ipc/wire_rules.hpp"

// Decisions the header leaves open, fixed here so senders and receivers agree (each carrier's own
// are in its wire_<carrier>.cpp, found through wire_rules.hpp):
// - sizes[i] and strides[i] for i >= rank must be 0. make_record() zeroes them, so a non-zero
//   value there can only come from a bug or corruption, and rejecting it keeps one byte
//   pattern per tensor.
// - flags bits other than those below are rejected: a receiver cannot know what an unknown flag
//   would ask of it.
// - A kFlagEmptyMessage record describes no tensor: its dtype may be 0 (a non-zero code must
//   still be known), it must have rank 0, msg_count 0 and msg_index 0, its view extent is 0
//   whatever its dtype and storage_offset, and every other check still applies.

namespace ferry::wire {

namespace {

constexpr std::uint32_t kKnownFlags =
    kFlagCopied | kFlagEmptyMessage | kFlagToDevice | kFlagByFd | kFlagInline;

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
  const CarrierRules* carrier = carrier_rules(r);
  if (carrier == nullptr) {
    return "unknown device_type " + u64(r.device_type) + " (expected 0 = cpu or 1 = cuda)";
  }
  if (std::string e = carrier->check(r); !e.empty()) return e;
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
  if (carrier->check_view != nullptr) return carrier->check_view(r, extent);
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
