#include "ipc/cuda/timeline.hpp"

#include "ipc/error.hpp"

namespace ferry::cuda {

Timeline::Timeline(std::uint32_t slots) : capacity_(slots) {
  if (slots == 0) throw Error(Errc::invalid_argument, "a timeline of 0 flag slots");
}

std::optional<Timeline::Mark> Timeline::next(std::uint64_t stream_id) {
  auto it = slots_.find(stream_id);
  if (it == slots_.end()) {
    if (slots_.size() >= capacity_) return std::nullopt;
    it = slots_.emplace(stream_id, Slot{static_cast<std::uint32_t>(slots_.size()), 0}).first;
  }
  Slot& s = it->second;
  ++s.last;
  return Mark{s.index, s.last};
}

bool Timeline::has_slot(std::uint64_t stream_id) const noexcept {
  return slots_.count(stream_id) > 0 || slots_.size() < capacity_;
}

}  // namespace ferry::cuda
