#include "runtime/transport/cuda_ipc/importer.hpp"

#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

#include "ipc/cuda/release_policy.hpp"
#include "ipc/cuda/timeline.hpp"
#include "ipc/cuda/vmm_api.hpp"
#include "ipc/env.hpp"
#include "ipc/ledger.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"
#include "ipc/step_times.hpp"
#include "runtime/transport/cuda_ipc/background.hpp"
#include "runtime/transport/cuda_ipc/stream.hpp"

namespace ferry::detail {
namespace {

using Clock = std::chrono::steady_clock;
using cuda::ImportCache;

std::mutex g_importer_mu;
Importer* g_importer = nullptr;
pid_t g_importer_pid = 0;

// How often the closer looks at the events of dropped views while any is pending.
constexpr auto kEventPoll = std::chrono::milliseconds(1);

}  // namespace

Importer::Importer()
    : spans(cuda::device_vmm()),
      linger(env::millis("FERRY_CUDA_LINGER_MS", std::chrono::milliseconds(250),
                         std::chrono::milliseconds(0), std::chrono::hours(1))),
      strict_release(env::flag("FERRY_CUDA_STRICT_RELEASE", false)) {}

void Importer::start_closer_locked() {
  if (closer_running_) return;
  closer_running_ = true;
  stop_threads_at_exit();
  std::thread([this] { closer(); }).detach();
}

// Releases leases whose views died and closes allocations nobody views, after the device is done
// with them; every 100 ms also checks that the owners of open allocations are alive.
void Importer::closer() {
  steps::set_thread_role("closer");
  auto next_check = Clock::now() + kOwnerCheck;
  std::unique_lock<std::mutex> lock(mu);
  bool events_pending = false;
  for (;;) {
    auto wake = next_check;
    if (auto close_at = cache.next_close(linger); close_at && *close_at < wake) wake = *close_at;
    if (events_pending) wake = std::min(wake, Clock::now() + kEventPoll);
    work.wait_until(lock, wake);
    if (g_cuda_threads_exiting) return;
    if (Clock::now() >= next_check) {
      next_check = Clock::now() + kOwnerCheck;
      check_owners_locked();
    }
    events_pending = poll_events_locked();
    if (!dead_flags_.empty()) {
      std::vector<cuda::FlagImports::Release> dead = std::move(dead_flags_);
      dead_flags_.clear();
      lock.unlock();
      release_dead_flags(std::move(dead));
      lock.lock();
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
cuda::Status Importer::close_span(int device, void* local) {
  cuda::Status s = cuda::synchronize_device(device);
  if (!s.ok()) return s;
  return spans.unmap(reinterpret_cast<std::uint64_t>(local));
}

bool Importer::poll_events_locked() {
  for (auto it = after_event_.begin(); it != after_event_.end();) {
    bool done = false;
    cuda::Status s = cuda::event_done(it->event, &done);
    if (!s.ok()) {
      // The event cannot tell: wait for the device, as a strict release would.
      log().warn("a dropped view's event failed ({}); its lease waits for cuda:{}", s.error,
                 it->lease.device);
      cache.release_later(std::move(it->lease));
      work.notify_one();
      it = after_event_.erase(it);
      continue;
    }
    if (!done) {
      ++it;
      continue;
    }
    Ledger::release(*it->lease.ledger, it->lease.slot, it->lease.gen, current_pid());
    free_events_[it->lease.device].push_back(it->event);
    it = after_event_.erase(it);
  }
  return !after_event_.empty();
}

void* Importer::plain_event(int device) {
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& free = free_events_[device];
    if (!free.empty()) {
      void* e = free.back();
      free.pop_back();
      return e;
    }
  }
  void* e = nullptr;
  return cuda::create_plain_event(device, &e).ok() ? e : nullptr;
}

void Importer::return_event(int device, void* event) {
  std::lock_guard<std::mutex> lock(mu);
  free_events_[device].push_back(event);
}

void Importer::release_after(void* event, cuda::LeaseRef lease) {
  std::lock_guard<std::mutex> lock(mu);
  start_closer_locked();
  after_event_.push_back(AfterEvent{event, std::move(lease)});
  work.notify_one();
}

void Importer::release_dead_flags(std::vector<cuda::FlagImports::Release> dead) {
  const steps::Timed step("closer: release a dead sender's waits");
  for (const auto& d : dead) {
    auto& stream = closer_streams_[d.device];
    if (stream == nullptr && !cuda::create_stream(d.device, &stream).ok()) stream = nullptr;
    for (std::uint32_t slot : d.slots) {
      void* word = static_cast<std::uint64_t*>(d.local) + slot;
      cuda::Status s = stream ? cuda::stream_write_value(stream, word, cuda::kReleaseValue)
                              : cuda::Status{-1, "no stream of the closer's on this device"};
      if (s.ok()) {
        bump(counters().cuda_waits_released);
      } else {
        log().warn("releasing the waits on a dead sender's flag (cuda:{}, slot {}) failed: {}",
                   d.device, slot, s.error);
      }
    }
    // Closing waits for the device: the waits just released end, and nothing reads the flags.
    if (cuda::Status s = cuda::close_mem_handle(d.device, d.local); !s.ok()) {
      log().warn("closing a dead sender's flag buffer failed: {}", s.error);
    }
  }
}

void Importer::check_owners_locked() {
  std::vector<cuda::ProcessIdentity> owners = cache.owners();
  for (const auto& owner : flags.owners()) owners.push_back(owner);
  for (const auto& [key, ev] : events) owners.push_back(key.owner);
  std::sort(owners.begin(), owners.end());
  owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
  for (const auto& owner : owners) {
    if (!process_alive(owner.pid)) owner_exited_locked(owner);
  }
}

void Importer::owner_exited_locked(const cuda::ProcessIdentity& owner) {
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
  for (auto& d : flags.owner_died(owner)) dead_flags_.push_back(std::move(d));
  if (!dead_flags_.empty()) work.notify_one();
}

Importer& importer() {
  std::lock_guard<std::mutex> lock(g_importer_mu);
  if (g_importer == nullptr || g_importer_pid != current_pid()) {
    g_importer = new Importer;
    g_importer_pid = current_pid();
  }
  return *g_importer;
}

Importer* existing_importer() {
  std::lock_guard<std::mutex> lock(g_importer_mu);
  return g_importer_pid == current_pid() ? g_importer : nullptr;
}

void cuda_view_deleter(void* ctx) {
  const steps::Timed step("drop: a received CUDA view");
  auto* v = static_cast<CudaView*>(ctx);
  // A forked child's copy of a received tensor does not hold the lease; its parent does.
  if (v->holder == current_pid()) {
    Importer& im = *v->importer;
    const int device = v->lease.device;
    // When the lease may end (release_policy.hpp): the view's reads are on the current stream.
    cuda::ReleaseFacts f;
    f.strict = im.strict_release;
    void* event = nullptr;
    if (!f.strict) {
      void* stream = current_cuda_stream(device);
      bool idle = false;
      f.stream_idle = cuda::stream_idle(stream, &idle).ok() && idle;
      if (!f.stream_idle) {
        event = im.plain_event(device);
        f.event = event != nullptr && cuda::record_event(event, stream).ok();
      }
    }
    const cuda::Release when = cuda::release_when(f);
    std::optional<cuda::LeaseRef> kept;
    switch (when) {
      case cuda::Release::now:
        Ledger::release(*v->lease.ledger, v->lease.slot, v->lease.gen, current_pid());
        bump(counters().cuda_releases_now);
        break;
      case cuda::Release::after_event:
        im.release_after(event, std::move(v->lease));
        event = nullptr;
        bump(counters().cuda_releases_after_event);
        break;
      case cuda::Release::after_device:
        kept = std::move(v->lease);
        bump(counters().cuda_releases_after_device);
        break;
    }
    if (event != nullptr) im.return_event(device, event);  // not recorded after all
    std::lock_guard<std::mutex> lock(im.mu);
    im.cache.drop_view(v->entry, std::move(kept), Clock::now());
    im.work.notify_one();
  }
  delete v;
}

void local_view_deleter(void* ctx) {
  auto* v = static_cast<LocalView*>(ctx);
  if (v->holder == current_pid()) {
    std::lock_guard<std::mutex> lock(v->importer->mu);
    v->importer->cache.release_later(std::move(v->lease));
    v->importer->work.notify_one();
  }
  delete v;
}

}  // namespace ferry::detail
