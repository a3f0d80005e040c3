// The sender's timeline counters (design invariant 6, ipc/cuda/sync_policy.hpp's memop): one flag
// buffer per (process, device), exported once, whose 64-bit slots each belong to one stream of
// this process. A send on a busy stream takes the next value of its stream's slot and has the
// stream write it there after its earlier work; the receiver's stream waits until the slot holds
// at least that value.
//
// A slot's values only grow: they are taken, and their writes queued, under the sender's lock,
// and one stream runs its writes in order. A stream is known by cuStreamGetId, unique for the
// process's life, so a stream destroyed and another made at its address never share a slot (the
// new one's writes could land before the old one's pending ones and take the value back).
//
// Plain bookkeeping: the buffer, its export and the writes are the caller's (CUDA calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

#include "ipc/wire.hpp"

namespace ferry::cuda {

// The value that ends every wait on a slot whatever it waits for: the largest positive int64
// (a GEQ wait compares cyclically). The closer writes it where a dead sender's writes never ran.
inline constexpr std::uint64_t kReleaseValue = 0x7fffffffffffffffull;

class Timeline {
 public:
  // Slots per device: 32 KiB of flags, far more streams than a process has.
  static constexpr std::uint32_t kSlots = wire::kFlagSlots;
  explicit Timeline(std::uint32_t slots = kSlots);

  struct Mark {
    std::uint32_t slot = 0;
    std::uint64_t value = 0;  // 1 for a slot's first write: the buffer starts zeroed
  };
  // The slot of stream `stream_id` (taken now for a stream not seen before) and the value its
  // next write takes; nullopt when every slot belongs to another stream.
  std::optional<Mark> next(std::uint64_t stream_id);
  // Whether next() would find a slot for `stream_id`.
  bool has_slot(std::uint64_t stream_id) const noexcept;
  std::size_t streams() const noexcept { return slots_.size(); }
  std::uint32_t capacity() const noexcept { return capacity_; }
  // Bytes of the flag buffer: one 64-bit word per slot.
  std::size_t bytes() const noexcept { return std::size_t{capacity_} * sizeof(std::uint64_t); }

 private:
  struct Slot {
    std::uint32_t index = 0;
    std::uint64_t last = 0;
  };
  std::uint32_t capacity_;
  std::map<std::uint64_t, Slot> slots_;  // by stream id
};

}  // namespace ferry::cuda
