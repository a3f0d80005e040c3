#include "ipc/step_times.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace ferry::steps {
namespace {

std::atomic<bool> g_on{false};
thread_local const char* t_role = "caller";

struct Slot {
  std::atomic<int> ready{0};  // 1 once step and thread are written
  const char* step = nullptr;
  const char* thread = nullptr;
  std::atomic<std::uint64_t> calls{0}, ns{0};
};

Slot g_slots[kCapacity];
std::atomic<int> g_used{0};
Slot g_other;  // where steps beyond kCapacity go

bool same(const char* a, const char* b) {
  return a == b || std::strcmp(a, b) == 0;  // one literal may have several addresses
}

// The slot of (step, thread), made on first sight. Two threads meeting a new pair at once may
// both make one; snapshot() adds them up.
Slot& slot_of(const char* step, const char* thread) {
  const int used = std::min(g_used.load(std::memory_order_acquire), kCapacity);
  for (int i = 0; i < used; ++i) {
    Slot& s = g_slots[i];
    if (s.ready.load(std::memory_order_acquire) && same(s.step, step) && same(s.thread, thread))
      return s;
  }
  const int i = g_used.fetch_add(1, std::memory_order_acq_rel);
  if (i >= kCapacity) return g_other;
  Slot& s = g_slots[i];
  s.step = step;
  s.thread = thread;
  s.ready.store(1, std::memory_order_release);
  return s;
}

}  // namespace

void enable(bool on) noexcept {
  g_on.store(on, std::memory_order_relaxed);
}

bool enabled() noexcept {
  return g_on.load(std::memory_order_relaxed);
}

void set_thread_role(const char* role) noexcept {
  t_role = role;
}

Timed::~Timed() {
  if (name_ == nullptr) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  Slot& s = slot_of(name_, t_role);
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.ns.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
}

std::vector<Tally> snapshot() {
  std::vector<Tally> out;
  auto add = [&](const char* step, const char* thread, const Slot& s) {
    const std::uint64_t calls = s.calls.load(std::memory_order_relaxed);
    if (calls == 0) return;
    for (Tally& t : out) {
      if (t.step == step && t.thread == thread) {
        t.calls += calls;
        t.ns += s.ns.load(std::memory_order_relaxed);
        return;
      }
    }
    out.push_back({step, thread, calls, s.ns.load(std::memory_order_relaxed)});
  };
  const int used = std::min(g_used.load(std::memory_order_acquire), kCapacity);
  for (int i = 0; i < used; ++i) {
    const Slot& s = g_slots[i];
    if (s.ready.load(std::memory_order_acquire)) add(s.step, s.thread, s);
  }
  add("other", "any", g_other);
  return out;
}

void reset() noexcept {
  for (Slot& s : g_slots) {
    s.calls.store(0, std::memory_order_relaxed);
    s.ns.store(0, std::memory_order_relaxed);
  }
  g_other.calls.store(0, std::memory_order_relaxed);
  g_other.ns.store(0, std::memory_order_relaxed);
}

}  // namespace ferry::steps
