#include "runtime/shared_tensor.hpp"

#include <c10/util/strides.h>

#include "ipc/error.hpp"
#include "runtime/tensor_codec.hpp"

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

at::Tensor to_shared(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided) {
    throw Error(Errc::invalid_argument,
                "to_shared takes a dense CPU tensor; call .cpu() or .to_dense() first");
  }
  return detail::copy_to_arena(Arena::local(), t);
}

bool is_shared(const at::Tensor& t) {
  return detail::arena_block_of(t) != nullptr;
}

ArenaStats arena_stats() {
  Arena& arena = Arena::local();
  Ledger& ledger = arena.ledger();
  ledger.reclaim(true);
  const Arena::Stats s = arena.stats();
  ArenaStats out;
  out.segments = s.segments;
  out.bytes_reserved = s.bytes_reserved;
  out.bytes_in_use = s.bytes_in_use;
  out.blocks_in_use = s.blocks_in_use;
  out.leases_outstanding = ledger.outstanding();
  return out;
}

}  // namespace ferry
