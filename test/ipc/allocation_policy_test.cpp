// Where a CPU allocation goes while shared allocations are on: one case per rule of
// place_allocation(), first match wins.
#include "../catch.hpp"

#include <cstdint>
#include <cstdlib>

#include "ipc/allocation_policy.hpp"
#include "ipc/error.hpp"

using ferry::AllocationRule;
using ferry::place_allocation;
using ferry::Placement;

namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

AllocationRule rule() {
  AllocationRule r;
  r.on = true;
  r.threshold = 64 * kKiB;
  r.segment_size = 64 * kMiB;
  r.max_reserved = 2 * kGiB;
  return r;
}

}  // namespace

TEST_CASE("allocation policy: off, every allocation is LibTorch's") {
  AllocationRule r = rule();
  r.on = false;
  CHECK(place_allocation(64 * kMiB, 0, r) == Placement::heap);
  CHECK(place_allocation(64 * kKiB, 0, r) == Placement::heap);
}

TEST_CASE("allocation policy: under the threshold stays on the heap, from it goes to the arena") {
  const AllocationRule r = rule();
  CHECK(place_allocation(0, 0, r) == Placement::heap);
  CHECK(place_allocation(64 * kKiB - 1, 0, r) == Placement::heap);
  CHECK(place_allocation(64 * kKiB, 0, r) == Placement::arena);
  CHECK(place_allocation(64 * kMiB, 0, r) == Placement::arena);
}

TEST_CASE("allocation policy: after a refused segment, free blocks only") {
  AllocationRule r = rule();
  r.growth_refused_lately = true;
  CHECK(place_allocation(1 * kMiB, 0, r) == Placement::arena_without_growing);
  // A small tensor is still the heap's: nothing about it changed.
  CHECK(place_allocation(kKiB, 0, r) == Placement::heap);
}

TEST_CASE("allocation policy: growth past the maximum takes free blocks only") {
  AllocationRule r = rule();
  r.max_reserved = 128 * kMiB;
  // One more segment fits exactly; a second does not.
  CHECK(place_allocation(1 * kMiB, 64 * kMiB, r) == Placement::arena);
  CHECK(place_allocation(1 * kMiB, 128 * kMiB, r) == Placement::arena_without_growing);
  // An allocation larger than a segment grows by itself, rounded to pages.
  CHECK(place_allocation(64 * kMiB + 1, 64 * kMiB, r) == Placement::arena_without_growing);
  CHECK(place_allocation(64 * kMiB + 1, 0, r) == Placement::arena);
  // Already past it (the maximum lowered, or explicit empty_shared growth): no more growth.
  CHECK(place_allocation(1 * kMiB, 256 * kMiB, r) == Placement::arena_without_growing);
  // A maximum of 0: the arena is used only as far as it is already there.
  r.max_reserved = 0;
  CHECK(place_allocation(1 * kMiB, 0, r) == Placement::arena_without_growing);
}

TEST_CASE("allocation policy: a segment's growth is the segment size or the allocation in pages") {
  CHECK(ferry::growth_for(1, 64 * kMiB) == 64 * kMiB);
  CHECK(ferry::growth_for(64 * kMiB, 64 * kMiB) == 64 * kMiB);
  CHECK(ferry::growth_for(64 * kMiB + 1, 64 * kMiB) == 64 * kMiB + 4096);
}

TEST_CASE(
    "allocation policy: FERRY_SHARED_ALLOCATIONS_MAX sets the maximum, a bad value is named") {
  const char* old = std::getenv("FERRY_SHARED_ALLOCATIONS_MAX");
  ::unsetenv("FERRY_SHARED_ALLOCATIONS_MAX");
  CHECK(ferry::shared_allocations_max_from_env() == ferry::kDefaultSharedAllocationsMax);
  ::setenv("FERRY_SHARED_ALLOCATIONS_MAX", "512M", 1);
  CHECK(ferry::shared_allocations_max_from_env() == 512 * kMiB);
  ::setenv("FERRY_SHARED_ALLOCATIONS_MAX", "lots", 1);
  try {
    ferry::shared_allocations_max_from_env();
    FAIL("a bad value was taken");
  } catch (const ferry::Error& e) {
    CHECK(e.code() == ferry::Errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("FERRY_SHARED_ALLOCATIONS_MAX"));
  }
  if (old) {
    ::setenv("FERRY_SHARED_ALLOCATIONS_MAX", old, 1);
  } else {
    ::unsetenv("FERRY_SHARED_ALLOCATIONS_MAX");
  }
}
