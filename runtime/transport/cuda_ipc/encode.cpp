#include "runtime/cuda_transport.hpp"

#include <c10/util/strides.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "ipc/arena.hpp"
#include "ipc/cuda/devices.hpp"
#include "ipc/cuda/event_pool.hpp"
#include "ipc/cuda/export_cache.hpp"
#include "ipc/cuda/identity.hpp"
#include "ipc/cuda/import_cache.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/cuda/send_policy.hpp"
#include "ipc/cuda/span_export.hpp"
#include "ipc/cuda/span_import.hpp"
#include "ipc/cuda/vmm_api.hpp"
#include "ipc/env.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/peer_segments.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/segment_server.hpp"
#include "ipc/stats.hpp"
#include "ipc/step_times.hpp"
#include "runtime/cuda_ipc.hpp"
#include "runtime/cuda_spans.hpp"
#include "runtime/cuda_stream.hpp"
#include "runtime/dtype.hpp"
#include "runtime/tensor_codec.hpp"

namespace ferry {
namespace detail {
namespace {

using cuda::ImportCache;
using Clock = std::chrono::steady_clock;

constexpr auto kFetchTimeout = std::chrono::seconds(5);
constexpr auto kImportTimeout = std::chrono::seconds(10);
constexpr auto kOwnerCheck = std::chrono::milliseconds(100);

// Set at exit: the background threads stop touching LibTorch and CUDA while they are torn down.
std::atomic<bool> g_exiting{false};

void stop_threads_at_exit() {
  static std::atomic<pid_t> registered{0};
  const pid_t me = current_pid();
  if (registered.exchange(me) != me) std::atexit([] { g_exiting = true; });
}

// A count setting from 1 to 2^24 (what the old reader allowed), or `fallback` when unset.
std::uint32_t env_count(const char* name, std::uint32_t fallback) {
  return static_cast<std::uint32_t>(env::integer(name, fallback, 1, std::int64_t{1} << 24));
}

// A failed CUDA call as an error at the API edge: what ferry was doing, what CUDA said, and the
// way around CUDA IPC that always exists.
void check(const cuda::Status& s, const std::string& doing) {
  if (!s.ok()) {
    throw Error(Errc::system, doing + ": " + s.error +
                                  ". Remedy: check the device and driver (ferry-shm check); "
                                  "sending t.cpu() avoids CUDA IPC");
  }
}

// ---- sender -----------------------------------------------------------------------------

// What a CUDA lease keeps alive: the storage (so the caching allocator cannot hand its bytes to
// another tensor) until every receiver is done with it.
struct SentStorage {
  c10::Storage storage;
  cuda::BlockInfo block;                   // the allocation it lies in, for a receiver's refusal
  std::shared_ptr<cuda::SpanExport> span;  // its chunks' fds, when it travels by fd
};

// A receiver that could not open an allocation (cudaErrorAlreadyMapped: it has it open outside
// ferry): later sends of that allocation to it are copied.
using Refused = std::tuple<pid_t, int, std::uintptr_t, std::uint64_t>;  // by, device, base, id

struct Sender {
  std::mutex mu;
  std::unique_ptr<Ledger> ledger;
  cuda::ExportCache handles;
  cuda::SpanExports spans{cuda::device_vmm()};
  cuda::EventPool events{env_count("FERRY_CUDA_EVENTS", 64)};
  std::map<int, cuda::Uuid> uuids;
  std::set<Refused> refused;
  std::map<int, bool> copies_exportable;  // per device: can LibTorch's fresh blocks be exported

  bool refused_by_locked(pid_t pid, const cuda::BlockInfo& b) {
    if (ledger) {
      for (const auto& r : ledger->take_refusals()) {
        const auto* sent = static_cast<const SentStorage*>(r.keepalive.get());
        refused.insert({r.by, sent->block.device, sent->block.base, sent->block.buffer_id});
      }
    }
    return pid != 0 && refused.count({pid, b.device, b.base, b.buffer_id}) > 0;
  }

  Ledger& ledger_locked() {
    if (!ledger) {
      ledger = Ledger::create(env_count("FERRY_CUDA_LEASE_SLOTS", 4096));
      publish_segment(wire::kCudaLedgerSeq, ledger->segment());
      stop_threads_at_exit();
      std::thread([l = ledger.get()] { reap(*l); }).detach();
    }
    return *ledger;
  }

