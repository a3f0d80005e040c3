#include "ipc/units.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "ipc/error.hpp"

namespace ferry {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Splits "1.5GiB" into 1.5 and "gib". False when the number part is missing, negative or not
// finite; strtod alone would also take "inf", hex and exponents, which nobody means here.
bool split_number(const std::string& text, double* number, std::string* unit) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  if (i == 0) return false;
  const std::string digits = text.substr(0, i);
  if (digits.find('.') != digits.rfind('.') || digits == ".") return false;
  char* end = nullptr;
  *number = std::strtod(digits.c_str(), &end);
  if (*end != '\0' || !std::isfinite(*number)) return false;
  *unit = lower(text.substr(i));
  return true;
}

}  // namespace

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  }
  return buf;
}

std::uint64_t parse_bytes(const std::string& text) {
  double number = 0;
  std::string unit;
  int shift = -1;
  if (split_number(text, &number, &unit)) {
    if (unit.empty() || unit == "b") {
      shift = 0;
    } else {
      static const char kPrefixes[] = "kmgtp";
      const std::size_t p = std::string(kPrefixes).find(unit[0]);
      const std::string rest = unit.substr(1);
      if (p != std::string::npos && (rest.empty() || rest == "b" || rest == "ib")) {
        shift = 10 * static_cast<int>(p + 1);
      }
    }
  }
  const double bytes = shift < 0 ? 0 : std::ldexp(number, shift);
  if (shift < 0 || bytes >= 18446744073709551616.0) {
    throw Error(Errc::invalid_argument,
                "invalid size '" + text +
                    "': use bytes (4096) or a number with a unit K, M, G, T or P (binary: 1K = "
                    "1024; KB and KiB mean the same), e.g. 64M, 1.5GiB, 2g");
  }
  return static_cast<std::uint64_t>(bytes);
}

std::chrono::seconds parse_duration(const std::string& text) {
  double number = 0;
  std::string unit;
  double scale = -1;
  if (split_number(text, &number, &unit)) {
    if (unit.empty() || unit == "s") scale = 1;
    if (unit == "m") scale = 60;
    if (unit == "h") scale = 3600;
    if (unit == "d") scale = 86400;
  }
  const double seconds = number * scale;
  // 2^62 s is far past any file's age and keeps the cast below defined.
  if (scale < 0 || seconds > 4.6e18) {
    throw Error(Errc::invalid_argument,
                "invalid duration '" + text +
                    "': use a number with a unit s, m, h or d (30s, 10m, 2h, 1d, 1.5h), or plain "
                    "seconds");
  }
  return std::chrono::seconds(static_cast<std::int64_t>(seconds));
}

}  // namespace ferry
