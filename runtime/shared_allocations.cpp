#include "runtime/shared_allocations.hpp"

#include <c10/core/CPUAllocator.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>

#include "ipc/allocation_policy.hpp"
#include "ipc/arena.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/receipt_policy.hpp"
#include "ipc/stats.hpp"
#include "runtime/transport/shm_cpu/storages.hpp"

namespace ferry {
namespace {

// How long after a refused segment born-shared allocations take free blocks only.
constexpr auto kGrowthBackoff = std::chrono::seconds(1);

constexpr std::int8_t kUnset = -1;
std::atomic<bool> g_process_on{false};
thread_local std::int8_t t_scope = kUnset;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class BornSharedAllocator final : public c10::Allocator {
 public:
  BornSharedAllocator(c10::Allocator* next, std::uint64_t threshold, std::uint64_t max_reserved)
      : next_(next), threshold_(threshold), max_reserved_(max_reserved) {}

  // c10::Allocator's interface changed across LibTorch's versions: allocate() was const, then
  // not (2.x), and copy_data() came (pure from 2.3). Both forms of allocate() are here and none
  // says `override`: whichever the headers declare is overridden, the other is an overload
  // nobody calls, and copy_data() likewise overrides only where it exists.
  c10::DataPtr allocate(size_t n) const { return take(n); }
  c10::DataPtr allocate(size_t n) { return take(n); }

  // The raw interface (raw_allocate / raw_deallocate, which some libraries use) works for both
  // kinds: a born-shared block's context is its address, and its release is found by address.
  c10::DeleterFnPtr raw_deleter() const { return next_->raw_deleter() ? &raw_delete : nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  c10::Allocator* next() const noexcept { return next_; }
  std::uint64_t threshold() const noexcept { return threshold_; }

 private:
  static void raw_delete(void* data);

  c10::DataPtr take(std::size_t n) const {
    // place_allocation()'s first rule, checked here without touching the arena: every CPU
    // allocation of the process passes this way, most of them small.
    if (n >= threshold_ && shared_allocations()) {
      if (auto born = from_arena(n)) return std::move(*born);
    }
    return next_->allocate(n);
  }

  std::optional<c10::DataPtr> from_arena(std::size_t n) const {
    Arena& arena = Arena::local();
    AllocationRule rule;
    rule.on = true;
    rule.threshold = threshold_;
    rule.segment_size = arena.segment_size();
    rule.max_reserved = max_reserved_;
    const std::int64_t refused = refused_at_.load(std::memory_order_relaxed);
    rule.growth_refused_lately =
        refused != 0 &&
        now_ns() - refused <
            std::chrono::duration_cast<std::chrono::nanoseconds>(kGrowthBackoff).count();
    const Placement p = place_allocation(n, arena.bytes_reserved(), rule);
    std::optional<Arena::Block> block;
    try {
      block = arena.try_allocate(n, p == Placement::arena);
    } catch (const Error& e) {
      // No room for another segment (or the cgroup's limit): LibTorch's allocator takes it, and
      // the filesystem is not asked again for a while.
      refused_at_.store(now_ns(), std::memory_order_relaxed);
      log().debug("shared allocations: {} bytes fall back to the heap: {}", n, e.what());
    }
    auto& c = detail::counters();
    if (!block) {
      detail::bump(c.shared_allocation_fallbacks);
      detail::bump(c.bytes_shared_allocation_fallbacks, n);
      return std::nullopt;
    }
    detail::bump(c.shared_allocations);
    detail::bump(c.bytes_shared_allocations, n);
    return detail::born_shared_data_ptr(arena, *block);
  }

  c10::Allocator* const next_;
  const std::uint64_t threshold_;
  const std::uint64_t max_reserved_;
  mutable std::atomic<std::int64_t> refused_at_{0};
};

std::mutex g_install_mu;
BornSharedAllocator* g_allocator = nullptr;  // never destroyed: its blocks outlive everything
[[maybe_unused]] const int g_install_atfork = pthread_atfork(
    [] { g_install_mu.lock(); }, [] { g_install_mu.unlock(); }, [] { g_install_mu.unlock(); });

void BornSharedAllocator::raw_delete(void* data) {
  if (detail::release_born_shared(data)) return;
  g_allocator->next()->raw_deleter()(data);
}

// A forked child starts with shared allocations off: a worker turns them on itself, and a child
// that never asked would take a segment of shared memory for its first large tensor.
[[maybe_unused]] const int g_atfork = pthread_atfork(nullptr, nullptr, [] {
  g_process_on.store(false, std::memory_order_relaxed);
  t_scope = kUnset;
});

std::uint64_t threshold_from_env() {
  const std::uint64_t below = copy_on_receipt_below_from_env();
  return below > 0 ? below : kDefaultCopyOnReceiptBelow;
}

// Installs the allocator once, in front of whatever CPU allocator LibTorch has now.
void install() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  if (g_allocator) return;
  const std::uint64_t threshold = threshold_from_env();
  const std::uint64_t max_reserved = shared_allocations_max_from_env();
  g_allocator = new BornSharedAllocator(c10::GetCPUAllocator(), threshold, max_reserved);
  // Priority 0, LibTorch's default's own: ferry takes the default's place, and an allocator a
  // program installed on purpose at a higher priority keeps its own.
  c10::SetCPUAllocator(g_allocator, 0);
  if (c10::GetCPUAllocator() != g_allocator) {
    log().warn(
        "shared allocations: another CPU allocator was installed at a higher priority; "
        "tensors are not born in shared memory (they are copied when sent)");
  }
}

}  // namespace

void set_shared_allocations(bool on) {
  if (on) install();
  g_process_on.store(on, std::memory_order_relaxed);
}

bool shared_allocations() noexcept {
  const std::int8_t scope = t_scope;
  return scope == kUnset ? g_process_on.load(std::memory_order_relaxed) : scope != 0;
}

SharedAllocations::SharedAllocations(bool on) : previous_(t_scope) {
  if (on) install();
  t_scope = on ? 1 : 0;
}

SharedAllocations::~SharedAllocations() {
  t_scope = previous_;
}

std::uint64_t shared_allocation_threshold() {
  {
    std::lock_guard<std::mutex> lock(g_install_mu);
    if (g_allocator) return g_allocator->threshold();
  }
  return threshold_from_env();
}

bool shared_allocator_installed() noexcept {
  std::lock_guard<std::mutex> lock(g_install_mu);
  return g_allocator && c10::GetCPUAllocator() == g_allocator;
}

}  // namespace ferry
