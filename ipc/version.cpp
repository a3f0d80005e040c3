#include "ipc/version.hpp"

namespace ferry {

// FERRY_VERSION comes from ipc/CMakeLists.txt, for this source alone: a new version rebuilds one
// file, not the project.
const char* version() noexcept {
  return FERRY_VERSION;
}

}  // namespace ferry
