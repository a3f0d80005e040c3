#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/import_cache.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/error.hpp"
#include "ipc/peer_segments.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"
#include "ipc/step_times.hpp"
#include "runtime/transport/cuda_ipc/calls.hpp"
#include "runtime/transport/cuda_ipc/cuda_ipc.hpp"
#include "runtime/transport/cuda_ipc/importer.hpp"
#include "runtime/transport/cuda_ipc/sender.hpp"
#include "runtime/transport/cuda_ipc/spans.hpp"
#include "runtime/transport/cuda_ipc/stream.hpp"
#include "runtime/transport/dtype.hpp"
#include "runtime/transport/tensor_view.hpp"

namespace ferry {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
using cuda::ImportCache;

constexpr auto kFetchTimeout = std::chrono::seconds(5);
constexpr auto kImportTimeout = std::chrono::seconds(10);

cuda::ProcessIdentity owner_identity(const wire::Record& r) {
  cuda::ProcessIdentity id;
  id.pid = r.owner_pid;
  id.pid_ns = r.owner_pid_ns;
  std::memcpy(id.boot_id.data(), r.owner_boot_id, id.boot_id.size());
  return id;
}

bool from_this_process(const wire::Record& r) {
  return r.owner_pid == current_pid() && r.owner_token == process_token();
}

// This process's ordinal of the device a record names, by UUID (CUDA_VISIBLE_DEVICES may order
// devices differently in the sender).
int local_device(const std::uint8_t* uuid_bytes) {
  cuda::Uuid uuid{};
  std::memcpy(uuid.data(), uuid_bytes, uuid.size());
  // Asked once per device: the lookup reads every device's properties.
  static std::mutex mu;
  static std::map<cuda::Uuid, int> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(uuid);
  if (it == known.end()) it = known.emplace(uuid, cuda::device_with_uuid(uuid)).first;
  const int d = it->second;
  if (d < 0) {
    throw Error(Errc::invalid_argument,
                "the sender's device " + cuda::uuid_string(uuid_bytes) +
                    " is not visible in this process (CUDA_VISIBLE_DEVICES?): make it visible, "
                    "or have the sender send t.cpu()");
  }
  return d;
}

void require_cuda_torch() {
  if (!at::hasCUDA()) {
    throw Error(Errc::invalid_argument,
                "a CUDA tensor arrived, but this process's LibTorch has no CUDA: receive on a "
                "CUDA-capable process, or tell the sender this receiver is CPU-only");
  }
}

// A record this process sent to itself. A handle cannot be opened in the process that exported
// it. If the sender already copied for us (it knew the receiver was this process), the copy is
// ours alone: view it, and let its lease end through the closer like a peer's. Otherwise the
// record names the sender's own storage, which must not be aliased behind its back: copy it here.
at::Tensor decode_own(const wire::Record& r, std::shared_ptr<Segment> ledger, pid_t me) {
  const at::ScalarType dtype = from_wire_dtype(r.dtype);
  const at::IntArrayRef sizes(r.sizes, r.rank);
  const at::IntArrayRef strides(r.strides, r.rank);
  const int device = r.device_index;
  cuda::BlockInfo b;
  check(cuda::block_of(reinterpret_cast<void*>(r.cuda_base), &b),
        "locating this process's allocation");
  if (b.base != r.cuda_base) {
    throw Error(Errc::bad_record, "cuda_base does not start an allocation of this process");
  }
  // A span passed by fd is this process's own chunks, contiguous from cuda_base.
  const std::size_t mapped = (r.flags & wire::kFlagByFd) ? r.segment_size : b.size;
  if (std::string e = wire::validate_location(r, mapped); !e.empty()) {
    throw Error(Errc::bad_record, e);
  }
  void* data = reinterpret_cast<std::byte*>(r.cuda_base) + r.block_offset;
  const c10::Device where(c10::kCUDA, static_cast<c10::DeviceIndex>(device));
  if (r.flags & wire::kFlagCopied) {
    Importer& im = importer();
    {
      std::lock_guard<std::mutex> lock(im.mu);
      im.start_closer_locked();
    }
    auto* ctx = new LocalView{
        &im, cuda::LeaseRef{device, std::move(ledger), r.lease_slot, r.lease_gen}, me};
    return tensor_over(data, r.block_length, ctx, &local_view_deleter, where, dtype, sizes, strides,
                       r.storage_offset);
  }
  // The storage as a flat span, then the record's view on it (offset included).
  const auto elements = static_cast<std::int64_t>(r.block_length / wire::element_size(r.dtype));
  at::Tensor view = at::from_blob(data, {elements}, at::TensorOptions().dtype(dtype).device(where))
                        .as_strided(sizes, strides, r.storage_offset);
  at::Tensor copy = copy_on_device(view);
  // The lease may end only once the copy has read the block.
  check(cuda::stream_synchronize(current_cuda_stream(device)), "copying a same-process tensor");
  Ledger::release(*ledger, r.lease_slot, r.lease_gen, me);
  count_copy(CopyReason::same_process, copy.nbytes());
  return copy;
}

// Makes the current stream wait on the sender's interprocess event (sync event).
void wait_on_event(const wire::Record& r, int device, void* stream) {
  void* event = nullptr;
  if (from_this_process(r)) {
    // This process's own event: the pool has it (a handle cannot be opened where it was made).
    Sender& s = sender();
    std::lock_guard<std::mutex> lock(s.mu);
    event = s.events.event_at(device, r.event_slot);
  } else {
    cuda::IpcHandle handle{};
    std::memcpy(handle.data(), r.event_handle, handle.size());
    Importer& im = importer();
    std::lock_guard<std::mutex> lock(im.mu);
    const EventKey key{owner_identity(r), device, r.event_slot};
    auto it = im.events.find(key);
    if (it != im.events.end() && it->second.handle != handle) {
      // The sender's pool slot holds another event now (it was recreated): reopen.
      (void)cuda::destroy_event(device, it->second.event);
      im.events.erase(it);
      it = im.events.end();
    }
    if (it == im.events.end()) {
      check(cuda::open_event_handle(device, handle, &event), "opening the sender's event");
      it = im.events.emplace(key, OpenedEvent{handle, event}).first;
    }
    event = it->second.event;
  }
  if (event == nullptr) {
    throw Error(Errc::bad_record,
                "event slot " + std::to_string(r.event_slot) + " names no event of the sender");
  }
  check(cuda::stream_wait_event(stream, event), "waiting on the sender's event");
}

// Makes the current stream wait until the sender's flag slot holds the record's value (sync
// memop): the sender's stream writes it after the tensor's last write.
void wait_on_flag(const wire::Record& r, int device, void* stream) {
  void* buffer = nullptr;
  if (from_this_process(r)) {
    Sender& s = sender();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.flags.find(r.device_index);
    if (it != s.flags.end()) buffer = it->second.buffer;
  } else {
    Importer& im = importer();
    std::lock_guard<std::mutex> lock(im.mu);
    im.start_closer_locked();  // it releases these waits if the sender dies first
    cuda::FlagImports::Key key{owner_identity(r), {}};
    std::memcpy(key.device.data(), r.device_uuid, key.device.size());
    buffer = im.flags.find(key);
    if (buffer == nullptr) {
      // Once per sender and device, for the sender's life: under the lock, so no second open.
      cuda::IpcHandle handle{};
      std::memcpy(handle.data(), r.event_handle, handle.size());
      std::size_t mapped = 0;
      check(cuda::open_mem_handle(device, handle, &buffer, &mapped),
            "opening the sender's flag buffer");
      if (mapped < std::size_t{wire::kFlagSlots} * sizeof(std::uint64_t)) {
        (void)cuda::close_mem_handle(device, buffer);
        throw Error(Errc::bad_record, "the sender's flag buffer is " + std::to_string(mapped) +
                                          " bytes, less than its " +
                                          std::to_string(wire::kFlagSlots) + " slots");
      }
      im.flags.add(key, device, buffer);
      bump(counters().cuda_flag_buffers_opened);
    }
    im.flags.waited(key, r.event_slot, r.flag_value);
  }
  if (buffer == nullptr) {
    throw Error(Errc::bad_record, "a memop record of this process names no flag buffer of cuda:" +
                                      std::to_string(r.device_index));
  }
  check(cuda::stream_wait_value(stream, static_cast<std::uint64_t*>(buffer) + r.event_slot,
                                r.flag_value),
        "waiting on the sender's flag");
  bump(counters().cuda_memop_waits);
}

}  // namespace

