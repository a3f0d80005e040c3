// What a receiver does with a CPU tensor it has claimed: keep a view of the sender's block, or
// copy it into its own memory and end the lease at once (design invariant 9). A view of a small
// block pins the sender's whole segment (64 MiB) for as long as the receiver keeps the tensor,
// and past the sender's death; a private copy of a block nobody else references costs a
// memcpy and is invisible to the user.
#pragma once

#include <cstdint>

namespace ferry {

enum class Receipt : std::uint8_t {
  view,      // a tensor over the sender's mapped block; the lease ends when the tensor dies
  copy_out,  // a copy in this process's heap; the lease ends now
};

// The rules, first match wins: a staged CUDA tensor (kFlagToDevice: moved to the device at
// once, its host view never kept) is a view; a block of a sender that has exited (its segments
// came from a queue's custody) is copied out, whatever its size or flags, as it would be moved
// into this process at the next check anyway, and a view would keep the dead sender's segment;
// copying on receipt turned off (copy_below 0) and a tensor the user shares deliberately (no
// kFlagCopied: another process may write it) are views; a copied block under copy_below bytes
// is copied out; a larger one is a view.
Receipt decide_receipt(std::uint32_t flags, std::uint64_t block_length, std::uint64_t copy_below,
                       bool sender_exited = false) noexcept;

// Blocks below this many bytes are copied on receipt unless FERRY_COPY_ON_RECEIPT_BELOW says
// otherwise (docs/benchmarks.md has the measurement behind it).
inline constexpr std::uint64_t kDefaultCopyOnReceiptBelow = std::uint64_t{64} << 10;
inline constexpr std::uint64_t kMaxCopyOnReceiptBelow = std::uint64_t{1} << 30;

// FERRY_COPY_ON_RECEIPT_BELOW (bytes, with an optional K/M/G unit; 0 turns copying off), or the
// default when unset. Throws Error(invalid_argument) naming the variable for a bad value.
std::uint64_t copy_on_receipt_below_from_env();

}  // namespace ferry
