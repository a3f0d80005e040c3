#include "ipc/diag/check_item.hpp"

namespace ferry {

const char* verdict_name(Verdict v) noexcept {
  switch (v) {
    case Verdict::ok:
      return "ok";
    case Verdict::warn:
      return "warn";
    case Verdict::fail:
      return "fail";
  }
  return "fail";
}

const MeasuredValue* CheckItem::value(const std::string& key) const noexcept {
  for (const auto& m : values) {
    if (m.key == key) return &m.value;
  }
  return nullptr;
}

}  // namespace ferry
