// The receiver's side of a span passed by file descriptor (vmm_span.hpp): each chunk of a peer
// imported at most once (one import per allocation per peer, as with legacy IPC), and each span
// mapped into a reservation of its own size, never a mirror of the owner's whole segment.
//
// The import cache (import_cache.hpp) decides when a span is opened and closed, exactly as for a
// cudaMalloc block; this class does the opening and closing. A chunk two spans share is imported
// once and mapped in both; its import is released when the last span using it is unmapped.
// Thread-safe: one mutex, held across the calls (an open is rare: the import cache makes the
// steady state a hit).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/vmm_api.hpp"
#include "ipc/cuda/vmm_span.hpp"
#include "ipc/fd.hpp"

namespace ferry::cuda {

class SpanImports {
 public:
  explicit SpanImports(VmmOps& ops) : ops_(ops) {}

  // Maps span `s` of `owner` for `device`, from the fds its bundle carried (one per chunk, in
  // order). Chunks imported already are reused; their fds are just closed. On success *va is
  // where the span's base lies here. On failure nothing stays mapped or imported.
  Status map(const ProcessIdentity& owner, int device, const Span& s, std::vector<UniqueFd> fds,
             std::uint64_t* va);
  // Unmaps a span that map() mapped at `va`, releasing the imports nothing else maps.
  Status unmap(std::uint64_t va);

  // Read-outs for tests and statistics.
  std::size_t chunks_imported_now() const;
  std::uint64_t chunks_imported_total() const;
  std::size_t spans_mapped_now() const;

 private:
  using ChunkKey = std::tuple<ProcessIdentity, int, std::uint64_t, std::uint64_t>;
  struct Import {
    std::uint64_t handle;
    std::size_t uses;  // spans mapping it
  };
  struct Mapped {
    std::uint64_t size;
    std::vector<std::pair<ChunkKey, std::uint64_t>> chunks;  // key, size
  };
  void drop_use_locked(const ChunkKey& key);

  VmmOps& ops_;
  mutable std::mutex mu_;
  std::map<ChunkKey, Import> imports_;
  std::map<std::uint64_t, Mapped> spans_;  // by local base
  std::uint64_t imported_total_ = 0;
};

}  // namespace ferry::cuda
