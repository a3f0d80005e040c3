#include "ipc/wire.hpp"
#include "wire_reference.hpp"

#include "../catch.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace ferry::wire;
using Catch::Contains;

using ferry::wire::test::reference_extent;

namespace {

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

std::uint8_t code(DType d) {
  return static_cast<std::uint8_t>(d);
}

// A valid one-tensor CPU record for the given view, with block_length exactly its extent.
Record tensor(DType dtype, std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides,
              std::int64_t storage_offset = 0) {
  Record r = make_record();
  r.dtype = code(dtype);
  r.rank = static_cast<std::uint8_t>(sizes.size());
  r.msg_index = 0;
  r.msg_count = 1;
  r.device_type = static_cast<std::uint8_t>(DeviceType::cpu);
  r.device_index = -1;
  r.owner_token = 0x0123456789abcdefULL;
  r.owner_pid = 4242;
  r.segment_seq = 3;
  r.segment_size = 1 << 20;
  r.block_offset = 4096;
  r.storage_offset = storage_offset;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    r.sizes[i] = sizes[i];
    r.strides[i] = strides[i];
  }
  r.block_length = static_cast<std::uint64_t>(reference_extent(r));
  return r;
}

Record matrix() {
  return tensor(DType::float32, {3, 4}, {4, 1});
}

}  // namespace

TEST_CASE("element_size and dtype_name cover every dtype code", "[wire]") {
  struct Expect {
    DType d;
    std::size_t size;
    const char* name;
  };
  const Expect table[] = {
      {DType::uint8, 1, "uint8"},
      {DType::int8, 1, "int8"},
      {DType::int16, 2, "int16"},
      {DType::int32, 4, "int32"},
      {DType::int64, 8, "int64"},
      {DType::float16, 2, "float16"},
      {DType::float32, 4, "float32"},
      {DType::float64, 8, "float64"},
      {DType::complex32, 4, "complex32"},
      {DType::complex64, 8, "complex64"},
      {DType::complex128, 16, "complex128"},
      {DType::bool_, 1, "bool"},
      {DType::bfloat16, 2, "bfloat16"},
      {DType::uint16, 2, "uint16"},
      {DType::uint32, 4, "uint32"},
      {DType::uint64, 8, "uint64"},
      {DType::float8_e5m2, 1, "float8_e5m2"},
      {DType::float8_e4m3fn, 1, "float8_e4m3fn"},
      {DType::float8_e5m2fnuz, 1, "float8_e5m2fnuz"},
      {DType::float8_e4m3fnuz, 1, "float8_e4m3fnuz"},
  };
  for (const auto& e : table) {
    INFO("dtype code " << int(code(e.d)));
    CHECK(element_size(code(e.d)) == e.size);
    CHECK(std::string(dtype_name(code(e.d))) == e.name);
  }
  // Codes are stable on the wire: 1..20 and nothing else.
  int known = 0;
  for (int c = 0; c < 256; ++c) {
    const auto u = static_cast<std::uint8_t>(c);
    if (element_size(u) != 0) {
      ++known;
      CHECK(c >= 1);
      CHECK(c <= 20);
    } else {
      CHECK(std::string(dtype_name(u)) == "unknown");
    }
  }
  CHECK(known == 20);
}

TEST_CASE("make_record sets the header and zeroes everything else", "[wire]") {
  const Record r = make_record();
  CHECK(r.magic == kMagic);
  CHECK(r.version == kVersion);
  Record expected;
  std::memset(&expected, 0, sizeof expected);
  expected.magic = kMagic;
  expected.version = kVersion;
  CHECK(std::memcmp(&r, &expected, sizeof r) == 0);
  // Not a valid tensor yet: it names no dtype.
  CHECK_THAT(validate(r), Contains("dtype"));
}

