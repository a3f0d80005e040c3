#include "runtime/tensor_codec.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/util/strides.h>

#include <cstring>
#include <string>

#include "ipc/error.hpp"
#include "ipc/process.hpp"
#include "ipc/receipt_policy.hpp"
#include "ipc/segment.hpp"
#include "ipc/stats.hpp"
#include "ipc/step_times.hpp"
#include "runtime/dtype.hpp"
#include "runtime/received_storages.hpp"

namespace ferry::detail {
namespace {

struct OwnedContext {
  std::shared_ptr<BlockHandle> handle;
};

struct ReceivedContext {
  std::shared_ptr<Segment> data;
  std::shared_ptr<Segment> ledger;
  std::uint32_t slot;
  std::uint32_t gen;
  pid_t holder;
  std::uint64_t owner_token;
};

void owned_deleter(void* ctx) {
  delete static_cast<OwnedContext*>(ctx);
}

void received_deleter(void* ctx) {
  const steps::Timed step("drop: a received CPU view");
  auto* c = static_cast<ReceivedContext*>(ctx);
  // A forked child's copy of a received tensor does not hold the lease; its parent does.
  if (c->holder == current_pid()) Ledger::release(*c->ledger, c->slot, c->gen, c->holder);
  delete c;
}

std::string where(std::size_t index) {
  return "tensor " + std::to_string(index) + " of the message";
}

}  // namespace

at::Tensor tensor_over(void* base, std::size_t nbytes, void* ctx, c10::DeleterFnPtr deleter,
                       c10::Device device, at::ScalarType dtype, at::IntArrayRef sizes,
                       at::IntArrayRef strides, std::int64_t storage_offset) {
  c10::DataPtr data(base, ctx, deleter, device);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), nullptr, false);
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(device))
      .set_(std::move(storage), storage_offset, sizes, strides);
}

c10::DataPtr arena_data_ptr(Arena& arena, std::size_t nbytes) {
  // Built in place: a temporary BlockHandle would free the block in its destructor.
  std::shared_ptr<BlockHandle> handle(new BlockHandle{&arena, arena.allocate(nbytes)});
  void* base = handle->block.data;
  return c10::DataPtr(base, new OwnedContext{std::move(handle)}, &owned_deleter,
                      c10::Device(c10::kCPU));
}

at::Tensor allocate_in_arena(Arena& arena, at::IntArrayRef sizes, at::IntArrayRef strides,
                             at::ScalarType dtype, std::size_t storage_bytes) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), storage_bytes,
                       arena_data_ptr(arena, storage_bytes), nullptr, false);
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(c10::kCPU))
      .set_(std::move(storage), 0, sizes, strides);
}

at::Tensor copy_to_arena(Arena& arena, const at::Tensor& t) {
  // A dense tensor's elements are one span of bytes starting at data_ptr() (strides are never
  // negative), so copying that span into a block with the same strides reproduces the layout
  // exactly, at memcpy speed. Lazy conjugate or negative views must be resolved by copy_.
  if (t.is_non_overlapping_and_dense() && !t.is_conj() && !t.is_neg()) {
    at::Tensor out = allocate_in_arena(arena, t.sizes(), t.strides(), t.scalar_type(), t.nbytes());
    if (t.nbytes() > 0) std::memcpy(out.data_ptr(), t.data_ptr(), t.nbytes());
    return out;
  }
  // Gapped views (t[:, ::2]) are packed contiguously rather than shipping the bytes between
  // their elements.
  return allocate_in_arena(arena, t.sizes(), c10::contiguous_strides(t.sizes()), t.scalar_type(),
                           t.nbytes())
      .copy_(t);
}

std::shared_ptr<BlockHandle> arena_block_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &owned_deleter) return nullptr;
  auto& handle = static_cast<OwnedContext*>(dp.get_context())->handle;
  return handle->arena->pid() == current_pid() ? handle : nullptr;
}

bool is_received(const at::Tensor& t) {
  return t.defined() && t.has_storage() &&
         t.storage().data_ptr().get_deleter() == &received_deleter;
}

bool in_shared_memory(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  const auto deleter = t.storage().data_ptr().get_deleter();
  return deleter == &owned_deleter || deleter == &received_deleter;
}

std::uint64_t received_owner(const c10::DataPtr& data) {
  if (data.get_deleter() != &received_deleter) return 0;
  return static_cast<const ReceivedContext*>(data.get_context())->owner_token;
}