std::shared_ptr<Segment> claim_cuda(const wire::Record& r, pid_t me) {
  const steps::Timed step("recv: claim a CUDA record (in the pop)");
  require_cuda_torch();
  if (r.sync == wire::kSyncEvent || r.sync == wire::kSyncMemop) {
    const int device = from_this_process(r) ? r.device_index : local_device(r.device_uuid);
    void* stream = current_cuda_stream(device);
    if (r.sync == wire::kSyncEvent) {
      wait_on_event(r, device, stream);
    } else {
      wait_on_flag(r, device, stream);
    }
  }
  std::shared_ptr<Segment> ledger;
  try {
    ledger = map_peer_segment(r.owner_pid, r.owner_token, wire::kCudaLedgerSeq, 0, kFetchTimeout);
  } catch (const Error& e) {
    if (e.code() != Errc::peer_dead) throw;
    // Device memory is its process's: no custody can keep it (docs/cuda.md, "When a process
    // dies").
    throw Error(Errc::peer_dead,
                "a CUDA tensor's sender (pid " + std::to_string(r.owner_pid) +
                    ") died before it was taken, and its device memory went with it; for a "
                    "message that must outlive a sender that may be killed, send a CPU copy "
                    "(t.cpu()), which the queue keeps, and move it to the device on arrival");
  }
  if (!Ledger::claim(*ledger, r.lease_slot, r.lease_gen, me)) {
    throw Error(Errc::bad_record, "CUDA lease " + std::to_string(r.lease_slot) + "/" +
                                      std::to_string(r.lease_gen) + " of pid " +
                                      std::to_string(r.owner_pid) + " does not match the record");
  }
  return ledger;
}

