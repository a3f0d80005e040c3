#include "runtime/transport/cuda_ipc/importer.hpp"

#include <algorithm>
#include <thread>
#include <vector>

#include "ipc/cuda/vmm_api.hpp"
#include "ipc/env.hpp"
#include "ipc/ledger.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"
#include "ipc/step_times.hpp"
#include "runtime/transport/cuda_ipc/background.hpp"

namespace ferry::detail {
namespace {

using Clock = std::chrono::steady_clock;
using cuda::ImportCache;

std::mutex g_importer_mu;
Importer* g_importer = nullptr;
pid_t g_importer_pid = 0;

}  // namespace

Importer::Importer()
    : spans(cuda::device_vmm()),
      linger(env::millis("FERRY_CUDA_LINGER_MS", std::chrono::milliseconds(250),
                         std::chrono::milliseconds(0), std::chrono::hours(1))) {}

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
  for (;;) {
    auto wake = next_check;
    if (auto close_at = cache.next_close(linger); close_at && *close_at < wake) wake = *close_at;
    work.wait_until(lock, wake);
    if (g_cuda_threads_exiting) return;
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
cuda::Status Importer::close_span(int device, void* local) {
  cuda::Status s = cuda::synchronize_device(device);
  if (!s.ok()) return s;
  return spans.unmap(reinterpret_cast<std::uint64_t>(local));
}

void Importer::check_owners_locked() {
  std::vector<cuda::ProcessIdentity> owners = cache.owners();
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
    std::lock_guard<std::mutex> lock(v->importer->mu);
    v->importer->cache.drop_view(v->entry, std::move(v->lease), Clock::now());
    v->importer->work.notify_one();
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
