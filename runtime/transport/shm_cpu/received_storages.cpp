#include "runtime/transport/shm_cpu/received_storages.hpp"

#include <c10/core/CPUAllocator.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ipc/log.hpp"
#include "ipc/peer_segments.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"
#include "runtime/transport/shm_cpu/storages.hpp"

namespace ferry::detail {
namespace {

using Clock = std::chrono::steady_clock;
using Weak = c10::weak_intrusive_ptr<c10::StorageImpl>;

struct Sender {
  pid_t pid = 0;
  std::vector<Weak> storages;
  std::size_t live_at_sweep = 0;
};

// Leaked, like the peer cache: storages die during exit, after statics are destroyed.
std::mutex g_mu;
auto* g_senders = new std::map<std::uint64_t, Sender>;  // by owner token

// Old DataPtrs waiting out their grace period, oldest first, and the thread that drops them
// (started when there is something to drop, gone when there is nothing left).
struct Grace {
  std::mutex mu;
  std::condition_variable due;
  std::deque<std::pair<Clock::time_point, std::vector<c10::DataPtr>>> pending;
  pid_t dropper = 0;  // the process whose dropper thread runs, 0 for none
  bool exiting = false;
};
auto* g_grace = new Grace;

[[maybe_unused]] const int g_atfork = pthread_atfork(
    [] {
      g_mu.lock();
      g_grace->mu.lock();
    },
    [] {
      g_grace->mu.unlock();
      g_mu.unlock();
    },
    [] {
      g_grace->mu.unlock();
      g_mu.unlock();
    });

void drop_when_due() {
  std::unique_lock<std::mutex> lock(g_grace->mu);
  for (;;) {
    // At exit the process's mappings go with it; dropping would run deleters during teardown.
    if (g_grace->exiting || g_grace->pending.empty()) {
      g_grace->dropper = 0;
      return;
    }
    const auto when = g_grace->pending.front().first;
    if (Clock::now() < when) {
      g_grace->due.wait_until(lock, when);
      continue;
    }
    std::vector<c10::DataPtr> old = std::move(g_grace->pending.front().second);
    g_grace->pending.pop_front();
    lock.unlock();
    old.clear();  // each deleter ends its lease and lets go of the sender's segments
    lock.lock();
  }
}

void drop_after_grace(std::vector<c10::DataPtr> old) {
  if (old.empty()) return;
  static std::atomic<pid_t> at_exit_registered{0};
  const pid_t me = current_pid();
  if (at_exit_registered.exchange(me) != me) {
    std::atexit([] {
      std::lock_guard<std::mutex> lock(g_grace->mu);
      g_grace->exiting = true;
      g_grace->due.notify_all();
    });
  }
  std::lock_guard<std::mutex> lock(g_grace->mu);
  g_grace->pending.emplace_back(Clock::now() + kRelocationGrace, std::move(old));
  if (g_grace->dropper != me) {
    // A forked child inherits the list, not the thread.
    g_grace->dropper = me;
    try {
      std::thread(drop_when_due).detach();
    } catch (...) {
      g_grace->dropper = 0;  // the next relocation tries again; the list is kept meanwhile
      throw;
    }
  }
}

// Moves `storage` into this process's memory if it is still a view of `owner_token`'s block,
// handing the old DataPtr to `old`. False when there was nothing to move.
bool relocate(c10::StorageImpl& storage, std::uint64_t owner_token,
              std::vector<c10::DataPtr>& old) {
  const c10::DataPtr& current = static_cast<const c10::StorageImpl&>(storage).data_ptr();
  if (received_owner(current) != owner_token) return false;  // already moved, or replaced
  const std::size_t nbytes = storage.nbytes();
  c10::DataPtr fresh = c10::GetCPUAllocator()->allocate(nbytes);
  if (nbytes > 0) std::memcpy(fresh.get(), current.get(), nbytes);
  old.push_back(storage.set_data_ptr(std::move(fresh)));
  bump(counters().storages_relocated);
  bump(counters().bytes_relocated, nbytes);
  return true;
}

// Drops notes of storages that died, so the list stays proportional to what is alive.
void sweep(Sender& s) {
  auto& v = s.storages;
  v.erase(std::remove_if(v.begin(), v.end(), [](const Weak& w) { return w.expired(); }), v.end());
  s.live_at_sweep = v.size();
}

}  // namespace

void track_received(const c10::Storage& storage, std::uint64_t owner_token, pid_t owner_pid) {
  std::lock_guard<std::mutex> lock(g_mu);
  Sender& s = (*g_senders)[owner_token];
  s.pid = owner_pid;
  s.storages.push_back(storage.getWeakStorageImpl());
  if (s.storages.size() >= 2 * std::max<std::size_t>(s.live_at_sweep, 32)) sweep(s);
}

std::size_t relocate_from_dead(pid_t pid) {
  // Who to check, taken under the lock; the liveness checks (syscalls) run outside it.
  std::vector<std::pair<std::uint64_t, pid_t>> candidates;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto it = g_senders->begin(); it != g_senders->end();) {
      sweep(it->second);
      if (it->second.storages.empty()) {
        it = g_senders->erase(it);
        continue;
      }
      if (pid <= 0 || it->second.pid == pid) candidates.emplace_back(it->first, it->second.pid);
      ++it;
    }
  }
  std::size_t moved = 0;
  for (const auto& [token, owner_pid] : candidates) {
    if (process_alive(owner_pid)) continue;
    std::vector<Weak> storages;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      auto it = g_senders->find(token);
      if (it == g_senders->end()) continue;  // another thread took it
      storages = std::move(it->second.storages);
      g_senders->erase(it);
    }
    std::vector<c10::DataPtr> old;
    for (const Weak& w : storages) {
      const c10::intrusive_ptr<c10::StorageImpl> strong = w.lock();
      if (strong && relocate(*strong, token, old)) ++moved;
    }
    log().debug("moved {} storage(s) received from pid {}, which exited", old.size(), owner_pid);
    drop_after_grace(std::move(old));
    drop_peer_segments(token);
  }
  return moved;
}

void relocate_from_dead_if_due() {
  static std::atomic<std::int64_t> last{0};
  const std::int64_t now = Clock::now().time_since_epoch().count();
  std::int64_t seen = last.load(std::memory_order_relaxed);
  if (now - seen < std::chrono::duration_cast<Clock::duration>(kSenderCheck).count()) return;
  if (!last.compare_exchange_strong(seen, now)) return;
  bool any;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    any = !g_senders->empty();
  }
  if (any) relocate_from_dead();
}

}  // namespace ferry::detail