TEST_CASE("valid records of several shapes pass", "[wire]") {
  SECTION("0-d scalar") {
    Record r = tensor(DType::float64, {}, {});
    CHECK(view_extent_bytes(r) == 8);
    CHECK(validate(r) == "");
  }
  SECTION("scalar view into a larger storage") {
    Record r = tensor(DType::int32, {}, {}, 7);
    CHECK(view_extent_bytes(r) == 32);
    CHECK(validate(r) == "");
  }
  SECTION("contiguous matrix") {
    Record r = matrix();
    CHECK(view_extent_bytes(r) == 48);
    CHECK(validate(r) == "");
  }
  SECTION("empty tensor: any zero size means no bytes, whatever the strides and offset") {
    Record r = tensor(DType::float32, {3, 0, 5}, {0, 5, 1}, 100);
    CHECK(view_extent_bytes(r) == 0);
    CHECK(r.block_length == 0);
    CHECK(validate(r) == "");
    r.strides[0] = kI64Max;
    r.storage_offset = kI64Max;
    CHECK(view_extent_bytes(r) == 0);
    CHECK(validate(r) == "");
  }
  SECTION("non-contiguous transposed view") {
    Record r = tensor(DType::float32, {4, 3}, {1, 4});
    CHECK(view_extent_bytes(r) == 48);
    CHECK(validate(r) == "");
  }
  SECTION("sliced view with a storage_offset") {
    // x = torch.empty(8, 8)[1:3, 2:8:2] -> offset 10, sizes {2, 3}, strides {8, 2}
    Record r = tensor(DType::float32, {2, 3}, {8, 2}, 10);
    CHECK(view_extent_bytes(r) == (10 + 8 + 4 + 1) * 4);
    CHECK(validate(r) == "");
  }
  SECTION("broadcast (stride 0) view") {
    Record r = tensor(DType::int64, {1000, 4}, {0, 1});
    CHECK(view_extent_bytes(r) == 32);
    CHECK(validate(r) == "");
  }
  SECTION("size-1 dims ignore their stride") {
    Record r = tensor(DType::uint8, {1, 5, 1}, {kI64Max, 1, kI64Max});
    CHECK(view_extent_bytes(r) == 5);
    CHECK(validate(r) == "");
  }
  SECTION("all kMaxDims dims") {
    std::vector<std::int64_t> sizes(kMaxDims, 2), strides(kMaxDims);
    std::int64_t s = 1;
    for (int i = kMaxDims - 1; i >= 0; --i, s *= 2) strides[i] = s;
    Record r = tensor(DType::bool_, sizes, strides);
    CHECK(view_extent_bytes(r) == 4096);
    CHECK(validate(r) == "");
  }
  SECTION("every dtype") {
    for (int c = 1; c <= 20; ++c) {
      Record r = tensor(static_cast<DType>(c), {2, 3}, {3, 1});
      INFO("dtype " << dtype_name(r.dtype));
      CHECK(view_extent_bytes(r) == static_cast<std::int64_t>(6 * element_size(r.dtype)));
      CHECK(validate(r) == "");
    }
  }
  SECTION("block_length larger than the view") {
    Record r = matrix();
    r.block_length += 1000;
    CHECK(validate(r) == "");
  }
  SECTION("cpu device_index 0 and -1, cuda device_index >= 0") {
    Record r = matrix();
    r.device_index = 0;
    CHECK(validate(r) == "");
    r.device_type = static_cast<std::uint8_t>(DeviceType::cuda);
    r.segment_seq = 0;  // a CUDA record names an allocation instead
    r.cuda_base = 0x7f0000000000;
    r.event_slot = kNoEvent;  // sync none: its sender's stream was idle
    r.device_index = 3;
    CHECK(validate(r) == "");
    r.device_index = 0;
    CHECK(validate(r) == "");
  }
  SECTION("a tensor in the middle of a message, with kFlagCopied") {
    Record r = matrix();
    r.msg_count = 5;
    r.msg_index = 4;
    r.flags = kFlagCopied;
    CHECK(validate(r) == "");
  }
  SECTION("an empty message, with or without a dtype") {
    Record r = make_record();
    r.flags = kFlagEmptyMessage;
    CHECK(validate(r) == "");
    CHECK(view_extent_bytes(r) == 0);
    r.dtype = code(DType::float32);
    r.storage_offset = 1000;
    CHECK(validate(r) == "");
    CHECK(view_extent_bytes(r) == 0);
  }
}

