// Human-readable byte counts for messages: 1536 -> "1.5 KiB".
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

std::string format_bytes(std::uint64_t bytes);

}  // namespace ferry