at::Tensor decode_cuda(const wire::Record& r, std::shared_ptr<Segment> ledger, pid_t me) {
  const steps::Timed step("recv: decode a CUDA record");
  const at::ScalarType dtype = from_wire_dtype(r.dtype);
  const at::IntArrayRef sizes(r.sizes, r.rank);
  const at::IntArrayRef strides(r.strides, r.rank);

  if (from_this_process(r)) return decode_own(r, std::move(ledger), me);

  const int device = local_device(r.device_uuid);
  cuda::BlockKey key;
  key.owner = owner_identity(r);
  std::memcpy(key.device.data(), r.device_uuid, key.device.size());
  key.base = r.cuda_base;
  key.size = r.segment_size;
  key.buffer_id = r.cuda_buffer_id;

  Importer& im = importer();
  std::unique_lock<std::mutex> lock(im.mu);
  im.start_closer_locked();
  const auto deadline = Clock::now() + kImportTimeout;
  ImportCache::Lookup look;
  for (;;) {
    look = im.cache.acquire(key);
    if (look.action != ImportCache::Lookup::wait) break;
    im.work.notify_one();
    if (im.changed.wait_until(lock, deadline) == std::cv_status::timeout) {
      throw Error(Errc::timeout, "a peer's CUDA allocation stayed busy opening or closing for " +
                                     std::to_string(kImportTimeout.count()) + " s");
    }
  }
  void* local = look.local;
  if (look.action == ImportCache::Lookup::open && (r.flags & wire::kFlagByFd)) {
    lock.unlock();
    std::uint64_t va = 0;
    try {
      va = open_span(im.spans, r, key.owner, device);
    } catch (...) {
      lock.lock();
      im.cache.open_failed(look.id);
      im.changed.notify_all();
      throw;
    }
    lock.lock();
    local = reinterpret_cast<void*>(va);
    im.cache.opened(look.id, device, local);
    im.span_entries.insert(look.id);
    im.changed.notify_all();
  } else if (look.action == ImportCache::Lookup::open) {
    lock.unlock();
    cuda::IpcHandle handle{};
    std::memcpy(handle.data(), r.mem_handle, handle.size());
    std::size_t mapped = 0;
    cuda::Status st = cuda::open_mem_handle(device, handle, &local, &mapped);
    std::string bad;
    if (st.ok()) {
      bad = wire::validate_location(r, mapped);
      if (!bad.empty()) (void)cuda::close_mem_handle(device, local);
    }
    lock.lock();
    if (!st.ok() || !bad.empty()) {
      im.cache.open_failed(look.id);
      im.changed.notify_all();
      if (!bad.empty()) throw Error(Errc::bad_record, bad);
      if (st.already_mapped()) {
        // The sender learns from the refusal and copies this allocation for us from now on.
        Ledger::refuse(*ledger, r.lease_slot, r.lease_gen, me);
        throw Error(Errc::system,
                    "the sender's CUDA allocation is already open in this process outside ferry "
                    "(e.g. by torch.multiprocessing), so this message cannot be read; the sender "
                    "is told, and copies that allocation for this process from now on when it "
                    "knows its receiver (a pool does). Send it detached to avoid it. " +
                        st.error);
      }
      throw Error(Errc::system, "opening a peer's CUDA allocation: " + st.error);
    }
    im.cache.opened(look.id, device, local);
    im.changed.notify_all();
    bump(counters().cuda_handles_opened);
  } else {
    bump(counters().cuda_handle_cache_hits);
  }
  lock.unlock();

  auto* ctx = new CudaView{
      &im, look.id, cuda::LeaseRef{device, std::move(ledger), r.lease_slot, r.lease_gen}, me};
  // From here the storage owns ctx: on any failure its deleter hands the lease to the closer.
  return tensor_over(static_cast<std::byte*>(local) + r.block_offset, r.block_length, ctx,
                     &cuda_view_deleter,
                     c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)), dtype, sizes,
                     strides, r.storage_offset);
}

at::Tensor to_staged_device(const at::Tensor& host, const wire::Record& r) {
  require_cuda_torch();
  const int device = local_device(r.device_uuid);
  return host.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

bool is_cuda_received(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  const auto deleter = t.storage().data_ptr().get_deleter();
  return deleter == &cuda_view_deleter || deleter == &local_view_deleter;
}

bool cuda_source_alive(const at::Tensor& t) {
  // Only a view on a peer's allocation can outlive its source.
  if (!t.defined() || !t.has_storage() ||
      t.storage().data_ptr().get_deleter() != &cuda_view_deleter) {
    return true;
  }
  auto* v = static_cast<CudaView*>(t.storage().data_ptr().get_context());
  std::lock_guard<std::mutex> lock(v->importer->mu);
  return !v->importer->cache.owner_dead(v->entry);
}

void cuda_peer_exited(pid_t pid) {
  Importer* existing = existing_importer();
  if (existing == nullptr) return;
  Importer& im = *existing;
  std::lock_guard<std::mutex> lock(im.mu);
  for (const auto& owner : im.cache.owners()) {
    if (owner.pid == pid && !process_alive(pid)) im.owner_exited_locked(owner);
  }
}

}  // namespace detail
}  // namespace ferry