  // Ends leases as receivers release them, so device memory returns to the caching allocator
  // without waiting for the next send: a check of one shared word every 20 ms, and every 100 ms
  // a look for holders that died (the supervisor's pidfd tells the pool sooner; this covers
  // any receiver).
  static void reap(Ledger& l) {
    steps::set_thread_role("reaper");
    auto next_dead_check = Clock::now();
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (g_exiting) return;
      const bool dead_due = Clock::now() >= next_dead_check;
      if (dead_due) next_dead_check = Clock::now() + kOwnerCheck;
      if (dead_due || l.has_releases()) {
        const steps::Timed step("reaper: reclaim leases");
        l.reclaim(dead_due);
      }
    }
  }
  // Whether a copy on `device` could travel zero-copy: one small allocation from LibTorch's
  // allocator per device and process shows what kind of memory it gives (expandable segments
  // give virtual-memory chunks, which travel by fd where they were made for it).
  bool copies_exportable_locked(int device) {
    auto it = copies_exportable.find(device);
    if (it == copies_exportable.end()) {
      const at::Tensor probe =
          at::empty({1}, at::TensorOptions(at::kByte).device(at::kCUDA, device));
      cuda::BlockInfo b;
      check(cuda::block_of(probe.storage().data(), &b), "locating LibTorch's CUDA memory");
      it = copies_exportable.emplace(device, cuda::exportable(b)).first;
    }
    return it->second;
  }

  const cuda::Uuid& uuid_locked(int device) {
    auto it = uuids.find(device);
    if (it == uuids.end()) {
      cuda::Uuid u{};
      check(cuda::device_uuid(device, &u), "reading the UUID of cuda:" + std::to_string(device));
      it = uuids.emplace(device, u).first;
    }
    return it->second;
  }
};

// One per process: a forked child gets a fresh one (the parent's mutex may have been held).
std::mutex g_sender_mu;
Sender* g_sender = nullptr;
pid_t g_sender_pid = 0;

Sender* existing_sender() {
  std::lock_guard<std::mutex> lock(g_sender_mu);
  return g_sender_pid == current_pid() ? g_sender : nullptr;
}

Sender& sender() {
  std::lock_guard<std::mutex> lock(g_sender_mu);
  if (g_sender == nullptr || g_sender_pid != current_pid()) {
    g_sender = new Sender;  // never freed: its reaper thread uses it until exit
    g_sender_pid = current_pid();
  }
  return *g_sender;
}

// ---- receiver ---------------------------------------------------------------------------

struct EventKey {
  cuda::ProcessIdentity owner;
  int device;
  std::uint32_t slot;
  bool operator<(const EventKey& o) const noexcept {
    return std::tie(owner, device, slot) < std::tie(o.owner, o.device, o.slot);
  }
};
struct OpenedEvent {
  cuda::IpcHandle handle;
  void* event;
};

class Importer {
 public:
  std::mutex mu;
  std::condition_variable changed;  // an entry finished opening or closing
  std::condition_variable work;     // the closer has something to do
  ImportCache cache;
  cuda::SpanImports spans{cuda::device_vmm()};
  std::set<ImportCache::EntryId> span_entries;  // entries that are spans passed by fd
  std::map<EventKey, OpenedEvent> events;
  bool closer_running = false;
  // How long a mapping with no views stays open for the next tensor of its allocation.
  const std::chrono::milliseconds linger{
      env::millis("FERRY_CUDA_LINGER_MS", std::chrono::milliseconds(250),
                  std::chrono::milliseconds(0), std::chrono::hours(1))};

  void start_closer_locked() {
    if (closer_running) return;
    closer_running = true;
    stop_threads_at_exit();
    std::thread([this] { closer(); }).detach();
  }

