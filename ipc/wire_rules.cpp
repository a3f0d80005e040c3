#include "ipc/wire_rules.hpp"

#include <cinttypes>
#include <cstdio>

namespace ferry::wire {
namespace {

// The first row that carries a record checks it: inline before cpu, which it narrows.
constexpr CarrierRules kCarriers[] = {
    {carries_inline, check_inline, check_inline_view},
    {carries_cpu, check_cpu, nullptr},
    {carries_cuda, check_cuda, nullptr},
};

}  // namespace

const CarrierRules* carrier_rules(const Record& r) noexcept {
  for (const CarrierRules& c : kCarriers) {
    if (c.carries(r)) return &c;
  }
  return nullptr;
}

std::string i64(std::int64_t v) {
  return std::to_string(v);
}
std::string u64(std::uint64_t v) {
  return std::to_string(v);
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

bool all_zero(const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace ferry::wire
