// The sending side of the CUDA transport (internal): one per process, it holds what every send
// shares: the CUDA ledger whose leases keep sent storages alive, the exported handles and span
// bundles, the pool of interprocess events, and what receivers refused.
#pragma once

#include <ATen/ATen.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "ipc/cuda/devices.hpp"
#include "ipc/cuda/event_pool.hpp"
#include "ipc/cuda/export_cache.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/cuda/span_export.hpp"
#include "ipc/ledger.hpp"

namespace ferry::detail {

// What a CUDA lease keeps alive: the storage (so the caching allocator cannot hand its bytes to
// another tensor) until every receiver is done with it.
struct SentStorage {
  c10::Storage storage;
  cuda::BlockInfo block;                   // the allocation it lies in, for a receiver's refusal
  std::shared_ptr<cuda::SpanExport> span;  // its chunks' fds, when it travels by fd
};

// A receiver that could not open an allocation (cudaErrorAlreadyMapped: it has it open outside
// ferry): later sends of that allocation to it are copied.
using Refused = std::tuple<pid_t, int, std::uintptr_t, std::uint64_t>;  // by, device, base, id

struct Sender {
  Sender();

  std::mutex mu;
  std::unique_ptr<Ledger> ledger;
  cuda::ExportCache handles;
  cuda::SpanExports spans;
  cuda::EventPool events;
  std::map<int, cuda::Uuid> uuids;
  std::set<Refused> refused;
  std::map<int, bool> copies_exportable;  // per device: can LibTorch's fresh blocks be exported

  // True when `pid` refused block `b` before (refusals arrive through the ledger).
  bool refused_by_locked(pid_t pid, const cuda::BlockInfo& b);
  // The CUDA ledger, created and published on first use, with its reaper thread.
  Ledger& ledger_locked();
  // Whether a copy on `device` could travel zero-copy: one small allocation from LibTorch's
  // allocator per device and process shows what kind of memory it gives (expandable segments
  // give virtual-memory chunks, which travel by fd where they were made for it).
  bool copies_exportable_locked(int device);
  // The UUID of `device`, read once.
  const cuda::Uuid& uuid_locked(int device);
};

// This process's sender, made on first use: a forked child gets a fresh one (the parent's mutex
// may have been held). Never freed: its reaper thread uses it until exit.
Sender& sender();
// This process's sender, or nullptr when it has sent no CUDA tensor.
Sender* existing_sender();

}  // namespace ferry::detail
