// libFuzzer target for the wire decoder. It checks the decoder's promise, not only that it does
// not crash: a record both validators accept describes a view that lies inside its block, and a
// block that lies inside the mapped segment, so a receiver that trusts it reads nothing else.
//
// Input: the first sizeof(Record) bytes are the record (zero-filled when shorter); the next 8
// bytes, when present, are the receiver's mapped size. Without them the mapped size is the
// record's own segment_size, so short inputs still reach the checks past validate_location().
// Built and run by test/CMakeLists.txt (ctest -R wire_fuzz); seeds: test/ipc/wire_corpus/.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "ipc/wire.hpp"
#include "wire_reference.hpp"

using namespace ferry::wire;

using ferry::wire::test::reference_extent;

namespace {

static_assert(sizeof(std::size_t) == 8, "the mapped size is read as 8 bytes");

// abort() rather than assert(): the check must hold in every build, NDEBUG or not.
[[noreturn]] void broken(const char* what, const Record& r, std::size_t mapped,
                         std::int64_t extent) {
  std::fprintf(stderr,
               "wire_fuzz: %s\n  rank %u dtype %u storage_offset %lld extent %lld\n"
               "  block_offset %llu block_length %llu segment_size %llu mapped %zu\n",
               what, unsigned{r.rank}, unsigned{r.dtype}, static_cast<long long>(r.storage_offset),
               static_cast<long long>(extent), static_cast<unsigned long long>(r.block_offset),
               static_cast<unsigned long long>(r.block_length),
               static_cast<unsigned long long>(r.segment_size), mapped);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Record r;
  std::memset(&r, 0, sizeof r);
  std::memcpy(&r, data, size < sizeof r ? size : sizeof r);
  std::size_t mapped = r.segment_size;
  if (size >= sizeof r + sizeof mapped) std::memcpy(&mapped, data + sizeof r, sizeof mapped);

  const std::string fields = validate(r);
  const std::string location = validate_location(r, mapped);
  const std::int64_t extent = view_extent_bytes(r);

  if (!fields.empty()) return 0;
  if (extent < 0) broken("validate() accepted a view whose extent overflows", r, mapped, extent);
  if (static_cast<std::uint64_t>(extent) > r.block_length) {
    broken("validate() accepted a view larger than block_length", r, mapped, extent);
  }
  if (extent != reference_extent(r)) {
    broken("view_extent_bytes() disagrees with the 128-bit reference", r, mapped, extent);
  }
  // An inline record's receiver reads its bytes from the record, and nothing past it.
  if ((r.flags & ferry::wire::kFlagInline) && r.block_length > ferry::wire::kInlineBytes) {
    broken("validate() accepted an inline record longer than the record", r, mapped, extent);
  }
  if (!location.empty()) return 0;
  if (r.segment_size != mapped) broken("segment_size differs from mapped", r, mapped, extent);
  if (r.block_offset > mapped || r.block_length > mapped - r.block_offset) {
    broken("validate_location() accepted a block past the mapped size", r, mapped, extent);
  }
  return 0;
}
