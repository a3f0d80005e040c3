// The sender's pool of interprocess events (design invariant 6): one is recorded on the
// sender's stream after a tensor's last write, and the receiver makes its own stream wait on it,
// so neither side stalls the host.
//
// An event can be recorded again only once its receiver has queued its wait: a receiver waits
// before it claims the tensor's lease, so "the lease is no longer unclaimed" means "waited".
// The pool is bounded per device; when every event is still awaited, the sender synchronises
// its stream instead and sends no event (counted as cuda_event_pool_syncs). Waiting for a
// receiver instead could stall a sender behind a consumer that has not called recv yet.
//
// Plain bookkeeping: creating events is the caller's (it is a CUDA call).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ipc/cuda/ipc_api.hpp"
#include "ipc/ledger.hpp"

namespace ferry::cuda {

class EventPool {
 public:
  explicit EventPool(std::uint32_t per_device);

  struct Take {
    enum Action : std::uint8_t {
      use,        // `slot` is free and holds an event
      create,     // `slot` is new: create an event, then add() it
      exhausted,  // every event is awaited: synchronise instead
    } action = exhausted;
    std::uint32_t slot = 0;
    void* event = nullptr;
    IpcHandle handle{};
  };
  // A free event on `device`. `unclaimed(lease)` says whether an event's last send is still
  // unclaimed (Ledger::unclaimed). The slot is reserved until bind() or give_back().
  Take take(int device, const std::function<bool(const Ledger::Lease&)>& unclaimed);
  void add(int device, std::uint32_t slot, void* event, const IpcHandle& handle);
  // The event was recorded for the send that holds `lease`.
  void bind(int device, std::uint32_t slot, Ledger::Lease lease);
  // The send failed before its record left: the event is free again.
  void give_back(int device, std::uint32_t slot);

  // The event in `slot` on `device`, or null.
  void* event_at(int device, std::uint32_t slot) const noexcept;

 private:
  enum class State : std::uint8_t { free, reserved, bound };
  struct Slot {
    State state = State::reserved;
    void* event = nullptr;
    IpcHandle handle{};
    Ledger::Lease lease{};
  };
  std::vector<Slot>& slots(int device);

  std::uint32_t per_device_;
  std::vector<std::vector<Slot>> by_device_;
};

}  // namespace ferry::cuda
