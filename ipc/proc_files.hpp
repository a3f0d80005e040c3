// Small reads of /proc and /sys, for the diagnostics and the memory headroom: a whole file, a
// number, whether a path exists.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ferry::proc {

// The whole of a small /proc or /sys file; nullopt, with errno set, when it cannot be read.
std::optional<std::string> slurp(const std::string& path);
// The number a file starts with; nullopt when it cannot be read or holds none.
std::optional<std::uint64_t> read_u64(const std::string& path);
// Whether `path` exists (stat succeeds).
bool exists(const std::string& path);

}  // namespace ferry::proc
