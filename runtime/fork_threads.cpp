#include "runtime/fork_threads.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <ATen/Parallel.h>

#include <atomic>

#include "ipc/env.hpp"
#include "ipc/log.hpp"

namespace ferry {
namespace {

constexpr int kMaxThreads = 4096;

using SetThreads = void (*)(int);

// omp_set_num_threads of the libgomp LibTorch was linked with: a pip wheel carries its own copy
// under another file name, and setting another copy's count would change nothing. Looked up
// from LibTorch's own library, whose dependencies dlsym searches.
SetThreads torch_omp_set_num_threads() noexcept {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&at::set_num_threads), &info) == 0 || !info.dli_fname) {
    return nullptr;
  }
  void* torch = ::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (torch == nullptr) return nullptr;
  auto set = reinterpret_cast<SetThreads>(::dlsym(torch, "omp_set_num_threads"));
  ::dlclose(torch);  // LibTorch stays loaded: NOLOAD took no new reference that matters
  return set;
}

// Decided in the parent before each fork, where reading the environment, logging and dlsym are
// safe; the child only applies it.
std::atomic<int> g_child_threads{1};
std::atomic<SetThreads> g_set_omp_threads{nullptr};

void prepare() noexcept {
  try {
    g_child_threads.store(fork_child_threads());
  } catch (const std::exception& e) {
    g_child_threads.store(1);
    try {
      log().error("{}; the child forked now runs one intra-op thread", e.what());
    } catch (...) {
    }
  }
  if (g_set_omp_threads.load() == nullptr) g_set_omp_threads.store(torch_omp_set_num_threads());
}

void child() noexcept {
  const int n = g_child_threads.load();
  const SetThreads set = g_set_omp_threads.load();
  if (n > 0 && set != nullptr) set(n);
}

[[maybe_unused]] const int g_atfork = pthread_atfork(prepare, nullptr, child);

}  // namespace

int fork_child_threads() {
  return static_cast<int>(env::integer("FERRY_FORK_THREADS", 1, 0, kMaxThreads));
}

void after_fork_in_child() {
  const int n = g_child_threads.load();
  if (n > 0) at::set_num_threads(n);
}

}  // namespace ferry
