#include "ipc/cuda/span_export.hpp"

#include <atomic>

#include "ipc/error.hpp"
#include "ipc/segment_server.hpp"

namespace ferry::cuda {
namespace {

// Wraps after 2^31 exports; by then the first are long withdrawn.
std::atomic<std::uint32_t> g_next_seq{0};

std::uint32_t next_seq() {
  return kFirstSpanSeq | (g_next_seq.fetch_add(1) & 0x7fffffffu);
}

}  // namespace

SpanExport::~SpanExport() {
  withdraw_segment(seq_);
}

std::shared_ptr<SpanExport> SpanExports::get(const Span& span) {
  const Key key{span.base, span.size, span.digest};
  if (auto it = live_.find(key); it != live_.end()) {
    if (auto live = it->second.lock()) return live;
  }
  // Drop the entries of exports that ended, so the map holds only what is live.
  for (auto it = live_.begin(); it != live_.end();) {
    it = it->second.expired() ? live_.erase(it) : std::next(it);
  }
  auto bundle = std::make_shared<FdBundle>();
  for (const Chunk& c : span.chunks) {
    UniqueFd fd;
    if (Status s = ops_.export_fd(c, &fd); !s.ok()) {
      throw Error(Errc::system, "exporting a CUDA allocation by file descriptor: " + s.error +
                                    ". Remedy: check the device and driver (ferry-shm check); "
                                    "sending t.cpu() avoids CUDA IPC");
    }
    bundle->fds.push_back(std::move(fd));
  }
  fds_exported_ += span.chunks.size();
  bundle->bytes = encode_span(span);
  auto out = std::make_shared<SpanExport>(next_seq(), span);
  publish_bundle(out->seq(), std::move(bundle));
  live_[key] = out;
  return out;
}

}  // namespace ferry::cuda
