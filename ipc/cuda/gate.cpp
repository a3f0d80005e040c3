#include "ipc/cuda/gate.hpp"

#include <pthread.h>

#include <atomic>

#include "ipc/log.hpp"

namespace ferry::cuda {
namespace {

std::atomic<const char*> g_first{nullptr};

void forget_in_child() noexcept {
  g_first.store(nullptr, std::memory_order_relaxed);
}

[[maybe_unused]] const int g_atfork = pthread_atfork(nullptr, nullptr, forget_in_child);

}  // namespace

void enter(const char* why) noexcept {
  if (g_first.load(std::memory_order_relaxed) != nullptr) return;
  const char* none = nullptr;
  if (g_first.compare_exchange_strong(none, why, std::memory_order_relaxed)) {
    try {
      log().debug("ferry enters CUDA in this process for the first time: {}", why);
    } catch (...) {
    }
  }
}

const char* first_entry() noexcept {
  return g_first.load(std::memory_order_relaxed);
}

}  // namespace ferry::cuda
