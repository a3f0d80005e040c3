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

#include <string>

#include "ipc/cuda/devices.hpp"
#include "ipc/cuda/event_pool.hpp"
#include "ipc/cuda/export_cache.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/cuda/span_export.hpp"
#include "ipc/cuda/sync_policy.hpp"
#include "ipc/cuda/timeline.hpp"
#include "ipc/ledger.hpp"

namespace ferry::detail {

// What a CUDA lease keeps alive: the storage (so the caching allocator cannot hand its bytes to
// another tensor) until every receiver is done with it.
struct SentStorage {
  c10::Storage storage;
  cuda::BlockInfo block;                   // the allocation it lies in, for a receiver's refusal
  std::shared_ptr<cuda::SpanExport> span;  // its chunks' fds, when it travels by fd
};

// A device's timeline counters (ipc/cuda/timeline.hpp): its flag buffer, made, probed and exported
// at the first busy send on the device, never freed (a receiver may have it open until this
// process exits).
struct DeviceFlags {
  bool ok = false;           // memops work here and the buffer is exported
  std::string why;           // why not, when not
  void* buffer = nullptr;    // cudaMalloc'd, Timeline::bytes() of zeroed 64-bit slots
  cuda::IpcHandle handle{};  // its export, in every memop record
  cuda::Timeline timeline;
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
  std::map<int, DeviceFlags> flags;       // per device, once a busy send needed it
  const cuda::SyncMode sync_mode;         // FERRY_CUDA_SYNC

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
  // The timeline counters of `device`: probed (a real write and wait), allocated and exported
  // once; ok is false, saying why, where memops do not work there.
  DeviceFlags& flags_locked(int device);
};

// This process's sender, made on first use: a forked child gets a fresh one (the parent's mutex
// may have been held). Never freed: its reaper thread uses it until exit.
Sender& sender();
// This process's sender, or nullptr when it has sent no CUDA tensor.
Sender* existing_sender();

}  // namespace ferry::detail
