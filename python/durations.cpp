#include "python/durations.hpp"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "ipc/clock.hpp"
#include "ipc/error.hpp"

namespace ferry::python {

std::chrono::milliseconds seconds_to_ms(const char* what, double seconds, Zero zero) {
  constexpr double kYear = 365.0 * 24 * 3600;
  if (!(seconds >= 0) || (zero == Zero::refused && seconds == 0)) {
    std::ostringstream value;
    value << seconds;
    throw Error(Errc::invalid_argument,
                std::string(what) + "=" + value.str() + ": give a number of seconds " +
                    (zero == Zero::refused ? "above 0" : "of 0 or more") +
                    (std::string(what) == "timeout" ? " (None waits for ever)" : ""));
  }
  const double ms = std::ceil(std::min(seconds, kYear) * 1000.0);
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

std::chrono::milliseconds to_timeout(std::optional<double> seconds, const char* what) {
  if (!seconds) return kForever;
  return seconds_to_ms(what, *seconds);
}

}  // namespace ferry::python
