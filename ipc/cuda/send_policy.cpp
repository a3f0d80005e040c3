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
      return "virtual memory mapping without legacy IPC";
    case MemoryKind::host:
      return "pinned host";
    case MemoryKind::unknown:
      break;
  }
  return "unknown";
}

Decision decide(const SendFacts& f) noexcept {
  auto copy = [](Route r, CopyReason why) { return Decision{r, why}; };
  const Receiver& to = f.receiver;
  if (to.known && !to.cuda) return copy(Route::host_only, CopyReason::cpu_receiver);
  if (!f.ledger_has_room) return copy(Route::host_copy, CopyReason::ledger_full);
  if (to.known && to.cannot_open) return copy(Route::host_copy, CopyReason::peer_cannot_open);
  if (f.detached) return copy(Route::device_copy, CopyReason::detached);
  if (f.received) return copy(Route::device_copy, CopyReason::received);
  if (to.known && to.same_process) return copy(Route::device_copy, CopyReason::same_process);
  if (f.block.kind != MemoryKind::device || !f.block.legacy_ipc) {
    return copy(Route::device_copy, CopyReason::not_exportable);
  }
  return {Route::zero_copy, std::nullopt};
}

}  // namespace ferry::cuda
