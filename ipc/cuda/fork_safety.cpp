#include "ipc/cuda/fork_safety.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>

namespace ferry::cuda {
namespace {

std::atomic<bool> g_simulated{false};
std::atomic<bool> g_forked_after_init{false};
bool g_parent_had_cuda = false;  // written by the prepare handler, read by the child handler

// CUDA_ERROR_NOT_INITIALIZED: what every driver call but a few returns before cuInit.
constexpr int kNotInitialised = 3;

// RTLD_NOLOAD: a process that never loaded the driver cannot have initialised it, and looking
// must not load it (loading alone is harmless, but costs and pollutes the child).
bool driver_initialised() noexcept {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) return false;
  using DeviceGetCount = int (*)(int*);
  auto count = reinterpret_cast<DeviceGetCount>(::dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  // cuDeviceGetCount does not initialise; it reports whether cuInit has run.
  const bool on = count && count(&n) != kNotInitialised;
  ::dlclose(lib);
  return on;
}

void prepare() noexcept {
  g_parent_had_cuda = initialised();
}
void child() noexcept {
  if (g_parent_had_cuda) g_forked_after_init.store(true);
}

[[maybe_unused]] const int g_atfork = pthread_atfork(prepare, nullptr, child);

}  // namespace

bool initialised() noexcept {
  return g_simulated.load() || driver_initialised();
}

bool forked_after_init() noexcept {
  return g_forked_after_init.load();
}

namespace detail {
void simulate_initialised(bool on) noexcept {
  g_simulated.store(on);
}
}  // namespace detail

}  // namespace ferry::cuda
