#include "ipc/cuda/send_policy.hpp"

namespace ferry::cuda {

const char* memory_kind_name(MemoryKind k) noexcept {
  switch (k) {
    case MemoryKind::device:
      return "device";
    case MemoryKind::managed:
      return "managed";
    case MemoryKind::pool:
      return "stream-ordered pool";
    case MemoryKind::vmm:
      return "virtual memory mapping (cuMemMap)";
    case MemoryKind::host:
      return "pinned host";
    case MemoryKind::unknown:
      break;
  }
  return "unknown";
}

bool exportable(const BlockInfo& b) noexcept {
  return (b.kind == MemoryKind::device && b.legacy_ipc) ||
         (b.kind == MemoryKind::vmm && b.fd_exportable);
}

Decision decide(const SendFacts& f) noexcept {
  auto copy = [](Route r, CopyReason why) { return Decision{r, why}; };
  const Receiver& to = f.receiver;
  if (to.known && !to.cuda) return copy(Route::host_only, CopyReason::cpu_receiver);
  if (f.empty) return copy(Route::host_copy, CopyReason::empty);
  if (!f.ledger_has_room) return copy(Route::host_copy, CopyReason::ledger_full);
  if (to.known && to.cannot_open) return copy(Route::host_copy, CopyReason::peer_cannot_open);
  std::optional<CopyReason> why;
  if (f.detached) {
    why = CopyReason::detached;
  } else if (f.received) {
    why = CopyReason::received;
  } else if (to.known && to.same_process) {
    why = CopyReason::same_process;
  } else if (!exportable(f.block)) {
    why = CopyReason::not_exportable;
  }
  if (!why) return {Route::zero_copy, std::nullopt};
  return copy(f.copies_exportable ? Route::device_copy : Route::host_copy, *why);
}

}  // namespace ferry::cuda
