#include "ipc/cuda/export_cache.hpp"

namespace ferry::cuda {

const IpcHandle* ExportCache::find(const BlockInfo& block) {
  auto it = entries_.find({block.device, block.base});
  if (it == entries_.end()) return nullptr;
  if (it->second.buffer_id != block.buffer_id || it->second.size != block.size) {
    entries_.erase(it);
    return nullptr;
  }
  return &it->second.handle;
}

void ExportCache::put(const BlockInfo& block, const IpcHandle& handle) {
  entries_[{block.device, block.base}] = Entry{block.buffer_id, block.size, handle};
}

}  // namespace ferry::cuda