TEST_CASE("each kind of corruption is rejected with a message naming the field", "[wire]") {
  Record r = matrix();
  REQUIRE(validate(r) == "");

  SECTION("magic") {
    r.magic = 0x12345678;
    CHECK_THAT(validate(r), Contains("magic 0x12345678"));
  }
  SECTION("version, saying which was expected") {
    r.version = 1;  // before the CUDA section
    CHECK_THAT(validate(r), Contains("version 1") && Contains("supported version 4"));
    r.version = 0;
    CHECK_THAT(validate(r), Contains("version 0"));
  }
  SECTION("unknown dtype codes") {
    for (int c : {0, 21, 99, 255}) {
      r.dtype = static_cast<std::uint8_t>(c);
      CHECK(validate(r) == "unknown dtype code " + std::to_string(c));
    }
  }
  SECTION("rank above kMaxDims") {
    r.rank = 13;
    CHECK(validate(r) == "rank 13 exceeds the limit of 12");
    r.rank = 255;
    CHECK_THAT(validate(r), Contains("rank 255"));
  }
  SECTION("unknown flag bits") {
    r.flags = kFlagCopied | (1u << 7);
    CHECK_THAT(validate(r), Contains("flags") && Contains("0x00000080"));
  }
  SECTION("msg_index not below msg_count") {
    r.msg_count = 3;
    r.msg_index = 3;
    CHECK_THAT(validate(r), Contains("msg_index 3") && Contains("msg_count 3"));
  }
  SECTION("msg_count 0 without kFlagEmptyMessage") {
    r.msg_count = 0;
    r.msg_index = 0;
    CHECK_THAT(validate(r), Contains("msg_count is 0"));
  }
  SECTION("kFlagEmptyMessage with tensors, an index or a rank") {
    r.flags = kFlagEmptyMessage;
    CHECK_THAT(validate(r), Contains("msg_count 1") && Contains("kFlagEmptyMessage"));
    r.msg_count = 0;
    r.msg_index = 2;
    CHECK_THAT(validate(r), Contains("msg_index 2") && Contains("kFlagEmptyMessage"));
    r.msg_index = 0;
    CHECK_THAT(validate(r), Contains("rank 2") && Contains("kFlagEmptyMessage"));
    // Only code 0 is excused; a corrupt code is still corrupt.
    r.rank = 0;
    r.sizes[0] = r.sizes[1] = r.strides[0] = r.strides[1] = 0;
    r.dtype = 99;
    CHECK(validate(r) == "unknown dtype code 99");
    r.dtype = 0;
    CHECK(validate(r) == "");
  }
  SECTION("unknown device_type") {
    r.device_type = 7;
    CHECK_THAT(validate(r), Contains("device_type 7"));
  }
  SECTION("cpu device_index other than -1 or 0") {
    r.device_index = 1;
    CHECK_THAT(validate(r), Contains("device_index 1") && Contains("cpu"));
    r.device_index = -2;
    CHECK_THAT(validate(r), Contains("device_index -2"));
  }
  SECTION("negative cuda device_index") {
    r.device_type = static_cast<std::uint8_t>(DeviceType::cuda);
    r.device_index = -1;
    CHECK_THAT(validate(r), Contains("device_index -1") && Contains("cuda"));
  }
  SECTION("negative size") {
    r.sizes[1] = -1;
    CHECK(validate(r) == "sizes[1] is -1");
  }
  SECTION("negative stride") {
    r.strides[0] = -4;
    CHECK(validate(r) == "strides[0] is -4");
  }
  SECTION("negative storage_offset") {
    r.storage_offset = -1;
    CHECK(validate(r) == "storage_offset is -1");
  }
  SECTION("unused sizes and strides beyond rank must be zero") {
    r.sizes[2] = 7;
    CHECK_THAT(validate(r), Contains("sizes[2] is 7") && Contains("rank 2"));
    r.sizes[2] = 0;
    r.strides[kMaxDims - 1] = 1;
    CHECK_THAT(validate(r), Contains("strides[11] is 1"));
    r.strides[kMaxDims - 1] = 0;
    // Negative leftovers are reported as leftovers, not as bad dims.
    r.sizes[5] = -1;
    CHECK_THAT(validate(r), Contains("sizes[5] is -1") && Contains("unused"));
  }
  SECTION("extent one byte past block_length") {
    r.block_length -= 1;
    CHECK(validate(r) == "view extent of 48 bytes exceeds block_length 47");
  }
  SECTION("storage_offset pushes the view out of the block") {
    r.storage_offset = 1;
    CHECK_THAT(validate(r), Contains("view extent of 52") && Contains("block_length 48"));
  }
  SECTION("a larger stride pushes the view out of the block") {
    r.strides[0] = 5;
    CHECK_THAT(validate(r), Contains("exceeds block_length"));
  }
}

