// The suite's one way into Catch2, whichever major version the system has: Debian 12 ships 2.x
// (one header, catch2/catch.hpp), Debian forky and trixie 3.x (catch2/catch_all.hpp), which
// renamed the string matcher Contains to ContainsSubstring and moved Approx into namespace Catch.
// The tests spell them as 2.x does: Catch::Contains, Catch::StartsWith, Catch::EndsWith, Approx.
#pragma once

#if __has_include(<catch2/catch.hpp>)
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
