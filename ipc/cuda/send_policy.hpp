// Whether a CUDA tensor may be sent zero-copy, or must be copied first and why (design
// invariant 5). Memory travels zero-copy when it is a cudaMalloc block (legacy IPC handle) or
// virtual-memory chunks made for export by file descriptor (LibTorch's expandable segments). Plain
// code with no CUDA calls: the facts are gathered by the caller, so every rule is unit-tested on
// machines without a GPU.
#pragma once

#include <optional>

#include "ipc/cuda/ipc_api.hpp"
#include "ipc/stats.hpp"

namespace ferry::cuda {

// Who will receive the tensor, when the sender knows (a pool knows its worker; a queue with
// several receivers does not).
struct Receiver {
  bool known = false;
  bool same_process = false;
  bool cuda = false;  // it can use CUDA at all (a CPU-only worker cannot)
  // It cannot open this sender's blocks on the tensor's device: a different device without
  // IPC/P2P access, or it reported the block already open under another context.
  bool cannot_open = false;
};

// Everything the decision depends on, gathered by the caller (cuda_ipc/encode.cpp under
// runtime/transport/).
struct SendFacts {
  bool empty = false;           // no bytes, so no allocation to export
  bool detached = false;        // the caller asked for a copy
  bool received = false;        // the tensor was itself received from a peer
  BlockInfo block;              // what the driver says about its memory (unset when empty)
  bool ledger_has_room = true;  // a CUDA lease slot is free (or one ended and can be reclaimed)
  // A fresh block from LibTorch's allocator on the tensor's device can be exported (by handle,
  // or by fd where expandable segments made it), so a copy on the device can travel that way.
  bool copies_exportable = true;
  Receiver receiver;
};

// How the tensor travels.
enum class Route : std::uint8_t {
  zero_copy,    // its own memory, exported: a cudaMalloc block by handle, a span by fds
  device_copy,  // a fresh exportable block on the same device, exported
  host_copy,    // through the CPU transport (shared memory), back to the device on arrival
  host_only,    // through the CPU transport, arriving as a CPU tensor (CPU-only receiver)
};

struct Decision {
  Route route = Route::zero_copy;
  std::optional<CopyReason> reason;  // set for every route but zero_copy
};

// The rules, first match wins: a CPU-only receiver gets a CPU tensor; an empty tensor, a
// receiver that cannot open the block and a full ledger go through the CPU transport (there is
// nothing to export, or a device copy would need the same open or another lease); detached,
// received, same-process and unexportable memory are copied on the device, or through the CPU
// transport where the device's fresh blocks cannot be exported either.
Decision decide(const SendFacts& f) noexcept;

// Whether memory like `b` can be exported at all: by legacy handle or by fd.
bool exportable(const BlockInfo& b) noexcept;

// "device", "managed", ... for messages.
const char* memory_kind_name(MemoryKind k) noexcept;

}  // namespace ferry::cuda
