#include "runtime/supervisor/queue_depth.hpp"

#include <algorithm>

namespace ferry::supervisor {

std::size_t QueueDepth::depth() const noexcept {
  if (!typical_) return kMinDepth;
  if (typical_->count() <= 0) return kMaxDepth;  // a clock too coarse to see the tasks
  const Clock::rep covered = (kCover.count() + typical_->count() - 1) / typical_->count();
  return static_cast<std::size_t>(std::clamp<Clock::rep>(covered, kMinDepth, kMaxDepth));
}

void QueueDepth::record(Clock::duration took) noexcept {
  took = std::max(took, Clock::duration::zero());
  typical_ = typical_ ? *typical_ + (took - *typical_) / 4 : took;
}

}  // namespace ferry::supervisor
