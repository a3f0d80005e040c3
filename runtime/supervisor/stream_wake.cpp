#include "runtime/supervisor/stream_wake.hpp"

#include <algorithm>

namespace ferry::supervisor {

bool StreamWake::may_hold(const StreamState& s) noexcept {
  return s.inputs_left && 2 * s.in_flight > s.window && s.typical_gap && *s.typical_gap < kHold;
}

bool StreamWake::wake_now(const StreamState& s) noexcept {
  if (!may_hold(s) || !s.consumer_looks_again) return true;
  return s.oldest_ready && *s.oldest_ready >= kHold;
}

std::optional<Clock::duration> StreamWake::sleep_limit(const StreamState& s) noexcept {
  if (!may_hold(s)) return std::nullopt;
  return kHold;
}

void StreamWake::record_arrival(Clock::time_point at) noexcept {
  if (last_) {
    const Clock::duration gap = std::max(at - *last_, Clock::duration::zero());
    typical_gap_ = typical_gap_ ? *typical_gap_ + (gap - *typical_gap_) / 4 : gap;
  }
  last_ = at;
}

}  // namespace ferry::supervisor
