// The receiving side of the CUDA transport (internal): one per process, it holds what every
// receive shares: the import cache (each peer allocation or span opened once), the peers'
// events and flag buffers opened here, and the closer thread, which releases leases whose views
// died once the device is done with them (release_policy.hpp: at once for a view dropped on an
// idle stream, after an event recorded at the drop, or after the whole device), closes what
// nobody views, and releases the waits of a sender that died with its writes pending, off the hot
// path.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <vector>

#include "ipc/cuda/flag_imports.hpp"
#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/import_cache.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/cuda/span_import.hpp"

namespace ferry::detail {

// A peer's interprocess event, by the pool slot it sent it from.
struct EventKey {
  cuda::ProcessIdentity owner;
  int device;
  std::uint32_t slot;
  bool operator<(const EventKey& o) const noexcept {
    return std::tie(owner, device, slot) < std::tie(o.owner, o.device, o.slot);
  }
};
struct OpenedEvent {
  cuda::IpcHandle handle;
  void* event;
};

class Importer {
 public:
  Importer();

  std::mutex mu;
  std::condition_variable changed;  // an entry finished opening or closing
  std::condition_variable work;     // the closer has something to do
  cuda::ImportCache cache;
  cuda::SpanImports spans;
  std::set<cuda::ImportCache::EntryId> span_entries;  // entries that are spans passed by fd
  std::map<EventKey, OpenedEvent> events;
  cuda::FlagImports flags;
  // How long a mapping with no views stays open for the next tensor of its allocation
  // (FERRY_CUDA_LINGER_MS).
  const std::chrono::milliseconds linger;
  // FERRY_CUDA_STRICT_RELEASE=1: every lease waits for its whole device (release_policy.hpp).
  const bool strict_release;

  void start_closer_locked();
  // Marks the owner's allocations, drops its events, and hands its flag buffers to the closer
  // (which releases the waits on them, then closes them): they died with it.
  void owner_exited_locked(const cuda::ProcessIdentity& owner);

  // A plain event on `device` for a dropped view (one the closer has done with, or a new one);
  // null where none can be made.
  void* plain_event(int device);
  // An event plain_event() gave that was not recorded after all.
  void return_event(int device, void* event);
  // A lease to release once `event`, recorded on the stream of its view's drop, has completed.
  void release_after(void* event, cuda::LeaseRef lease);

 private:
  struct AfterEvent {
    void* event;
    cuda::LeaseRef lease;
  };
  void closer();
  cuda::Status close_span(int device, void* local);
  void check_owners_locked();
  // Releases the leases whose events have completed; true while some are still pending.
  bool poll_events_locked();
  // Sets the slots a dead sender's writes never reached to kReleaseValue, then closes its buffers.
  void release_dead_flags(std::vector<cuda::FlagImports::Release> dead);
  bool closer_running_ = false;
  std::vector<AfterEvent> after_event_;
  std::map<int, std::vector<void*>> free_events_;  // plain events by device, done with
  std::vector<cuda::FlagImports::Release> dead_flags_;
  std::map<int, void*> closer_streams_;  // the closer's own stream on each device, for its writes
};

// This process's importer, made on first use (which reads FERRY_CUDA_LINGER_MS and may throw):
// a forked child gets a fresh one. Never freed: the detached closer uses it until exit.
Importer& importer();
// This process's importer, or nullptr when it has not received a CUDA tensor.
Importer* existing_importer();

// What a received CUDA tensor's storage holds: its entry in the import cache and its lease.
struct CudaView {
  Importer* importer;
  cuda::ImportCache::EntryId entry;
  cuda::LeaseRef lease;
  pid_t holder;
};
void cuda_view_deleter(void* ctx);

// What a tensor received from this very process holds: the lease on a copy the sender made for
// it. The lease ends through the closer, after the device is done with the view.
struct LocalView {
  Importer* importer;
  cuda::LeaseRef lease;
  pid_t holder;
};
void local_view_deleter(void* ctx);

}  // namespace ferry::detail