 private:
  // Releases leases whose views died and closes allocations nobody views, after the device is
  // done with them; every 100 ms also checks that the owners of open allocations are alive.
  void closer() {
    steps::set_thread_role("closer");
    auto next_check = Clock::now() + kOwnerCheck;
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      auto wake = next_check;
      if (auto close_at = cache.next_close(linger); close_at && *close_at < wake) wake = *close_at;
      work.wait_until(lock, wake);
      if (g_exiting) return;
      if (Clock::now() >= next_check) {
        next_check = Clock::now() + kOwnerCheck;
        check_owners_locked();
      }
      ImportCache::Work w = cache.take_work(Clock::now(), linger);
      if (w.empty()) continue;
      std::vector<bool> is_span;
      for (const auto& c : w.close) is_span.push_back(span_entries.erase(c.id) > 0);
      lock.unlock();
      std::map<int, bool> synced;
      const steps::Timed step("closer: close mappings, release leases");
      for (std::size_t i = 0; i < w.close.size(); ++i) {
        const auto& c = w.close[i];
        cuda::Status s =
            is_span[i] ? close_span(c.device, c.local) : cuda::close_mem_handle(c.device, c.local);
        synced[c.device] = true;
        if (s.ok()) {
          bump(counters().cuda_handles_closed);
        } else {
          log().warn("closing a peer's CUDA allocation failed: {}", s.error);
        }
      }
      for (const auto& l : w.release) {
        if (!synced[l.device]) {
          cuda::Status s = cuda::synchronize_device(l.device);
          if (!s.ok())
            log().warn("waiting for cuda:{} before releasing leases: {}", l.device, s.error);
          synced[l.device] = true;
        }
        Ledger::release(*l.ledger, l.slot, l.gen, current_pid());
      }
      lock.lock();
      for (const auto& c : w.close) cache.closed(c.id);
      changed.notify_all();
    }
  }

  // Like close_mem_handle: waits for the device's work (which may still read the span), then
  // unmaps it.
  cuda::Status close_span(int device, void* local) {
    cuda::Status s = cuda::synchronize_device(device);
    if (!s.ok()) return s;
    return spans.unmap(reinterpret_cast<std::uint64_t>(local));
  }

  void check_owners_locked() {
    std::vector<cuda::ProcessIdentity> owners = cache.owners();
    for (const auto& [key, ev] : events) owners.push_back(key.owner);
    std::sort(owners.begin(), owners.end());
    owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
    for (const auto& owner : owners) {
      if (!process_alive(owner.pid)) owner_exited_locked(owner);
    }
  }

 public:
  // Marks the owner's allocations and drops its events (they died with it).
  void owner_exited_locked(const cuda::ProcessIdentity& owner) {
    if (const std::size_t n = cache.owner_died(owner); n > 0) {
      bump(counters().cuda_peer_deaths);
      log().warn(
          "{} exited while {} of its CUDA allocation(s) were open here; views on them must not "
          "be used further (source_alive() is false for them)",
          owner.str(), n);
    }
    for (auto it = events.begin(); it != events.end();) {
      if (it->first.owner == owner) {
        (void)cuda::destroy_event(it->first.device, it->second.event);
        it = events.erase(it);
      } else {
        ++it;
      }
    }
  }
};

// One per process: a forked child gets a fresh one (the parent's mutex may have been held).
std::mutex g_importer_mu;
Importer* g_importer = nullptr;
pid_t g_importer_pid = 0;

Importer& importer() {
  std::lock_guard<std::mutex> lock(g_importer_mu);
  if (g_importer == nullptr || g_importer_pid != current_pid()) {
    g_importer = new Importer;  // never freed: the detached closer thread uses it until exit
    g_importer_pid = current_pid();
  }
  return *g_importer;
}

// This process's importer, or nullptr when it has not received a CUDA tensor: then there is
// nothing to tell it, and making one (which reads FERRY_CUDA_LINGER_MS) could throw.
Importer* existing_importer() {
  std::lock_guard<std::mutex> lock(g_importer_mu);
  return g_importer_pid == current_pid() ? g_importer : nullptr;
}

// What a received CUDA tensor's storage holds.
struct CudaView {
  Importer* importer;
  ImportCache::EntryId entry;
  cuda::LeaseRef lease;
  pid_t holder;
};

void cuda_view_deleter(void* ctx) {
  const steps::Timed step("drop: a received CUDA view");
  auto* v = static_cast<CudaView*>(ctx);
  // A forked child's copy of a received tensor does not hold the lease; its parent does.
  if (v->holder == current_pid()) {
    std::lock_guard<std::mutex> lock(v->importer->mu);
    v->importer->cache.drop_view(v->entry, std::move(v->lease), Clock::now());
    v->importer->work.notify_one();
  }
  delete v;
}

// What a tensor received from this very process holds: the lease on a copy the sender made for
// it. The lease ends through the closer, after the device is done with the view.
struct LocalView {
  Importer* importer;
  cuda::LeaseRef lease;
  pid_t holder;
};

void local_view_deleter(void* ctx) {
  auto* v = static_cast<LocalView*>(ctx);
  if (v->holder == current_pid()) {
    std::lock_guard<std::mutex> lock(v->importer->mu);
    v->importer->cache.release_later(std::move(v->lease));
    v->importer->work.notify_one();
  }
  delete v;
}

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

at::Tensor copy_on_device(const at::Tensor& t) {
  const steps::Timed step("copy on the device");
  if (t.is_non_overlapping_and_dense()) {
    return at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t);
  }
  return at::empty(t.sizes(), t.options()).copy_(t);
}

}  // namespace