void check_sendable(const at::Tensor& t, std::size_t index) {
  if (!t.defined()) throw Error(Errc::invalid_argument, where(index) + " is undefined");
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    throw Error(Errc::invalid_argument, where(index) + " is on " + t.device().str() +
                                            "; ferry carries CPU and CUDA tensors: send t.cpu()");
  }
  if (t.layout() != at::kStrided) {
    throw Error(Errc::invalid_argument,
                where(index) + " is sparse; send t.to_dense() or its indices and values");
  }
  if (t.dim() > wire::kMaxDims) {
    throw Error(Errc::invalid_argument, where(index) + " has " + std::to_string(t.dim()) +
                                            " dimensions, more than ferry's limit of " +
                                            std::to_string(wire::kMaxDims) + "; reshape it");
  }
}

void describe_view(const at::Tensor& t, wire::Record& r) {
  r.dtype = to_wire_dtype(t.scalar_type());
  r.rank = static_cast<std::uint8_t>(t.dim());
  r.block_length = t.storage().nbytes();
  r.storage_offset = t.storage_offset();
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    r.sizes[d] = t.size(d);
    r.strides[d] = t.stride(d);
  }
}

Outgoing describe_in_arena(const at::Tensor& shared, std::shared_ptr<BlockHandle> block,
                           Arena& arena) {
  Outgoing out{wire::make_record(), {}, std::nullopt};
  wire::Record& r = out.record;
  describe_view(shared, r);
  r.device_type = static_cast<std::uint8_t>(wire::DeviceType::cpu);
  r.device_index = -1;
  r.owner_token = process_token();
  r.owner_pid = current_pid();
  r.segment_seq = block->block.segment_seq;
  r.segment_size = arena.segment(block->block.segment_seq)->size();
  r.block_offset = block->block.offset;
  const std::uint32_t segment = block->block.segment_seq;
  out.lease = arena.ledger().acquire(std::move(block), segment);
  r.lease_slot = out.lease.slot;
  r.lease_gen = out.lease.gen;
  return out;
}

void count_copy(CopyReason reason, std::size_t bytes) {
  auto& c = counters();
  bump(c.tensors_copied);
  bump(c.bytes_copied, bytes);
  bump(c.copies_by_reason[static_cast<int>(reason)]);
}

Outgoing encode(const at::Tensor& t, std::size_t index, Arena& arena, bool detached) {
  check_sendable(t, index);
  std::shared_ptr<BlockHandle> block = detached ? nullptr : arena_block_of(t);
  if (block) return describe_in_arena(t, std::move(block), arena);
  const CopyReason reason =
      detached         ? CopyReason::detached
      : is_received(t) ? CopyReason::received
      : t.has_storage() && t.storage().data_ptr().get_deleter() == &owned_deleter
          ? CopyReason::foreign_arena
          : CopyReason::not_shared;
  at::Tensor shared = copy_to_arena(arena, t);
  Outgoing out = describe_in_arena(shared, arena_block_of(shared), arena);
  out.record.flags = wire::kFlagCopied;
  out.copied = reason;
  return out;
}

std::uint64_t copy_on_receipt_below() {
  // Read once per process (a forked child keeps its parent's value).
  static const std::uint64_t below = copy_on_receipt_below_from_env();
  return below;
}

at::Tensor decode(const wire::Record& r, std::shared_ptr<Segment> data,
                  std::shared_ptr<Segment> ledger, pid_t holder, bool sender_exited) {
  const std::uint64_t copy_below = copy_on_receipt_below();
  const at::ScalarType dtype = from_wire_dtype(r.dtype);
  std::byte* base = data->data() + r.block_offset;
  const at::IntArrayRef sizes(r.sizes, r.rank);
  const at::IntArrayRef strides(r.strides, r.rank);
  const c10::Device cpu(c10::kCPU);
  if (decide_receipt(r.flags, r.block_length, copy_below, sender_exited) == Receipt::copy_out) {
    // The whole block, so the copy keeps the record's strides and storage offset exactly.
    c10::DataPtr own = c10::GetCPUAllocator()->allocate(r.block_length);
    if (r.block_length > 0) std::memcpy(own.get(), base, r.block_length);
    c10::Storage storage(c10::Storage::use_byte_size_t(), r.block_length, std::move(own),
                         c10::GetCPUAllocator(), true);
    at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype).device(cpu))
                       .set_(std::move(storage), r.storage_offset, sizes, strides);
    Ledger::release(*ledger, r.lease_slot, r.lease_gen, holder);
    bump(counters().tensors_copied_on_receipt);
    bump(counters().bytes_copied_on_receipt, r.block_length);
    return t;
  }
  auto* ctx = new ReceivedContext{std::move(data), std::move(ledger), r.lease_slot, r.lease_gen,
                                  holder,          r.owner_token};
  at::Tensor t = tensor_over(base, r.block_length, ctx, &received_deleter, cpu, dtype, sizes,
                             strides, r.storage_offset);
  if (r.owner_token != process_token()) track_received(t.storage(), r.owner_token, r.owner_pid);
  return t;
}

}  // namespace ferry::detail