TEST_CASE("cuda records: the CUDA section is checked, and must be zero elsewhere", "[wire]") {
  Record r = matrix();
  r.device_type = static_cast<std::uint8_t>(DeviceType::cuda);
  r.device_index = 0;
  r.cuda_base = 0x7f0000000000;
  r.cuda_buffer_id = 42;
  r.sync = kSyncEvent;
  r.event_slot = 3;
  r.event_handle[0] = 0x22;
  r.segment_seq = 0;
  REQUIRE(validate(r) == "");

  SECTION("no allocation address") {
    r.cuda_base = 0;
    CHECK(validate(r) == "cuda_base is 0 on a cuda record");
  }
  SECTION("a segment number, which only cpu records use") {
    r.segment_seq = 4;
    CHECK_THAT(validate(r), Contains("segment_seq 4"));
  }
  SECTION("staged and empty-message flags belong to cpu records") {
    r.flags = kFlagToDevice;
    CHECK_THAT(validate(r), Contains("on a cuda record"));
  }
  SECTION("reserved bits") {
    r.sync_reserved[1] = 1;
    CHECK(validate(r) == "sync_reserved is not zero");
  }
  SECTION("each way of waiting names what its receiver uses, and nothing else") {
    r.flag_value = 5;
    CHECK_THAT(validate(r), Contains("flag_value 5 on a sync event record"));
    r.flag_value = 0;
    r.event_slot = kNoEvent;
    CHECK(validate(r) == "sync event without an event slot");
    for (std::uint8_t nothing : {kSyncNone, kSyncSynced}) {
      r.sync = nothing;
      r.event_slot = kNoEvent;
      r.event_handle[0] = 0;
      CHECK(validate(r) == "");
      r.event_slot = 2;
      CHECK_THAT(validate(r), Contains("nothing to wait on"));
      r.event_slot = kNoEvent;
      r.flag_value = 1;
      CHECK_THAT(validate(r), Contains("nothing to wait on"));
      r.flag_value = 0;
    }
    r.sync = kSyncMemop;
    r.event_slot = 17;
    r.flag_value = 9;
    r.event_handle[0] = 0x33;  // the flag buffer's handle
    CHECK(validate(r) == "");
    r.event_slot = kFlagSlots;
    CHECK_THAT(validate(r), Contains("beyond the 4096"));
    r.event_slot = 17;
    r.flag_value = 0;
    CHECK_THAT(validate(r), Contains("flag_value 0 on a memop record"));
    r.flag_value = 9;
    r.event_handle[0] = 0;
    CHECK(validate(r) == "a memop record without its flag buffer's handle");
    r.sync = 4;
    CHECK_THAT(validate(r), Contains("unknown sync 4"));
  }
  SECTION("a cpu record says nothing of how to wait") {
    Record c = matrix();
    c.sync = kSyncMemop;
    CHECK(validate(c) == "CUDA section is not zero in a cpu record");
    c.sync = 0;
    c.flag_value = 1;
    CHECK(validate(c) == "CUDA section is not zero in a cpu record");
  }
  SECTION("passed by fd: the segment number names a bundle, and no IPC handle is set") {
    r.flags = kFlagByFd;
    r.segment_seq = 0x80000002u;
    CHECK(validate(r) == "");
    r.segment_seq = 4;
    CHECK_THAT(validate(r), Contains("expected a bundle"));
    r.segment_seq = 0x80000002u;
    r.mem_handle[0] = 1;
    CHECK(validate(r) == "mem_handle is set on a cuda record passed by fd");
    Record c = matrix();
    c.flags = kFlagByFd;
    CHECK_THAT(validate(c), Contains("pass a cpu record by fd"));
  }
  SECTION("a cpu record with any CUDA byte set") {
    Record c = matrix();
    c.mem_handle[63] = 1;
    CHECK(validate(c) == "CUDA section is not zero in a cpu record");
    c = matrix();
    c.owner_boot_id[0] = 1;
    CHECK(validate(c) == "CUDA section is not zero in a cpu record");
  }
  SECTION("a staged cuda tensor names its device; a plain cpu one may not") {
    Record c = matrix();
    c.flags = kFlagToDevice;
    c.device_index = 3;
    CHECK(validate(c) == "");
    c.device_index = -1;
    CHECK_THAT(validate(c), Contains("staged to a cuda device"));
    c.flags = 0;
    c.device_index = 3;
    CHECK_THAT(validate(c), Contains("expected -1 or 0"));
  }
  SECTION("the opened allocation bounds the view like a segment does") {
    r.segment_size = 4096;
    r.block_offset = 4000;
    r.block_length = 200;
    CHECK_THAT(validate_location(r, 4096), Contains("exceeds the mapped size 4096"));
    CHECK_THAT(validate_location(r, 8192), Contains("does not match the mapped size"));
  }
}