// ---- sending ----------------------------------------------------------------------------

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

// The record of `shared` (the tensor, or its copy on the device) in `block`, exported by handle
// (or, given `span`, by its chunks' fds), with a lease that holds its storage and an event that
// marks its last write. The caller holds s.mu and found a lease slot free.
CudaOutgoing send_exported_locked(Sender& s, const at::Tensor& shared, const cuda::BlockInfo& block,
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
  CudaOutgoing out{
      wire::make_record(), &ledger,
      ledger.acquire(std::make_shared<SentStorage>(SentStorage{shared.storage(), block, exported})),
      std::nullopt};
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

    // The event marks the tensor's last write on this stream; the receiver's stream waits on
    // it, so nobody stalls the host.
    void* stream = current_cuda_stream(device);
    cuda::EventPool::Take e =
        s.events.take(device, [&](const Ledger::Lease& l) { return ledger.unclaimed(l); });
    if (e.action == cuda::EventPool::Take::create) {
      cuda::Status cs = cuda::create_ipc_event(device, &e.event, &e.handle);
      if (!cs.ok()) {
        s.events.give_back(device, e.slot);
        check(cs, "creating an interprocess event");
      }
      s.events.add(device, e.slot, e.event, e.handle);
    }
    if (e.action == cuda::EventPool::Take::exhausted) {
      check(cuda::stream_synchronize(stream), "synchronising the stream (event pool empty)");
      bump(counters().cuda_event_pool_syncs);
      r.event_slot = wire::kNoEvent;
    } else {
      cuda::Status rs = cuda::record_event(e.event, stream);
      if (!rs.ok()) {
        s.events.give_back(device, e.slot);
        check(rs, "recording an interprocess event");
      }
      s.events.bind(device, e.slot, out.lease);
      bump(counters().cuda_events_recorded);
      r.event_slot = e.slot;
      std::memcpy(r.event_handle, e.handle.data(), e.handle.size());
    }
  } catch (...) {
    ledger.abandon(out.lease);
    throw;
  }
  return out;
}

// `shared` exported as it is: a cudaMalloc block by handle, a span by fds; nullopt where its
// span cannot be passed by fd after all.
std::optional<CudaOutgoing> send_zero_copy_locked(Sender& s, const at::Tensor& shared,
                                                  const cuda::BlockInfo& block) {
  if (block.kind != cuda::MemoryKind::vmm) return send_exported_locked(s, shared, block, nullptr);
  std::optional<cuda::Span> span = span_of(shared);
  if (!span) return std::nullopt;
  return send_exported_locked(s, shared, block, &*span);
}

// `t` through the CPU transport: one device-to-host copy straight into an arena block. A dense
// tensor keeps its strides; its elements fill exactly nbytes() from the first one. With
// `uuid`, the receiver moves it back to that device.
CudaOutgoing send_through_shm(const at::Tensor& t, Arena& arena, const cuda::Uuid* uuid) {
  const steps::Timed step("send: through shared memory (host copy)");
  const bool dense = t.is_non_overlapping_and_dense();
  at::Tensor host =
      allocate_in_arena(arena, t.sizes(), dense ? t.strides() : c10::contiguous_strides(t.sizes()),
                        t.scalar_type(), t.nbytes());
  host.copy_(t);
  Outgoing o = describe_in_arena(host, arena_block_of(host), arena);
  CudaOutgoing out{o.record, &arena.ledger(), o.lease, std::nullopt};
  out.record.flags = wire::kFlagCopied;
  if (uuid != nullptr) {
    out.record.flags |= wire::kFlagToDevice;
    out.record.device_index = static_cast<std::int8_t>(t.device().index());
    std::memcpy(out.record.device_uuid, uuid->data(), uuid->size());
  }
  return out;
}

}  // namespace

