// The sender's side of a span passed by file descriptor (vmm_span.hpp).
//
// An export is one fd per chunk, published in the segment server as one bundle under a seq of
// its own; a receiver that has not mapped the span fetches the bundle by SCM_RIGHTS over the
// SO_PEERCRED-checked socket (no pidfd_getfd, so no ptrace permission is needed, and it works in
// unprivileged containers). The export lives exactly as long as some lease holds it (a record
// that names its seq is in flight or viewed): its last holder's release withdraws it and closes
// the fds, so an exported fd never keeps memory the allocator has since let go.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "ipc/cuda/vmm_api.hpp"
#include "ipc/cuda/vmm_span.hpp"

namespace ferry::cuda {

// Bundle seqs start here: arena segments count up from 1, and ledgers sit at the top.
inline constexpr std::uint32_t kFirstSpanSeq = 0x80000000u;

class SpanExport {
 public:
  SpanExport(std::uint32_t seq, Span span) : seq_(seq), span_(std::move(span)) {}
  ~SpanExport();  // withdraws the bundle: its fds close
  SpanExport(const SpanExport&) = delete;
  SpanExport& operator=(const SpanExport&) = delete;
  std::uint32_t seq() const noexcept { return seq_; }
  const Span& span() const noexcept { return span_; }

 private:
  std::uint32_t seq_;
  Span span_;
};

// This process's live exports, by span. Not thread-safe: the caller holds its own lock.
class SpanExports {
 public:
  explicit SpanExports(VmmOps& ops) : ops_(ops) {}
  // The live export of `span`, or a new one (one fd per chunk, published). Throws Error(system)
  // naming the failed call.
  std::shared_ptr<SpanExport> get(const Span& span);
  // Fds exported so far, for statistics.
  std::uint64_t fds_exported() const noexcept { return fds_exported_; }

 private:
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;  // base, size, digest
  VmmOps& ops_;
  std::map<Key, std::weak_ptr<SpanExport>> live_;
  std::uint64_t fds_exported_ = 0;
};

}  // namespace ferry::cuda
