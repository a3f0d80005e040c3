// When a received CUDA view's lease may end (design invariant 6): the sender may reuse the memory
// the moment it does, so every read this process queued on the view must be done by then. The
// contract is torch's: the view's last reads were queued on the current stream at the drop (or
// ordered before it by the caller). One pure decision, a test per case; the dropping thread and
// the closer carry it out.
#pragma once

#include <cstdint>

namespace ferry::cuda {

enum class Release : std::uint8_t {
  now,           // the current stream has nothing pending: its reads are done; released at once
  after_event,   // a plain event recorded on the current stream; the closer polls it
  after_device,  // the closer waits for the whole device first (strict, or no event to record)
};
const char* release_name(Release r) noexcept;

struct ReleaseFacts {
  // FERRY_CUDA_STRICT_RELEASE=1: for code that reads a received view on streams other than the
  // current one without ordering them before the drop; the closer synchronises the device.
  bool strict = false;
  bool stream_idle = false;  // cudaStreamQuery on the current stream at the drop said so
  bool event = false;        // a plain event could be had and recorded there
};

// strict waits for the device; an idle stream releases now; else an event, else the device.
Release release_when(const ReleaseFacts& f) noexcept;

}  // namespace ferry::cuda
