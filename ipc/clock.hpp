// The clock and the "no deadline" timeout that every blocking call in ferry takes.
#pragma once

#include <chrono>

namespace ferry {

// Deadlines and timings: steady, so a wall-clock step neither cuts nor stretches a wait.
using Clock = std::chrono::steady_clock;
// A timeout that never expires.
inline constexpr std::chrono::milliseconds kForever{-1};

}  // namespace ferry
