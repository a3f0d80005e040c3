#include "ipc/cuda/release_policy.hpp"

namespace ferry::cuda {

const char* release_name(Release r) noexcept {
  switch (r) {
    case Release::now:
      return "now";
    case Release::after_event:
      return "after_event";
    case Release::after_device:
      return "after_device";
  }
  return "?";
}

Release release_when(const ReleaseFacts& f) noexcept {
  if (f.strict) return Release::after_device;
  if (f.stream_idle) return Release::now;
  if (f.event) return Release::after_event;
  return Release::after_device;
}

}  // namespace ferry::cuda
