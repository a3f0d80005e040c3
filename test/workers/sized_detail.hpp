// The detail the test task fail_with_sized_detail fails with: n bytes a test can check whole,
// shared by that task (in the worker) and the pool tests (in the caller).
#pragma once

#include <cstddef>
#include <string>

namespace ferry::test {

inline std::string sized_detail(std::size_t n) {
  std::string d(n, '\0');
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<char>(i % 251);
  return d;
}

}  // namespace ferry::test
