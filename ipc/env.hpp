// The one reader of ferry's environment variables (FERRY_*; the table is docs/environment.md).
//
// Each call returns `fallback` when the variable is unset or empty. A set value is either read
// whole, in one of the accepted forms and inside the range, or refused with
// Error(invalid_argument) whose message names the variable, its value, what is accepted and the
// default: "2s" is never 2 ms, "-5" never a wait without end, "lots" never zero.
//
// A bare number means the unit the name ends in: `..._MS` milliseconds, `..._KB`/`_MB`/`_GB`
// KiB/MiB/GiB. A value with a unit is read in that unit. Read a variable where a throw reaches the
// user as an Error (an API call, a tool's main), not in an atexit handler, a destructor or a
// static initialiser.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::env {

// A whole number ("4096", "-3") from min to max.
long long integer(const char* name, long long fallback, long long min, long long max);

// A size from min to max: "4096" (bytes, or the name's unit), "64M", "1.5GiB", "2g" (binary
// units, as parse_bytes in ipc/units.hpp reads them).
std::uint64_t bytes(const char* name, std::uint64_t fallback, std::uint64_t min, std::uint64_t max);

// A duration from min to max: "250ms", "2s", "1.5m", "1h"; a bare number ("250") only for a name
// ending in _MS, where it is milliseconds. Fractions of a millisecond round down.
std::chrono::milliseconds millis(const char* name, std::chrono::milliseconds fallback,
                                 std::chrono::milliseconds min, std::chrono::milliseconds max);

// 1/0, true/false, yes/no, on/off, in any case.
bool flag(const char* name, bool fallback);

// The value as it is.
std::string text(const char* name, const std::string& fallback);

// One of `accepted`, compared without regard to case; returns the accepted spelling.
std::string choice(const char* name, const std::string& fallback,
                   const std::vector<std::string>& accepted);

// An absolute path: a relative one would name a different place in each process's working
// directory.
std::string absolute_path(const char* name, const std::string& fallback);

}  // namespace ferry::env
