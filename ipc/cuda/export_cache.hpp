// The sender's handle cache: cudaIpcGetMemHandle once per allocation, then the same handle for
// every tensor in it. Keyed by device and base address, and checked against the buffer id, so a
// new allocation at a freed block's address gets its own handle, never the stale one.
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "ipc/cuda/ipc_api.hpp"

namespace ferry::cuda {

class ExportCache {
 public:
  // The handle of this allocation if it was exported before, else null. A cached handle of an
  // earlier allocation at the same address is dropped.
  const IpcHandle* find(const BlockInfo& block);
  void put(const BlockInfo& block, const IpcHandle& handle);
  std::size_t size() const noexcept { return entries_.size(); }

 private:
  struct Entry {
    std::uint64_t buffer_id;
    std::size_t size;
    IpcHandle handle;
  };
  std::map<std::pair<int, std::uintptr_t>, Entry> entries_;
};

}  // namespace ferry::cuda
