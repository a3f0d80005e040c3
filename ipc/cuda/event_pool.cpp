#include "ipc/cuda/event_pool.hpp"

#include "ipc/error.hpp"

namespace ferry::cuda {

EventPool::EventPool(std::uint32_t per_device) : per_device_(per_device) {
  if (per_device == 0) {
    throw Error(Errc::invalid_argument,
                "an event pool of 0 events per device; FERRY_CUDA_EVENTS must be at least 1");
  }
}

std::vector<EventPool::Slot>& EventPool::slots(int device) {
  if (device < 0)
    throw Error(Errc::invalid_argument, "event pool device " + std::to_string(device));
  if (by_device_.size() <= static_cast<std::size_t>(device)) by_device_.resize(device + 1);
  return by_device_[device];
}

EventPool::Take EventPool::take(int device,
                                const std::function<bool(const Ledger::Lease&)>& unclaimed) {
  auto& v = slots(device);
  Take t;
  for (std::uint32_t i = 0; i < v.size(); ++i) {
    Slot& s = v[i];
    if (s.state == State::bound && !unclaimed(s.lease)) s.state = State::free;
    if (s.state == State::free) {
      s.state = State::reserved;
      t.action = Take::use;
      t.slot = i;
      t.event = s.event;
      t.handle = s.handle;
      return t;
    }
  }
  if (v.size() < per_device_) {
    v.emplace_back();
    t.action = Take::create;
    t.slot = static_cast<std::uint32_t>(v.size() - 1);
    return t;
  }
  t.action = Take::exhausted;
  return t;
}

void EventPool::add(int device, std::uint32_t slot, void* event, const IpcHandle& handle) {
  Slot& s = slots(device).at(slot);
  s.event = event;
  s.handle = handle;
}

void EventPool::bind(int device, std::uint32_t slot, Ledger::Lease lease) {
  Slot& s = slots(device).at(slot);
  s.state = State::bound;
  s.lease = lease;
}

void EventPool::give_back(int device, std::uint32_t slot) {
  auto& v = slots(device);
  Slot& s = v.at(slot);
  // A slot whose creation failed has no event: drop it if it is the last, so it is retried.
  if (s.event == nullptr && slot + 1 == v.size()) {
    v.pop_back();
    return;
  }
  s.state = State::free;
}

void* EventPool::event_at(int device, std::uint32_t slot) const noexcept {
  if (device < 0 || static_cast<std::size_t>(device) >= by_device_.size()) return nullptr;
  const auto& v = by_device_[device];
  return slot < v.size() ? v[slot].event : nullptr;
}

}  // namespace ferry::cuda
