// choose_input_sharing(): whether `ferry run --input` moves its inputs into shared memory once,
// one case each.
#include "tools/input_sharing.hpp"

#include "../catch.hpp"

using ferry::tools::choose_input_sharing;
using ferry::tools::kSharedInputBytes;

TEST_CASE("input sharing: inputs that fit the budget are moved once", "[tools]") {
  for (std::uint64_t bytes : {std::uint64_t{1}, std::uint64_t{50176}, kSharedInputBytes}) {
    const auto c = choose_input_sharing(bytes, false);
    CHECK(c.share);
    CHECK_THAT(c.why, Catch::Contains(std::to_string(bytes) + " bytes"));
  }
}

TEST_CASE("input sharing: inputs beyond the budget are copied on each send", "[tools]") {
  const auto c = choose_input_sharing(kSharedInputBytes + 1, false);
  CHECK_FALSE(c.share);
  CHECK_THAT(c.why, Catch::Contains("copied into it on each send"));
  CHECK_THAT(c.why, Catch::Contains(std::to_string(kSharedInputBytes) + " bytes"));
}

TEST_CASE("input sharing: inputs staged on a CUDA device stay where they are", "[tools]") {
  const auto c = choose_input_sharing(1024, true);
  CHECK_FALSE(c.share);
  CHECK_THAT(c.why, Catch::Contains("CUDA device"));
}

TEST_CASE("input sharing: nothing to move when every storage fits a record", "[tools]") {
  const auto c = choose_input_sharing(0, false);
  CHECK_FALSE(c.share);
  CHECK_THAT(c.why, Catch::Contains("wire record"));
}
