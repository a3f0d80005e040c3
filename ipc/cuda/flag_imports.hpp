// The senders' flag buffers this process waits on (design invariant 6, the receiving side of
// ipc/cuda/timeline.hpp): each opened once per (owner, device) and kept while its owner lives,
// with, per slot, the highest value a stream of this process was made to wait for.
//
// A sender that dies with writes still queued never runs them, and a stream here waiting for one
// would wait for ever. So when the owner is found dead, the closer writes kReleaseValue into every
// slot waited on (owner_died() lists them) before it closes the buffer: the streams go on, and
// the tensors from that sender are marked as from a dead source (their contents are not to be
// trusted; sending one on raises PeerDead).
//
// Plain bookkeeping, no CUDA: the caller opens, writes and closes, under its own lock.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/ipc_api.hpp"

namespace ferry::cuda {

class FlagImports {
 public:
  struct Key {
    ProcessIdentity owner;
    Uuid device{};
    bool operator<(const Key& o) const noexcept;
  };

  // The buffer opened here for `k`, or null (then open it and add() it).
  void* find(const Key& k) const;
  void add(const Key& k, int device, void* local);
  // A stream here was made to wait for `value` in `slot` of k's buffer.
  void waited(const Key& k, std::uint32_t slot, std::uint64_t value);

  struct Release {
    int device = -1;
    void* local = nullptr;
    std::vector<std::uint32_t> slots;  // to set to kReleaseValue, then the buffer is closed
  };
  // `owner` exited: each of its buffers here, with the slots waited on; they are forgotten.
  std::vector<Release> owner_died(const ProcessIdentity& owner);
  // Owners of buffers open here, for a liveness check.
  std::vector<ProcessIdentity> owners() const;
  std::size_t size() const noexcept { return buffers_.size(); }

 private:
  struct Buffer {
    int device = -1;
    void* local = nullptr;
    std::map<std::uint32_t, std::uint64_t> waited;  // slot -> highest value waited for
  };
  std::map<Key, Buffer> buffers_;
};

}  // namespace ferry::cuda
