#include "ipc/env.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "ipc/error.hpp"
#include "ipc/units.hpp"

namespace ferry::env {
namespace {

using std::chrono::milliseconds;

// The value of `name`, or nullopt when it is unset or empty (both mean "the default").
std::optional<std::string> raw(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

[[noreturn]] void refuse(const char* name, const std::string& value, const std::string& accepted,
                         const std::string& fallback) {
  throw Error(Errc::invalid_argument, std::string(name) + "='" + value + "' is not accepted: use " +
                                          accepted + "; fix it, or unset it for the default (" +
                                          fallback + ")");
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Digits with at most one '.', nothing else: a number without a unit or a sign.
bool bare_number(const std::string& s) {
  bool digit = false;
  std::size_t dots = 0;
  for (char c : s) {
    if (c == '.') {
      ++dots;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      digit = true;
    } else {
      return false;
    }
  }
  return digit && dots <= 1;
}

// 90000 -> "90 s", 7200000 -> "2 h": the largest unit that shows the value whole.
std::string show(milliseconds d) {
  const long long ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + " h";
  if (ms != 0 && ms % 60'000 == 0) return std::to_string(ms / 60'000) + " min";
  if (ms != 0 && ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

// The unit a bare number of a size variable is in, from the end of its name.
std::pair<const char*, const char*> size_unit(const std::string& name) {
  if (ends_with(name, "_KB")) return {"K", "KiB"};
  if (ends_with(name, "_MB")) return {"M", "MiB"};
  if (ends_with(name, "_GB")) return {"G", "GiB"};
  return {"", "bytes"};
}

}  // namespace

long long integer(const char* name, long long fallback, long long min, long long max) {
  const auto v = raw(name);
  if (!v) return fallback;
  const std::string accepted =
      "a whole number from " + std::to_string(min) + " to " + std::to_string(max);
  const std::string digits = (*v)[0] == '-' || (*v)[0] == '+' ? v->substr(1) : *v;
  const bool well_formed =
      !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  const long long n = well_formed ? std::strtoll(v->c_str(), nullptr, 10) : 0;
  if (!well_formed || errno == ERANGE || n < min || n > max) {
    refuse(name, *v, accepted, std::to_string(fallback));
  }
  return n;
}

std::uint64_t bytes(const char* name, std::uint64_t fallback, std::uint64_t min,
                    std::uint64_t max) {
  const auto v = raw(name);
  if (!v) return fallback;
  const auto [suffix, unit] = size_unit(name);
  const std::string accepted = "a size from " + format_bytes(min) + " to " + format_bytes(max) +
                               ": a number of " + unit +
                               " or a number with a unit K, M, G or T (binary: 1K = 1024), "
                               "e.g. 64M, 1.5GiB, 2g";
  std::uint64_t n = 0;
  try {
    n = parse_bytes(bare_number(*v) ? *v + suffix : *v);
  } catch (const Error&) {
    refuse(name, *v, accepted, format_bytes(fallback));
  }
  if (n < min || n > max) refuse(name, *v, accepted, format_bytes(fallback));
  return n;
}

milliseconds millis(const char* name, milliseconds fallback, milliseconds min, milliseconds max) {
  const auto v = raw(name);
  if (!v) return fallback;
  const bool bare_is_ms = ends_with(name, "_MS");
  const std::string accepted = "a duration from " + show(min) + " to " + show(max) + ": " +
                               (bare_is_ms ? "milliseconds (250) or " : "") +
                               "a number with a unit ms, s, m or h (250ms, 2s, 1.5m)";
  std::size_t split = 0;
  while (split < v->size() &&
         (std::isdigit(static_cast<unsigned char>((*v)[split])) || (*v)[split] == '.')) {
    ++split;
  }
  const std::string number = v->substr(0, split);
  const std::string unit = lower(v->substr(split));
  double scale = -1;
  if (unit.empty() && bare_is_ms) scale = 1;
  if (unit == "ms") scale = 1;
  if (unit == "s") scale = 1000;
  if (unit == "m") scale = 60'000;
  if (unit == "h") scale = 3'600'000;
  const double ms = bare_number(number) && scale > 0 ? std::atof(number.c_str()) * scale : -1;
  // 2^53 ms is past any sensible wait and keeps the conversion below exact and defined.
  if (ms < 0 || ms > 9.0e15) refuse(name, *v, accepted, show(fallback));
  const milliseconds d(static_cast<long long>(std::floor(ms)));
  if (d < min || d > max) refuse(name, *v, accepted, show(fallback));
  return d;
}

bool flag(const char* name, bool fallback) {
  const auto v = raw(name);
  if (!v) return fallback;
  const std::string s = lower(*v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  refuse(name, *v, "1/0, true/false, yes/no or on/off", fallback ? "on" : "off");
}

std::string text(const char* name, const std::string& fallback) {
  return raw(name).value_or(fallback);
}

std::string choice(const char* name, const std::string& fallback,
                   const std::vector<std::string>& accepted) {
  const auto v = raw(name);
  if (!v) return fallback;
  std::string list;
  for (const auto& a : accepted) {
    if (lower(a) == lower(*v)) return a;
    list += (list.empty() ? "" : ", ") + a;
  }
  refuse(name, *v, "one of " + list, fallback);
}

std::string absolute_path(const char* name, const std::string& fallback) {
  const auto v = raw(name);
  if (!v) return fallback;
  if ((*v)[0] != '/') {
    refuse(name, *v,
           "an absolute path (a relative one means another place in each process's working "
           "directory)",
           fallback);
  }
  return *v;
}

}  // namespace ferry::env