CudaOutgoing encode_cuda(const at::Tensor& t, std::size_t index, Arena& arena,
                         const ReceiverHint& to, bool detached) {
  const steps::Timed step("send: encode a CUDA tensor");
  check_sendable(t, index);
  const int device = t.device().index();
  const bool received = is_cuda_received(t);
  if (received && !source_alive(t)) {
    throw Error(Errc::peer_dead, "tensor " + std::to_string(index) +
                                     " of the message is a view on CUDA memory of a process "
                                     "that has exited; it cannot be sent on");
  }
  Sender& s = sender();
  std::unique_lock<std::mutex> lock(s.mu);
  cuda::SendFacts facts = gather_facts_locked(s, t, to, detached, received);
  cuda::Decision d = cuda::decide(facts);

  std::optional<CudaOutgoing> out;
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

// ---- receiving --------------------------------------------------------------------------

std::shared_ptr<Segment> claim_cuda(const wire::Record& r, pid_t me) {
  const steps::Timed step("recv: claim a CUDA record (in the pop)");
  require_cuda_torch();
  if (r.event_slot != wire::kNoEvent) {
    const bool local = from_this_process(r);
    const int device = local ? r.device_index : local_device(r.device_uuid);
    void* event = nullptr;
    if (local) {
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
    check(cuda::stream_wait_event(current_cuda_stream(device), event),
          "waiting on the sender's event");
  }
  auto ledger =
      map_peer_segment(r.owner_pid, r.owner_token, wire::kCudaLedgerSeq, 0, kFetchTimeout);
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

  if (from_this_process(r)) {
    // A handle cannot be opened in the process that exported it. If the sender already copied
    // for us (it knew the receiver was this process), the copy is ours alone: view it, and let
    // its lease end through the closer like a peer's. Otherwise the record names the sender's
    // own storage, which must not be aliased behind its back: copy it here.
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
      return tensor_over(data, r.block_length, ctx, &local_view_deleter, where, dtype, sizes,
                         strides, r.storage_offset);
    }
    // The storage as a flat span, then the record's view on it (offset included).
    const auto elements = static_cast<std::int64_t>(r.block_length / wire::element_size(r.dtype));
    at::Tensor view =
        at::from_blob(data, {elements}, at::TensorOptions().dtype(dtype).device(where))
            .as_strided(sizes, strides, r.storage_offset);
    at::Tensor copy = copy_on_device(view);
    // The lease may end only once the copy has read the block.
    check(cuda::stream_synchronize(current_cuda_stream(device)), "copying a same-process tensor");
    Ledger::release(*ledger, r.lease_slot, r.lease_gen, me);
    count_copy(CopyReason::same_process, copy.nbytes());
    return copy;
  }

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

}  // namespace detail

bool source_alive(const at::Tensor& t) {
  // Only a view on a peer's allocation can outlive its source.
  if (!t.defined() || !t.has_storage() ||
      t.storage().data_ptr().get_deleter() != &detail::cuda_view_deleter) {
    return true;
  }
  auto* v = static_cast<detail::CudaView*>(t.storage().data_ptr().get_context());
  std::lock_guard<std::mutex> lock(v->importer->mu);
  return !v->importer->cache.owner_dead(v->entry);
}

void detail::cuda_peer_exited(pid_t pid) {
  detail::Importer* existing = detail::existing_importer();
  if (existing == nullptr) return;
  detail::Importer& im = *existing;
  std::lock_guard<std::mutex> lock(im.mu);
  for (const auto& owner : im.cache.owners()) {
    if (owner.pid == pid && !process_alive(pid)) im.owner_exited_locked(owner);
  }
}

}  // namespace ferry
