// The receiver's import cache (design invariant 3): each peer's cudaMalloc block is opened at
// most once in this process, and every tensor from it is a view at base + offset.
//
// Plain bookkeeping, no CUDA: the caller makes the calls the cache asks for (open, close)
// outside its lock and reports back. One mutex, held by the caller around every method.
//
// An entry's life:
//
//   (none) --acquire: miss--> OPENING --opened--> OPEN --last view dropped--> IDLE
//   IDLE --acquire: hit--> OPEN (a new tensor of the block within the linger)
//   IDLE --take_work, linger passed--> CLOSING --closed--> (none)
//   OPENING --open_failed--> (none)
//
// A view's lease ends once the device is done with the view (release_policy.hpp: the dropping
// thread releases it at once when the view's stream is idle, or hands it to the closer with an
// event to poll); the rest are handed to the cache here, for the closer to release after it has
// waited for the device: the sender may reuse the memory the moment the lease ends.
// The mapping itself outlives its last view by a short linger, so a stream of tensors from one
// allocation (a caching allocator's segment) pays for one open, not one per tensor; it holds no
// lease, so the sender's memory is not kept by it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/ipc_api.hpp"

namespace ferry {
class Segment;
}

namespace ferry::cuda {

// A block, named so that a reused address never matches a freed block's entry.
struct BlockKey {
  ProcessIdentity owner;
  Uuid device{};
  std::uint64_t base = 0;
  std::uint64_t size = 0;
  std::uint64_t buffer_id = 0;
  bool operator<(const BlockKey& o) const noexcept;
  bool operator==(const BlockKey& o) const noexcept;
  // Same owner, device and address: a reused address is a different block at the same place.
  bool same_place(const BlockKey& o) const noexcept;
};

// A lease this process holds on a peer's ledger.
struct LeaseRef {
  int device = -1;  // where its view lived: the closer waits for this device before releasing
  std::shared_ptr<Segment> ledger;
  std::uint32_t slot = 0;
  std::uint32_t gen = 0;
};

class ImportCache {
 public:
  using EntryId = std::uint64_t;
  enum class State : std::uint8_t { opening, open, idle, closing };

  // What to do with the block a record names.
  struct Lookup {
    enum Action : std::uint8_t {
      use,   // already open: make a view at `local` + offset
      open,  // open it, then report opened() or open_failed()
      wait,  // another thread is opening or closing it: wait, then acquire again
    } action = use;
    EntryId id = 0;
    void* local = nullptr;
  };
  // Takes a view on the block for one received tensor (not for `wait`). A miss also marks IDLE
  // entries at the same place stale: their block was freed and its address reused, so they
  // can never be hit again and go to the closer at once.
  Lookup acquire(const BlockKey& key);
  void opened(EntryId id, int device, void* local);
  void open_failed(EntryId id);

  using Clock = std::chrono::steady_clock;

  // The view's storage died: its lease, where given, goes to the closer (which waits for the
  // device first). True when the entry became IDLE.
  bool drop_view(EntryId id, std::optional<LeaseRef> lease, Clock::time_point now);

  // A lease held for something other than a view of a cached block (a copy this process sent
  // itself): the closer releases it with the next batch.
  void release_later(LeaseRef lease) { release_.push_back(std::move(lease)); }

  // The closer's batch: leases whose views died, IDLE entries idle for `linger` now CLOSING,
  // and those acquire() marked stale. The caller synchronises, closes, then calls closed().
  struct Closing {
    EntryId id;
    int device;
    void* local;
  };
  struct Work {
    std::vector<LeaseRef> release;
    std::vector<Closing> close;
    bool empty() const noexcept { return release.empty() && close.empty(); }
  };
  Work take_work(Clock::time_point now, Clock::duration linger);
  void closed(EntryId id);
  // When the next IDLE entry's linger ends, if any is idle.
  std::optional<Clock::time_point> next_close(Clock::duration linger) const;

  // The owner exited: its entries are marked, so later use of their views can be refused.
  // Returns how many entries it had here.
  std::size_t owner_died(const ProcessIdentity& owner);
  bool owner_dead(EntryId id) const;
  // Owners of entries that are open now, for a liveness check.
  std::vector<ProcessIdentity> owners() const;

  // Read-outs for tests and statistics.
  std::size_t size() const noexcept { return entries_.size(); }
  const BlockKey* key_of(EntryId id) const;
  State state_of(EntryId id) const;
  std::size_t views_of(EntryId id) const;

 private:
  struct Entry {
    BlockKey key;
    State state = State::opening;
    int device = -1;
    void* local = nullptr;
    std::size_t views = 0;
    bool owner_dead = false;
    Clock::time_point idle_since{};
  };
  Entry* find(EntryId id);
  const Entry* find(EntryId id) const;

  EntryId next_id_ = 1;
  std::map<EntryId, Entry> entries_;
  std::map<BlockKey, EntryId> by_key_;
  std::vector<LeaseRef> release_;
  std::vector<EntryId> stale_;  // marked CLOSING by acquire(), not yet handed to the closer
};

}  // namespace ferry::cuda
