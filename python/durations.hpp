// Seconds from Python as ferry's milliseconds (internal to the extension): one rule for every
// option and every wait, so a bad value is refused the same way wherever it is given.
#pragma once

#include <chrono>
#include <optional>

namespace ferry::python {

// Whether 0 s is a valid value of the option (a wait of 0 s polls; a heartbeat of 0 s is none).
enum class Zero { allowed, refused };

// `seconds` as milliseconds, rounded up so a short positive time never becomes 0, and past a
// year taken as a year. Throws Error(invalid_argument) naming `what`, the value and what to give
// instead when it is negative, not a number, or 0 where `zero` refuses it.
std::chrono::milliseconds seconds_to_ms(const char* what, double seconds,
                                        Zero zero = Zero::allowed);

// A wait's timeout: None waits for ever (kForever); else as seconds_to_ms.
std::chrono::milliseconds to_timeout(std::optional<double> seconds, const char* what = "timeout");

}  // namespace ferry::python
