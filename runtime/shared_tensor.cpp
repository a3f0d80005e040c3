#include "runtime/shared_tensor.hpp"

#include <c10/util/strides.h>

#include <cstring>

#include "ipc/error.hpp"
#include "runtime/transport/shm_cpu/storages.hpp"
#include "runtime/transport/transport.hpp"

namespace ferry {

at::Tensor empty_shared(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.has_device() && !options.device().is_cpu()) {
    throw Error(Errc::invalid_argument, "empty_shared makes CPU tensors; device " +
                                            options.device().str() + " was asked for");
  }
  if (options.layout() != at::kStrided) {
    throw Error(Errc::invalid_argument, "empty_shared makes dense (strided) tensors");
  }
  std::uint64_t numel = 1;
  for (std::int64_t s : sizes) {
    if (s < 0) {
      throw Error(Errc::invalid_argument, "empty_shared: size " + std::to_string(s) + " in " +
                                              c10::str(sizes) + " is negative");
    }
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(s), &numel)) {
      throw Error(Errc::invalid_argument, "empty_shared: " + c10::str(sizes) + " overflows");
    }
  }
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  const std::size_t nbytes = numel * c10::elementSize(dtype);
  auto contiguous = c10::contiguous_strides(sizes);
  auto t = detail::allocate_in_arena(Arena::local(), sizes, contiguous, dtype, nbytes);
  return options.requires_grad() ? t.requires_grad_() : t;
}

at::Tensor empty_for_sending(std::int64_t bytes) {
  if (bytes < 0) {
    throw Error(Errc::invalid_argument,
                "empty_for_sending: " + std::to_string(bytes) + " bytes is negative");
  }
  // A buffer made outside the arena is copied when sent: choose() says whether into a block of
  // the arena (then better made there) or into the record itself.
  detail::Sending facts;
  facts.contiguous = true;
  facts.bytes = static_cast<std::uint64_t>(bytes);
  if (detail::choose(facts) == detail::Carrier::in_record) return at::empty({bytes}, at::kByte);
  return empty_shared({bytes}, at::kByte);
}

at::Tensor to_shared(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided) {
    throw Error(Errc::invalid_argument,
                "to_shared takes a dense CPU tensor; call .cpu() or .to_dense() first");
  }
  return detail::copy_to_arena(Arena::local(), t);
}

at::Tensor share_(const at::Tensor& t) {
  if (!t.defined()) throw Error(Errc::invalid_argument, "share_ of an undefined tensor");
  if (t.is_cuda()) return t;  // CUDA memory travels by IPC handle as it is
  if (!t.device().is_cpu() || t.layout() != at::kStrided) {
    throw Error(Errc::invalid_argument, "share_ takes a dense CPU or CUDA tensor, not a " +
                                            c10::str(t.layout()) + " one on " + t.device().str());
  }
  if (!t.has_storage() || detail::in_shared_memory(t)) return t;
  c10::Storage storage = t.storage();
  const std::size_t nbytes = storage.nbytes();
  if (nbytes == 0) return t;
  c10::DataPtr fresh = detail::arena_data_ptr(Arena::local(), nbytes);
  std::memcpy(fresh.get(), storage.data_ptr().get(), nbytes);
  // The old buffer is freed here: a storage swapped under a concurrent reader is the caller's
  // race, as with torch's share_memory_().
  storage.set_data_ptr_noswap(std::move(fresh));
  // A resize would reallocate with the old allocator, out of shared memory, unseen by peers.
  storage.unsafeGetStorageImpl()->set_resizable(false);
  return t;
}

bool is_shared(const at::Tensor& t) {
  return detail::arena_block_of(t) != nullptr;
}

ArenaStats arena_stats() {
  Arena& arena = Arena::local();
  Ledger* ledger = arena.existing_ledger();
  if (ledger) ledger->reclaim(true);
  const Arena::Stats s = arena.stats();
  ArenaStats out;
  out.segments = s.segments;
  out.bytes_reserved = s.bytes_reserved;
  out.bytes_in_use = s.bytes_in_use;
  out.blocks_in_use = s.blocks_in_use;
  out.leases_outstanding = ledger ? ledger->outstanding() : 0;
  out.bytes_returned = s.bytes_returned;
  return out;
}

}  // namespace ferry
