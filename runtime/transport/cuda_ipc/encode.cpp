#include <c10/util/strides.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "ipc/arena.hpp"
#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/cuda/send_policy.hpp"
#include "ipc/cuda/span_export.hpp"
#include "ipc/cuda/sync_policy.hpp"
#include "ipc/cuda/timeline.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"
#include "ipc/step_times.hpp"
#include "runtime/transport/cuda_ipc/calls.hpp"
#include "runtime/transport/cuda_ipc/cuda_ipc.hpp"
#include "runtime/transport/cuda_ipc/sender.hpp"
#include "runtime/transport/cuda_ipc/spans.hpp"
#include "runtime/transport/cuda_ipc/stream.hpp"
#include "runtime/transport/shm_cpu/shm_cpu.hpp"
#include "runtime/transport/tensor_view.hpp"

namespace ferry::detail {

namespace {

// What decide() needs to know to send `t` to `to`. The caller holds s.mu, so the room found in
// the ledger is still there when the lease is taken.
cuda::SendFacts gather_facts_locked(Sender& s, const at::Tensor& t, const ReceiverHint& to,
                                    bool detached, bool received) {
  const steps::Timed step("send: gather the facts (send_policy)");
  const int device = t.device().index();
  cuda::SendFacts f;
  f.detached = detached;
  f.received = received;
  f.empty = t.storage().nbytes() == 0 || t.storage().data() == nullptr;
  if (!f.empty) {
    check(cuda::block_of(t.storage().data(), &f.block), "locating the allocation of a CUDA tensor");
  }
  f.ledger_has_room = !s.ledger || s.ledger->has_room();
  f.copies_exportable = s.copies_exportable_locked(device);
  if (to.device != -2) {
    f.receiver.known = true;
    f.receiver.same_process = to.pid == current_pid();
    f.receiver.cuda = to.device >= 0;
    f.receiver.cannot_open =
        to.device >= 0 && to.device != device && !cuda::can_access_peer(to.device, device);
    if (!f.empty) f.receiver.cannot_open |= s.refused_by_locked(to.pid, f.block);
  }
  return f;
}

// The sync_policy facts of sending on `stream` now (the queries it needs, only those).
cuda::SyncFacts sync_facts_locked(Sender& s, int device, void* stream, std::uint64_t* stream_id) {
  cuda::SyncFacts f;
  f.mode = s.sync_mode;
  f.event_free = true;  // asked of the pool only when an event is chosen: take() reserves one
  check(cuda::stream_capturing(stream, &f.capturing), "asking whether the stream is captured");
  if (f.capturing || f.mode == cuda::SyncMode::event || f.mode == cuda::SyncMode::stream) {
    return f;
  }
  if (f.mode == cuda::SyncMode::automatic) {
    check(cuda::stream_idle(stream, &f.stream_idle), "asking whether the stream is idle");
    if (f.stream_idle) return f;
  }
  const DeviceFlags& flags = s.flags_locked(device);
  f.memops = flags.ok && cuda::stream_id(stream, stream_id).ok();
  f.flag_slot = f.memops && flags.timeline.has_slot(*stream_id);
  return f;
}

// Orders the record's receiver after the tensor's last write on the current stream
// (sync_policy.hpp decides how) and writes the way into the record. The caller holds s.mu, which
// also orders the timeline's values with their writes.
void order_receiver_locked(Sender& s, Ledger& ledger, const Ledger::Lease& lease, int device,
                           wire::Record& r) {
  const steps::Timed step("send: order the receiver (sync)");
  void* stream = current_cuda_stream(device);
  std::uint64_t stream_id = 0;
  cuda::SyncFacts facts = sync_facts_locked(s, device, stream, &stream_id);
  cuda::SyncChoice choice = cuda::choose_sync(facts);
  r.event_slot = wire::kNoEvent;
  if (choice.sync == cuda::Sync::memop) {
    DeviceFlags& flags = s.flags_locked(device);
    const cuda::Timeline::Mark mark = *flags.timeline.next(stream_id);
    void* word = static_cast<std::uint64_t*>(flags.buffer) + mark.slot;
    cuda::Status ws = cuda::stream_write_value(stream, word, mark.value);
    if (ws.ok()) {
      r.event_slot = mark.slot;
      r.flag_value = mark.value;
      std::memcpy(r.event_handle, flags.handle.data(), flags.handle.size());
      bump(counters().cuda_memop_writes);
    } else {
      // Refused after the probe passed (a stream the probe's was not like): events from now on
      // on this device, saying why once.
      flags.ok = false;
      flags.why = ws.error;
      log().warn("cuda:{}: a timeline write failed ({}); receivers wait on events from now on",
                 device, ws.error);
      facts.memops = false;
      choice = cuda::choose_sync(facts);
    }
  }
  if (choice.sync == cuda::Sync::event) {
    cuda::EventPool::Take e =
        s.events.take(device, [&](const Ledger::Lease& l) { return ledger.unclaimed(l); });
    if (e.action == cuda::EventPool::Take::exhausted) {
      facts.event_free = false;
      choice = cuda::choose_sync(facts);
    } else {
      if (e.action == cuda::EventPool::Take::create) {
        cuda::Status cs = cuda::create_ipc_event(device, &e.event, &e.handle);
        if (!cs.ok()) {
          s.events.give_back(device, e.slot);
          check(cs, "creating an interprocess event");
        }
        s.events.add(device, e.slot, e.event, e.handle);
      }
      cuda::Status rs = cuda::record_event(e.event, stream);
      if (!rs.ok()) {
        s.events.give_back(device, e.slot);
        check(rs, "recording an interprocess event");
      }
      s.events.bind(device, e.slot, lease);
      bump(counters().cuda_events_recorded);
      r.event_slot = e.slot;
      std::memcpy(r.event_handle, e.handle.data(), e.handle.size());
    }
  }
  if (choice.sync == cuda::Sync::synced) {
    check(cuda::stream_synchronize(stream), "synchronising the stream before a send");
    bump(counters().cuda_event_pool_syncs);
  }
  if (choice.sync == cuda::Sync::none) bump(counters().cuda_idle_sends);
  if (choice.fallback) bump(counters().cuda_sync_fallbacks[static_cast<int>(*choice.fallback)]);
  r.sync = static_cast<std::uint8_t>(choice.sync);
}

// The record of `shared` (the tensor, or its copy on the device) in `block`, exported by handle
// (or, given `span`, by its chunks' fds), with a lease that holds its storage and an event that
// marks its last write. The caller holds s.mu and found a lease slot free.
Outgoing send_exported_locked(Sender& s, const at::Tensor& shared, const cuda::BlockInfo& block,
                              const cuda::Span* span) {
  const steps::Timed step("send: exported (record, lease, event)");
  const int device = shared.device().index();
  Ledger& ledger = s.ledger_locked();
  std::shared_ptr<cuda::SpanExport> exported;
  if (span != nullptr) {
    const std::uint64_t before = s.spans.fds_exported();
    exported = s.spans.get(*span);
    bump(counters().cuda_handles_exported, s.spans.fds_exported() - before);
  }
  Outgoing out;
  out.record = wire::make_record();
  out.ledger = &ledger;
  out.lease =
      ledger.acquire(std::make_shared<SentStorage>(SentStorage{shared.storage(), block, exported}));
  try {
    wire::Record& r = out.record;
    describe_view(shared, r);
    r.device_type = static_cast<std::uint8_t>(wire::DeviceType::cuda);
    r.device_index = static_cast<std::int8_t>(device);
    const cuda::Uuid& uuid = s.uuid_locked(device);
    std::memcpy(r.device_uuid, uuid.data(), uuid.size());
    r.owner_token = process_token();
    r.owner_pid = current_pid();
    const cuda::ProcessIdentity& me = cuda::this_process();
    r.owner_pid_ns = me.pid_ns;
    std::memcpy(r.owner_boot_id, me.boot_id.data(), me.boot_id.size());
    if (exported) {
      describe_span(r, *exported, shared);
    } else {
      r.segment_seq = 0;
      r.segment_size = block.size;
      r.block_offset = reinterpret_cast<std::uintptr_t>(shared.storage().data()) - block.base;
      r.cuda_base = block.base;
      r.cuda_buffer_id = block.buffer_id;
      const cuda::IpcHandle* h = s.handles.find(block);
      if (h == nullptr) {
        cuda::IpcHandle fresh{};
        check(cuda::get_mem_handle(device, block.base, &fresh), "exporting a CUDA allocation");
        s.handles.put(block, fresh);
        h = s.handles.find(block);
        bump(counters().cuda_handles_exported);
      }
      std::memcpy(r.mem_handle, h->data(), h->size());
    }
    r.lease_slot = out.lease.slot;
    r.lease_gen = out.lease.gen;
    order_receiver_locked(s, ledger, out.lease, device, r);
  } catch (...) {
    ledger.abandon(out.lease);
    throw;
  }
  return out;
}

// `shared` exported as it is: a cudaMalloc block by handle, a span by fds; nullopt where its
// span cannot be passed by fd after all.
std::optional<Outgoing> send_zero_copy_locked(Sender& s, const at::Tensor& shared,
                                              const cuda::BlockInfo& block) {
  if (block.kind != cuda::MemoryKind::vmm) return send_exported_locked(s, shared, block, nullptr);
  std::optional<cuda::Span> span = span_of(shared);
  if (!span) return std::nullopt;
  return send_exported_locked(s, shared, block, &*span);
}

// `t` through the CPU transport: one device-to-host copy straight into an arena block. A dense
// tensor keeps its strides; its elements fill exactly nbytes() from the first one. With
// `uuid`, the receiver moves it back to that device.
Outgoing send_through_shm(const at::Tensor& t, Arena& arena, const cuda::Uuid* uuid) {
  const steps::Timed step("send: through shared memory (host copy)");
  const bool dense = t.is_non_overlapping_and_dense();
  at::Tensor host =
      allocate_in_arena(arena, t.sizes(), dense ? t.strides() : c10::contiguous_strides(t.sizes()),
                        t.scalar_type(), t.nbytes());
  host.copy_(t);
  Outgoing out = describe_in_arena(host, arena_block_of(host), arena);
  out.record.flags = wire::kFlagCopied;
  if (uuid != nullptr) {
    out.record.flags |= wire::kFlagToDevice;
    out.record.device_index = static_cast<std::int8_t>(t.device().index());
    std::memcpy(out.record.device_uuid, uuid->data(), uuid->size());
  }
  return out;
}

}  // namespace

Outgoing encode_cuda(const at::Tensor& t, std::size_t index, Arena& arena, const ReceiverHint& to,
                     bool detached) {
  const steps::Timed step("send: encode a CUDA tensor");
  check_sendable(t, index);
  const int device = t.device().index();
  const bool received = is_cuda_received(t);
  if (received && !cuda_source_alive(t)) {
    throw Error(Errc::peer_dead, "tensor " + std::to_string(index) +
                                     " of the message is a view on CUDA memory of a process "
                                     "that has exited; it cannot be sent on");
  }
  Sender& s = sender();
  std::unique_lock<std::mutex> lock(s.mu);
  cuda::SendFacts facts = gather_facts_locked(s, t, to, detached, received);
  cuda::Decision d = cuda::decide(facts);

  std::optional<Outgoing> out;
  if (d.route == cuda::Route::zero_copy) {
    out = send_zero_copy_locked(s, t, facts.block);
    if (!out) {
      // Its chunks cannot travel by fd after all (span_of says why): copy it like memory that
      // no fd exports.
      facts.block.fd_exportable = false;
      d = cuda::decide(facts);
    }
  }
  if (d.route == cuda::Route::device_copy) {
    at::Tensor copy = copy_on_device(t);
    cuda::BlockInfo block;
    check(cuda::block_of(copy.storage().data(), &block), "locating a copy's allocation");
    if (cuda::exportable(block)) out = send_zero_copy_locked(s, copy, block);
    if (!cuda::exportable(block)) {
      // LibTorch's allocator settings changed since this device was probed (they can, at run
      // time): its copies cannot be exported after all. Learn it, and decide again.
      s.copies_exportable[device] = false;
      facts.copies_exportable = false;
      d = cuda::decide(facts);
    } else if (!out) {
      d.route = cuda::Route::host_copy;  // this copy's span is too large to pass by fd
    }
  }
  if (!out) {
    const bool to_device = d.route == cuda::Route::host_copy;
    const cuda::Uuid uuid = to_device ? s.uuid_locked(device) : cuda::Uuid{};
    lock.unlock();
    out = send_through_shm(t, arena, to_device ? &uuid : nullptr);
  }
  out->copied = d.reason;
  if (d.reason) {
    out->record.flags |= wire::kFlagCopied;
    log().debug("CUDA tensor {} of cuda:{} copied ({}): {}", index, device,
                d.route == cuda::Route::device_copy ? "on the device" : "through shared memory",
                copy_reason_name(*d.reason));
  }
  return std::move(*out);
}

std::size_t cuda_in_flight() {
  Sender* s = existing_sender();
  if (s == nullptr) return 0;
  std::lock_guard<std::mutex> lock(s->mu);
  return s->ledger ? s->ledger->in_flight() : 0;
}

}  // namespace ferry::detail
