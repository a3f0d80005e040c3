// ferry::version(): the version of the ferry library a program has loaded. One value, set by
// project() in the top-level CMakeLists.txt, is what `ferry --version`, ferry.__version__, the
// Python package's metadata and find_package(ferry) all report.
#pragma once

namespace ferry {

// "MAJOR.MINOR.PATCH" of the libferry_ipc this process loaded (not of the headers it compiled).
const char* version() noexcept;

}  // namespace ferry
