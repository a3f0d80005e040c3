// Writes the wire fuzzer's seed corpus: valid records (each followed by its 8-byte mapped size)
// so libFuzzer starts from inputs that pass both validators and mutates the fields that matter,
// instead of spending its time rediscovering the magic number. Generated at build time rather
// than checked in so the seeds always match the current Record layout.
//
//   make_seeds OUT_DIR
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "ipc/wire.hpp"

using namespace ferry::wire;

namespace {

Record view(DType dtype, std::initializer_list<std::int64_t> sizes,
            std::initializer_list<std::int64_t> strides, std::int64_t storage_offset,
            std::uint64_t slack) {
  Record r = make_record();
  r.dtype = static_cast<std::uint8_t>(dtype);
  r.rank = static_cast<std::uint8_t>(sizes.size());
  r.msg_count = 1;
  r.device_index = -1;
  r.owner_token = 0x5eed5eed5eed5eedULL;
  r.owner_pid = 1234;
  r.segment_seq = 1;
  r.lease_slot = 7;
  r.lease_gen = 1;
  r.storage_offset = storage_offset;
  int i = 0;
  for (std::int64_t s : sizes) r.sizes[i++] = s;
  i = 0;
  for (std::int64_t s : strides) r.strides[i++] = s;
  r.block_length = static_cast<std::uint64_t>(view_extent_bytes(r)) + slack;
  r.block_offset = 4096;
  r.segment_size = r.block_offset + r.block_length + 512;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  std::vector<std::pair<std::string, Record>> seeds = {
      {"scalar", view(DType::float64, {}, {}, 0, 0)},
      {"matrix", view(DType::float32, {3, 4}, {4, 1}, 0, 0)},
      {"transposed", view(DType::float32, {4, 3}, {1, 4}, 0, 0)},
      {"sliced", view(DType::int16, {2, 3}, {8, 2}, 10, 16)},
      {"empty_tensor", view(DType::uint8, {5, 0, 2}, {2, 2, 1}, 3, 0)},
      {"broadcast", view(DType::complex128, {100, 2}, {0, 1}, 0, 0)},
      {"max_rank", view(DType::bfloat16, {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2},
                        {2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1}, 0, 0)},
  };
  Record cuda = view(DType::float8_e4m3fn, {16}, {1}, 0, 0);
  cuda.device_type = static_cast<std::uint8_t>(DeviceType::cuda);
  cuda.device_index = 1;
  cuda.device_uuid[0] = 0xab;
  cuda.msg_count = 3;
  cuda.msg_index = 2;
  cuda.flags = kFlagCopied;
  cuda.segment_seq = 0;  // a CUDA record names an allocation, not a segment
  cuda.cuda_base = 0x7f0000000000;
  cuda.cuda_buffer_id = 7;
  cuda.mem_handle[0] = 0x11;
  cuda.event_handle[0] = 0x22;
  cuda.event_slot = 5;
  cuda.sync = kSyncEvent;
  cuda.owner_pid_ns = 4026531836;
  cuda.owner_boot_id[15] = 0x33;
  seeds.emplace_back("cuda", cuda);
  Record memop = cuda;  // ordered by the owner's flag: slot 9 reaches 41 after the last write
  memop.sync = kSyncMemop;
  memop.event_slot = 9;
  memop.flag_value = 41;
  seeds.emplace_back("cuda_memop", memop);
  Record idle = cuda;  // the owner's stream was idle: nothing to wait on
  idle.sync = kSyncNone;
  idle.event_slot = kNoEvent;
  std::fill(std::begin(idle.event_handle), std::end(idle.event_handle), 0);
  seeds.emplace_back("cuda_idle", idle);
  Record staged = view(DType::float32, {4}, {1}, 0, 0);
  staged.flags = kFlagCopied | kFlagToDevice;
  staged.device_index = 0;
  staged.device_uuid[0] = 0xab;
  seeds.emplace_back("cuda_staged", staged);
  Record none = make_record();
  none.flags = kFlagEmptyMessage;
  none.segment_size = 4096;
  seeds.emplace_back("empty_message", none);
  Record small = make_record();  // its bytes in the record: no owner, segment, block or lease
  small.dtype = static_cast<std::uint8_t>(DType::int64);
  small.rank = 2;
  small.msg_count = 1;
  small.device_index = -1;
  small.flags = kFlagInline | kFlagCopied;
  small.sizes[0] = 2;
  small.sizes[1] = 3;
  small.strides[0] = 3;
  small.strides[1] = 1;
  small.block_length = 48;
  inline_bytes(small)[0] = 0x5e;
  seeds.emplace_back("inline", small);

  for (const auto& [name, r] : seeds) {
    // An inline record names no segment, so no location is checked for it.
    const bool located = (r.flags & kFlagInline) || validate_location(r, r.segment_size).empty();
    if (!validate(r).empty() || !located) {
      std::fprintf(stderr, "make_seeds: seed %s is invalid: %s%s\n", name.c_str(),
                   validate(r).c_str(), validate_location(r, r.segment_size).c_str());
      return 1;
    }
    const std::string path = std::string(argv[1]) + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    const std::uint64_t mapped = r.segment_size;
    if (!f || std::fwrite(&r, sizeof r, 1, f) != 1 ||
        std::fwrite(&mapped, sizeof mapped, 1, f) != 1 || std::fclose(f) != 0) {
      std::perror(path.c_str());
      return 1;
    }
  }
  return 0;
}
