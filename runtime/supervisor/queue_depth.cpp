#include "runtime/supervisor/queue_depth.hpp"

#include <algorithm>

namespace ferry::supervisor {

std::size_t QueueDepth::depth() const noexcept {
  if (!typical_ || typical_->count() <= 0) return typical_ ? kMaxDepth : kMinDepth;
  const auto covered = (kCover.count() + typical_->count() - 1) / typical_->count();
  return std::clamp(static_cast<std::size_t>(std::min<Clock::rep>(covered, kMaxDepth)), kMinDepth,
                    kMaxDepth);
}

void QueueDepth::record(Clock::duration took) noexcept {
  took = std::max(took, Clock::duration::zero());
  typical_ = typical_ ? *typical_ + (took - *typical_) / 4 : took;
}

}  // namespace ferry::supervisor
