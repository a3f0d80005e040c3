// Human-readable byte counts and durations, both ways: for messages, options and variables.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ferry {

// 1536 -> "1.5 KiB".
std::string format_bytes(std::uint64_t bytes);

// "4096", "64M", "1.5GiB", "2g", "512k" -> bytes. Units are binary whatever their spelling
// (K, KB, KiB = 1024), as docker's --shm-size reads them; fractions round down to a byte.
// Throws Error(invalid_argument) naming the value and the accepted forms.
std::uint64_t parse_bytes(const std::string& text);

// "30s", "10m", "2h", "1d", "1.5h", or plain seconds -> a duration. Throws
// Error(invalid_argument) naming the value and the accepted forms; negative values are refused.
std::chrono::seconds parse_duration(const std::string& text);

}  // namespace ferry
