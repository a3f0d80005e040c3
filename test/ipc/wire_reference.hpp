// The wire decoder's extent contract, recomputed independently in 128-bit arithmetic: the
// oracle both the unit tests and the fuzzer compare view_extent_bytes() against.
#pragma once

#include <cstdint>
#include <limits>

#include "ipc/wire.hpp"

namespace ferry::wire::test {

// Bytes from the storage start to one past the view's last element (0 for an empty tensor or
// an empty message), or -1 where an intermediate or the byte count does not fit in int64.
// Valid for records whose per-field checks passed (non-negative sizes, strides and offset).
inline std::int64_t reference_extent(const Record& r) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  if (r.flags & kFlagEmptyMessage) return 0;
  for (int i = 0; i < r.rank; ++i) {
    if (r.sizes[i] == 0) return 0;
  }
  __int128 last = r.storage_offset;
  for (int i = 0; i < r.rank; ++i) {
    // Each term is below 2^126; checking after every add keeps the sum below 2^127.
    last += static_cast<__int128>(r.sizes[i] - 1) * r.strides[i];
    if (last > kMax) return -1;
  }
  if (last + 1 > kMax) return -1;
  const __int128 bytes = (last + 1) * static_cast<__int128>(element_size(r.dtype));
  return bytes > kMax ? -1 : static_cast<std::int64_t>(bytes);
}

}  // namespace ferry::wire::test
