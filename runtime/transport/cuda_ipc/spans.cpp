#include "runtime/transport/cuda_ipc/spans.hpp"

#include <chrono>

#include "ipc/cuda/vmm_api.hpp"
#include "ipc/cuda/vmm_span.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/segment_server.hpp"
#include "ipc/stats.hpp"

namespace ferry::detail {

namespace {
constexpr auto kFetchTimeout = std::chrono::seconds(5);
}

std::optional<cuda::Span> span_of(const at::Tensor& t) {
  cuda::Span span;
  const auto addr = reinterpret_cast<std::uint64_t>(t.storage().data());
  std::string why = cuda::plan_span(
      addr, t.storage().nbytes(),
      [](std::uint64_t a, cuda::Chunk* c) { return cuda::device_vmm().chunk_at(a, c); }, &span);
  if (!why.empty()) {
    log().debug("a CUDA tensor in virtual memory cannot travel by fd ({}): it is copied", why);
    return std::nullopt;
  }
  return span;
}

void describe_span(wire::Record& r, const cuda::SpanExport& e, const at::Tensor& t) {
  const cuda::Span& s = e.span();
  r.flags |= wire::kFlagByFd;
  r.segment_seq = e.seq();
  r.segment_size = s.size;
  r.cuda_base = s.base;
  r.cuda_buffer_id = s.digest;
  r.block_offset = reinterpret_cast<std::uint64_t>(t.storage().data()) - s.base;
}

std::uint64_t open_span(cuda::SpanImports& spans, const wire::Record& r,
                        const cuda::ProcessIdentity& owner, int device) {
  FdBundle bundle = fetch_bundle(r.owner_pid, r.owner_token, r.segment_seq, kFetchTimeout);
  cuda::Span span;
  std::string bad = cuda::decode_span(bundle.bytes, &span);
  if (bad.empty() && (span.base != r.cuda_base || span.size != r.segment_size ||
                      span.digest != r.cuda_buffer_id)) {
    bad = "the bundle's span does not match the record's";
  }
  if (bad.empty()) bad = wire::validate_location(r, span.size);
  if (!bad.empty()) {
    throw Error(Errc::bad_record, "CUDA span of pid " + std::to_string(r.owner_pid) + ": " + bad);
  }
  const std::uint64_t before = spans.chunks_imported_total();
  std::uint64_t va = 0;
  cuda::Status st = spans.map(owner, device, span, std::move(bundle.fds), &va);
  if (!st.ok()) {
    throw Error(Errc::system, "mapping a peer's CUDA memory passed by fd: " + st.error +
                                  ". Remedy: check the device and driver (ferry-shm check); "
                                  "sending t.cpu() avoids CUDA IPC");
  }
  bump(counters().cuda_handles_opened, spans.chunks_imported_total() - before);
  return va;
}

}  // namespace ferry::detail
