// The suite's one way into Catch2, whichever major version the system has: Debian 12 ships 2.x
// (one header, catch2/catch.hpp), Debian forky and trixie 3.x (catch2/catch_all.hpp), which
// renamed the string matcher Contains to ContainsSubstring and moved Approx into namespace Catch.
// The tests spell them as 2.x does: Catch::Contains, Catch::StartsWith, Catch::EndsWith, Approx.
// The major version is the one CMake found and links (FERRY_CATCH2_MAJOR, test/CMakeLists.txt):
// where both are installed, 2.x's header must not win over the 3.x library, or nothing links.
#pragma once

#if defined(FERRY_CATCH2_MAJOR)
#define FERRY_CATCH2_IS_2 (FERRY_CATCH2_MAJOR < 3)
#elif __has_include(<catch2/catch.hpp>)
#define FERRY_CATCH2_IS_2 1
#else
#define FERRY_CATCH2_IS_2 0
#endif

#if FERRY_CATCH2_IS_2
#include <catch2/catch.hpp>
#else
#include <catch2/catch_all.hpp>

#include <string>

namespace Catch {
// 3.x's Matchers::Contains matches a range's elements, not a substring.
inline Matchers::StringContainsMatcher Contains(const std::string& text,
                                                CaseSensitive cs = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(text, cs);
}
using Matchers::EndsWith;
using Matchers::StartsWith;
}  // namespace Catch

using Catch::Approx;
#endif
