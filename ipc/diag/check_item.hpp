// One item of a diagnostic report: a named check, its verdict, what it found and what to change,
// with the numbers it measured (ferry-shm check, check_shm(), the checks in system_limits.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace ferry {

enum class Verdict : std::uint8_t { ok, warn, fail };

// "ok", "warn" or "fail".
const char* verdict_name(Verdict v) noexcept;

// One measured value. monostate: it could not be read (the item's summary says why).
using MeasuredValue = std::variant<std::monostate, bool, std::int64_t, std::uint64_t, std::string>;

struct Measured {
  std::string key;  // e.g. "free_bytes"; stable, used as the JSON key
  MeasuredValue value;
};

struct CheckItem {
  std::string name;  // stable id: shm_dir, shm_reserve, memory_cgroup, sysv_shm, open_files,
                     // memlock, cuda
  Verdict verdict = Verdict::ok;
  std::string summary;  // one line: what was found, with the numbers
  std::string remedy;   // one line: what to change; empty when nothing needs changing
  std::vector<Measured> values;

  // The value under `key`, or nullptr.
  const MeasuredValue* value(const std::string& key) const noexcept;
  // Records `value` under `key`.
  void add(std::string key, MeasuredValue value) {
    values.push_back(Measured{std::move(key), std::move(value)});
  }
};

}  // namespace ferry
