#include "runtime/transport/shm_cpu/storages.hpp"

#include <c10/util/strides.h>

#include <pthread.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "ipc/ledger.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/step_times.hpp"
#include "runtime/transport/dtype.hpp"
#include "runtime/transport/tensor_view.hpp"

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

// Born-shared blocks by address: their DataPtr's context is the address itself.
struct BornShared {
  std::mutex mu;
  std::unordered_map<const void*, std::shared_ptr<BlockHandle>> blocks;
};
BornShared& born_shared() {
  static auto* b = new BornShared;  // never destroyed: tensors may die after static destructors
  return *b;
}
// A forked child finds the table unlocked, whichever thread held it at the fork.
[[maybe_unused]] const int g_born_shared_atfork =
    pthread_atfork([] { born_shared().mu.lock(); }, [] { born_shared().mu.unlock(); },
                   [] { born_shared().mu.unlock(); });

std::shared_ptr<BlockHandle> born_shared_block(const void* data) {
  BornShared& b = born_shared();
  std::lock_guard<std::mutex> lock(b.mu);
  auto it = b.blocks.find(data);
  return it == b.blocks.end() ? nullptr : it->second;
}

void born_shared_deleter(void* data) {
  release_born_shared(data);
}

}  // namespace

c10::DataPtr born_shared_data_ptr(Arena& arena, Arena::Block block) {
  auto handle = std::make_shared<BlockHandle>(&arena, block);
  void* data = block.data;
  {
    BornShared& b = born_shared();
    std::lock_guard<std::mutex> lock(b.mu);
    b.blocks[data] = std::move(handle);
  }
  return c10::DataPtr(data, data, &born_shared_deleter, c10::Device(c10::kCPU));
}

bool release_born_shared(void* data) noexcept {
  std::shared_ptr<BlockHandle> handle;
  {
    BornShared& b = born_shared();
    std::lock_guard<std::mutex> lock(b.mu);
    auto it = b.blocks.find(data);
    if (it == b.blocks.end()) return false;
    handle = std::move(it->second);
    b.blocks.erase(it);
  }
  return true;  // the block goes back to the arena here, outside the table's lock, unless leased
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
  std::shared_ptr<BlockHandle> handle;
  if (dp.get_deleter() == &owned_deleter) {
    handle = static_cast<OwnedContext*>(dp.get_context())->handle;
  } else if (dp.get_deleter() == &born_shared_deleter) {
    handle = born_shared_block(dp.get());
  }
  return handle && handle->arena->pid() == current_pid() ? handle : nullptr;
}

bool in_an_arena(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  const auto deleter = t.storage().data_ptr().get_deleter();
  return deleter == &owned_deleter || deleter == &born_shared_deleter;
}

at::Tensor received_view(const wire::Record& r, std::shared_ptr<Segment> data,
                         std::shared_ptr<Segment> ledger, pid_t holder) {
  std::byte* base = data->data() + r.block_offset;
  auto* ctx = new ReceivedContext{std::move(data), std::move(ledger), r.lease_slot, r.lease_gen,
                                  holder,          r.owner_token};
  return tensor_over(base, r.block_length, ctx, &received_deleter, c10::Device(c10::kCPU),
                     from_wire_dtype(r.dtype), at::IntArrayRef(r.sizes, r.rank),
                     at::IntArrayRef(r.strides, r.rank), r.storage_offset);
}

bool is_received(const at::Tensor& t) {
  return t.defined() && t.has_storage() &&
         t.storage().data_ptr().get_deleter() == &received_deleter;
}

bool in_shared_memory(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  const auto deleter = t.storage().data_ptr().get_deleter();
  return deleter == &owned_deleter || deleter == &born_shared_deleter ||
         deleter == &received_deleter;
}

std::uint64_t received_owner(const c10::DataPtr& data) {
  if (data.get_deleter() != &received_deleter) return 0;
  return static_cast<const ReceivedContext*>(data.get_context())->owner_token;
}

}  // namespace ferry::detail