namespace {

// A valid inline record: the bytes in the record, no owner, segment, block or lease.
Record inline_record(DType dtype, std::vector<std::int64_t> sizes,
                     std::vector<std::int64_t> strides) {
  Record r = tensor(dtype, std::move(sizes), std::move(strides));
  r.flags = kFlagInline | kFlagCopied;
  r.owner_token = 0;
  r.owner_pid = 0;
  r.segment_seq = 0;
  r.segment_size = 0;
  r.block_offset = 0;
  return r;
}

}  // namespace

TEST_CASE("inline records: the bytes in the record, nothing named elsewhere", "[wire]") {
  STATIC_REQUIRE(kInlineBytes >= 128);  // an envelope and an empty task's pickled result fit
  STATIC_REQUIRE(kInlineOffset + kInlineBytes == sizeof(Record));
  Record r = inline_record(DType::int64, {9}, {1});
  REQUIRE(validate(r) == "");
  CHECK(validate(inline_record(DType::uint8, {static_cast<std::int64_t>(kInlineBytes)}, {1})) ==
        "");
  CHECK(validate(inline_record(DType::float32, {2, 3, 1}, {3, 1, 7})) == "");  // a 1-dim's stride
  CHECK(validate(inline_record(DType::float32, {}, {})) == "");                // a scalar
  CHECK(validate(inline_record(DType::float32, {3, 0, 2}, {2, 2, 1})) == "");  // empty
  SECTION("the bytes live where the CUDA section is, so it may be anything") {
    std::memset(inline_bytes(r), 0xab, kInlineBytes);
    CHECK(validate(r) == "");
  }
  SECTION("more bytes than the record has") {
    Record big = inline_record(DType::uint8, {static_cast<std::int64_t>(kInlineBytes) + 1}, {1});
    CHECK_THAT(validate(big), Contains("exceeds its " + std::to_string(kInlineBytes) + " bytes"));
  }
  SECTION("an owner, a segment, a block or a lease") {
    r.owner_pid = 1;
    CHECK_THAT(validate(r), Contains("names an owner, segment, block or lease"));
    r = inline_record(DType::int64, {9}, {1});
    r.lease_gen = 1;
    CHECK_THAT(validate(r), Contains("names an owner, segment, block or lease"));
  }
  SECTION("a view that is not contiguous from the start") {
    CHECK_THAT(validate(inline_record(DType::int32, {3, 2}, {1, 3})),
               Contains("must be contiguous"));
    Record off = inline_record(DType::int32, {4}, {1});
    off.storage_offset = 1;
    off.block_length = 20;
    CHECK_THAT(validate(off), Contains("storage_offset 1 of an inline record"));
    Record slack = inline_record(DType::int32, {4}, {1});
    slack.block_length = 20;
    CHECK_THAT(validate(slack), Contains("is not the inline block_length 20"));
  }
  SECTION("other flags, and a cuda device") {
    r.flags |= kFlagToDevice;
    r.device_index = 0;
    CHECK_THAT(validate(r), Contains("on an inline record"));
    Record c = inline_record(DType::int64, {9}, {1});
    c.device_type = static_cast<std::uint8_t>(DeviceType::cuda);
    c.device_index = 0;
    CHECK_THAT(validate(c), Contains("inline are cpu records"));
  }
}

