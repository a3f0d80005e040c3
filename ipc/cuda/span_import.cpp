#include "ipc/cuda/span_import.hpp"

namespace ferry::cuda {

Status SpanImports::map(const ProcessIdentity& owner, int device, const Span& s,
                        std::vector<UniqueFd> fds, std::uint64_t* va) {
  if (fds.size() != s.chunks.size()) {
    return {-1, "the span has " + std::to_string(s.chunks.size()) + " chunks but " +
                    std::to_string(fds.size()) + " fds arrived"};
  }
  std::uint64_t granularity = 0;
  if (Status g = ops_.granularity(device, &granularity); !g.ok()) return g;
  if (std::string bad = check_span(s, granularity); !bad.empty()) return {-1, bad};

  std::lock_guard<std::mutex> lock(mu_);
  std::uint64_t base = 0;
  if (Status r = ops_.reserve(s.size, granularity, &base); !r.ok()) return r;
  Mapped mapped{s.size, {}};
  // Undoes what this call did so far: a failed map leaves nothing behind.
  auto undo = [&](Status why) {
    for (const auto& [key, size] : mapped.chunks) {
      (void)ops_.unmap(base + (std::get<2>(key) - s.base), size);
      drop_use_locked(key);
    }
    (void)ops_.free_reservation(base, s.size);
    return why;
  };
  for (std::size_t i = 0; i < s.chunks.size(); ++i) {
    const Chunk& c = s.chunks[i];
    const ChunkKey key{owner, device, c.base, c.buffer_id};
    auto it = imports_.find(key);
    if (it == imports_.end()) {
      std::uint64_t handle = 0;
      if (Status im = ops_.import_fd(device, fds[i].get(), &handle); !im.ok()) return undo(im);
      it = imports_.emplace(key, Import{handle, 0}).first;
      ++imported_total_;
    }
    fds[i].reset();  // the import (or the earlier one) holds the allocation now
    if (Status m = ops_.map(device, base + (c.base - s.base), c.size, it->second.handle); !m.ok()) {
      if (it->second.uses == 0) {
        (void)ops_.release(it->second.handle);
        imports_.erase(it);
      }
      return undo(m);
    }
    ++it->second.uses;
    mapped.chunks.emplace_back(key, c.size);
  }
  spans_.emplace(base, std::move(mapped));
  *va = base;
  return {};
}

Status SpanImports::unmap(std::uint64_t va) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = spans_.find(va);
  if (it == spans_.end()) return {-1, "no span is mapped at " + std::to_string(va)};
  Status first;
  std::uint64_t offset = 0;
  for (const auto& [key, size] : it->second.chunks) {
    if (Status s = ops_.unmap(va + offset, size); !s.ok() && first.ok()) first = s;
    offset += size;
    drop_use_locked(key);
  }
  if (Status s = ops_.free_reservation(va, it->second.size); !s.ok() && first.ok()) first = s;
  spans_.erase(it);
  return first;
}

void SpanImports::drop_use_locked(const ChunkKey& key) {
  auto it = imports_.find(key);
  if (it == imports_.end()) return;
  if (--it->second.uses == 0) {
    (void)ops_.release(it->second.handle);
    imports_.erase(it);
  }
}

std::size_t SpanImports::chunks_imported_now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return imports_.size();
}

std::uint64_t SpanImports::chunks_imported_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return imported_total_;
}

std::size_t SpanImports::spans_mapped_now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_.size();
}

}  // namespace ferry::cuda
