#include "runtime/supervisor/queue_depth.hpp"

#include <algorithm>

namespace ferry::supervisor {

std::size_t QueueDepth::depth() const noexcept {
  if (!typical_) return kMinDepth;
  std::size_t d = kMaxDepth;  // a clock too coarse to see the tasks: as deep as time allows
  if (typical_->count() > 0) {
    const Clock::rep covered = (kCover.count() + typical_->count() - 1) / typical_->count();
    d = static_cast<std::size_t>(std::min<Clock::rep>(covered, kMaxDepth));
  }
  if (typical_bytes_ > 0) d = std::min<std::uint64_t>(d, kDataCover / typical_bytes_);
  return std::clamp<std::size_t>(d, kMinDepth, kMaxDepth);
}

void QueueDepth::record(Clock::duration took, std::uint64_t bytes) noexcept {
  took = std::max(took, Clock::duration::zero());
  if (!typical_) {
    typical_ = took;
    typical_bytes_ = bytes;
    return;
  }
  *typical_ += (took - *typical_) / 4;
  // Unsigned: the step is taken on the larger side, so neither wraps.
  if (bytes >= typical_bytes_) {
    typical_bytes_ += (bytes - typical_bytes_) / 4;
  } else {
    typical_bytes_ -= (typical_bytes_ - bytes) / 4;
  }
}

}  // namespace ferry::supervisor