TEST_CASE("overflowing views are rejected without undefined behaviour", "[wire]") {
  Record r = matrix();
  r.block_length = kU64Max;

  SECTION("size near INT64_MAX times a stride") {
    r.sizes[0] = kI64Max;
    r.strides[0] = 2;
    CHECK(view_extent_bytes(r) == -1);
    CHECK_THAT(validate(r), Contains("overflows"));
  }
  SECTION("huge stride") {
    r.strides[0] = kI64Max;
    CHECK(view_extent_bytes(r) == -1);
    CHECK_THAT(validate(r), Contains("overflows"));
  }
  SECTION("sum of in-range dim spans overflows") {
    r.sizes[0] = 2;
    r.strides[0] = kI64Max / 2 + 1;
    r.sizes[1] = 2;
    r.strides[1] = kI64Max / 2 + 1;
    CHECK(view_extent_bytes(r) == -1);
    CHECK_THAT(validate(r), Contains("overflows"));
  }
  SECTION("storage_offset plus span overflows") {
    r.storage_offset = kI64Max - 10;
    CHECK(view_extent_bytes(r) == -1);
    CHECK_THAT(validate(r), Contains("overflows"));
  }
  SECTION("the +1 overflows") {
    r.rank = 0;
    r.sizes[0] = r.sizes[1] = r.strides[0] = r.strides[1] = 0;
    r.storage_offset = kI64Max;
    CHECK(view_extent_bytes(r) == -1);
    CHECK_THAT(validate(r), Contains("overflows"));
  }
  SECTION("element count fits but bytes do not") {
    r.dtype = code(DType::complex128);
    r.sizes[0] = 1;
    r.sizes[1] = kI64Max / 16 + 1;
    r.strides[1] = 1;
    CHECK(view_extent_bytes(r) == -1);
    CHECK_THAT(validate(r), Contains("overflows"));
  }
  SECTION("largest extent that fits is accepted") {
    r.dtype = code(DType::uint8);
    r.rank = 1;
    r.sizes[1] = r.strides[1] = 0;
    r.sizes[0] = kI64Max;
    r.strides[0] = 1;
    CHECK(view_extent_bytes(r) == kI64Max);
    CHECK(validate(r) == "");
    r.block_length = static_cast<std::uint64_t>(kI64Max) - 1;
    CHECK_THAT(validate(r), Contains("exceeds block_length"));
  }
  SECTION("view_extent_bytes is total on out-of-range fields") {
    r.rank = 200;
    CHECK(view_extent_bytes(r) == -1);
    r.rank = 2;
    r.sizes[0] = -3;
    CHECK(view_extent_bytes(r) == -1);
    r.sizes[0] = 3;
    r.strides[1] = std::numeric_limits<std::int64_t>::min();
    CHECK(view_extent_bytes(r) == -1);
    r.strides[1] = 1;
    r.storage_offset = std::numeric_limits<std::int64_t>::min();
    CHECK(view_extent_bytes(r) == -1);
  }
}

