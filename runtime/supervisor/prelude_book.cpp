#include "runtime/supervisor/prelude_book.hpp"

#include <algorithm>

namespace ferry::supervisor {

PreludeBook::PreludeBook(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}

bool PreludeBook::holds(std::uint64_t id) const {
  return std::find(held_.begin(), held_.end(), id) != held_.end();
}

PreludeBook::Plan PreludeBook::plan(std::uint64_t id) const {
  Plan p;
  if (holds(id)) return p;
  p.attach = true;
  if (held_.size() >= capacity_) p.forget = held_.front();
  return p;
}

void PreludeBook::sent(std::uint64_t id, const Plan& plan) {
  for (const std::uint64_t gone : {plan.forget, id}) {
    const auto it = std::find(held_.begin(), held_.end(), gone);
    if (it != held_.end()) held_.erase(it);
  }
  held_.push_back(id);
}

}  // namespace ferry::supervisor
