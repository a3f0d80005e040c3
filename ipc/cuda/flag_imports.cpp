#include "ipc/cuda/flag_imports.hpp"

#include <algorithm>
#include <tuple>

#include "ipc/error.hpp"

namespace ferry::cuda {

bool FlagImports::Key::operator<(const Key& o) const noexcept {
  return std::tie(owner, device) < std::tie(o.owner, o.device);
}

void* FlagImports::find(const Key& k) const {
  auto it = buffers_.find(k);
  return it == buffers_.end() ? nullptr : it->second.local;
}

void FlagImports::add(const Key& k, int device, void* local) {
  if (!buffers_.emplace(k, Buffer{device, local, {}}).second) {
    throw Error(Errc::invalid_argument, "a flag buffer of " + k.owner.str() + " opened twice");
  }
}

void FlagImports::waited(const Key& k, std::uint32_t slot, std::uint64_t value) {
  auto it = buffers_.find(k);
  if (it == buffers_.end()) return;
  std::uint64_t& highest = it->second.waited[slot];
  highest = std::max(highest, value);
}

std::vector<FlagImports::Release> FlagImports::owner_died(const ProcessIdentity& owner) {
  std::vector<Release> out;
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    if (it->first.owner != owner) {
      ++it;
      continue;
    }
    Release r{it->second.device, it->second.local, {}};
    for (const auto& [slot, value] : it->second.waited) r.slots.push_back(slot);
    out.push_back(std::move(r));
    it = buffers_.erase(it);
  }
  return out;
}

std::vector<ProcessIdentity> FlagImports::owners() const {
  std::vector<ProcessIdentity> out;
  for (const auto& [k, b] : buffers_) {
    if (out.empty() || out.back() != k.owner) out.push_back(k.owner);
  }
  return out;
}

}  // namespace ferry::cuda