TEST_CASE("validate_location checks the block against the mapped segment", "[wire]") {
  Record r = matrix();  // segment 1 MiB, block [4096, 4096 + 48)
  const std::size_t mapped = r.segment_size;
  CHECK(validate_location(r, mapped) == "");

  SECTION("segment_size must equal the mapped size") {
    CHECK_THAT(validate_location(r, mapped * 2),
               Contains("segment_size 1048576") && Contains("2097152"));
    CHECK_THAT(validate_location(r, 0), Contains("segment_size"));
  }
  SECTION("block ending exactly at the end of the segment") {
    r.block_offset = mapped - r.block_length;
    CHECK(validate_location(r, mapped) == "");
    r.block_offset += 1;
    CHECK_THAT(validate_location(r, mapped),
               Contains("block_offset") && Contains("exceeds the mapped size 1048576"));
  }
  SECTION("block starting past the end") {
    r.block_offset = mapped + 1;
    r.block_length = 0;
    CHECK_THAT(validate_location(r, mapped), Contains("exceeds the mapped size"));
  }
  SECTION("block_offset near UINT64_MAX overflows") {
    r.block_offset = kU64Max - 10;
    CHECK_THAT(validate_location(r, mapped), Contains("block_offset") && Contains("overflows"));
    r.block_offset = 1;
    r.block_length = kU64Max;
    CHECK_THAT(validate_location(r, mapped), Contains("overflows"));
  }
  SECTION("block_length larger than the segment") {
    r.block_offset = 0;
    r.block_length = mapped + 1;
    CHECK_THAT(validate_location(r, mapped), Contains("exceeds the mapped size"));
  }
}

TEST_CASE("view_extent_bytes agrees with a 128-bit reference", "[wire]") {
  std::mt19937_64 rng(12345);
  // Magnitudes from tiny to near INT64_MAX so both the fitting and overflowing paths are hit.
  auto value = [&rng]() -> std::int64_t {
    const int bits = static_cast<int>(rng() % 64);
    return bits == 0 ? 0 : static_cast<std::int64_t>(rng() >> (64 - bits));
  };
  int fit = 0, overflowed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    Record r = make_record();
    r.dtype = static_cast<std::uint8_t>(1 + rng() % 20);
    r.rank = static_cast<std::uint8_t>(rng() % (kMaxDims + 1));
    r.storage_offset = value();
    for (int i = 0; i < r.rank; ++i) {
      r.sizes[i] = 1 + value();
      r.strides[i] = value();
    }
    const std::int64_t want = reference_extent(r);
    const std::int64_t got = view_extent_bytes(r);
    if (got != want) FAIL_CHECK("iteration " << iter << ": got " << got << ", want " << want);
    (want < 0 ? overflowed : fit) += 1;
  }
  CHECK(fit > 1000);
  CHECK(overflowed > 1000);
}

TEST_CASE("random byte flips never make validate accept an out-of-block view", "[wire]") {
  const std::vector<Record> bases = {
      matrix(),
      tensor(DType::float64, {}, {}),
      tensor(DType::float32, {4, 3}, {1, 4}),
      tensor(DType::int16, {2, 3}, {8, 2}, 10),
      tensor(DType::complex128, {2, 1, 3, 2}, {6, 6, 2, 1}),
      tensor(DType::uint8, {5, 0, 2}, {2, 1, 1}),
  };
  std::mt19937_64 rng(20240601);
  int accepted = 0, bad = 0;
  for (int iter = 0; iter < 100000; ++iter) {
    Record r = bases[rng() % bases.size()];
    auto* bytes = reinterpret_cast<unsigned char*>(&r);
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const std::size_t at = rng() % sizeof r;
      // Half single-bit flips, half whole-byte rewrites (which reach 0x7f.. and 0xff..).
      if (rng() & 1) {
        bytes[at] ^= static_cast<unsigned char>(1u << (rng() % 8));
      } else {
        bytes[at] = static_cast<unsigned char>(rng());
      }
    }
    if (!validate(r).empty()) continue;
    ++accepted;
    const std::int64_t extent = view_extent_bytes(r);
    if (extent < 0 || static_cast<std::uint64_t>(extent) > r.block_length ||
        extent != reference_extent(r)) {
      if (++bad <= 5) {
        FAIL_CHECK("iteration " << iter << ": accepted extent " << extent << " with block_length "
                                << r.block_length);
      }
    }
  }
  CHECK(bad == 0);
  // Flips of owner/lease/location fields keep the record valid; make sure those were exercised.
  CHECK(accepted > 1000);
}
