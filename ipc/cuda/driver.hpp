// What the .cu files of ipc/cuda share (internal; CUDA builds only): a failed call as a Status,
// a call timed as a step (ferry-cuda-bench --breakdown), a driver entry point looked up through
// the runtime (so a binary still starts where there is no driver), and a call made with a device
// current.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "ipc/cuda/status.hpp"
#include "ipc/step_times.hpp"

namespace ferry::cuda::driver {

inline Status fail(const char* call, cudaError_t err) {
  if (err == cudaSuccess) return {};
  // Clear the sticky "last error" so one failed open does not show up in the next unrelated call.
  (void)cudaGetLastError();
  return {static_cast<int>(err),
          std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")"};
}

inline Status fail(const char* call, CUresult r) {
  if (r == CUDA_SUCCESS) return {};
  return {static_cast<int>(cudaErrorUnknown),
          std::string(call) + " failed with CUresult " + std::to_string(static_cast<int>(r))};
}

// Calls `f`, timed as step `name` (free while the tally is off).
template <class F>
auto timed(const char* name, F f) {
  const steps::Timed t(name);
  return f();
}

// The driver's entry point `name` (CUDA 12 ABI), or null without a driver.
inline void* entry(const char* name) noexcept {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

// Runs `f` with `device` current, restoring the caller's device after.
template <class F>
Status on_device(int device, F f) {
  int previous = 0;
  if (cudaError_t e = timed("cudaGetDevice", [&] { return cudaGetDevice(&previous); });
      e != cudaSuccess)
    return fail("cudaGetDevice", e);
  if (previous != device) {
    if (cudaError_t e = timed("cudaSetDevice", [&] { return cudaSetDevice(device); });
        e != cudaSuccess)
      return fail("cudaSetDevice", e);
  }
  Status s = f();
  if (previous != device) (void)timed("cudaSetDevice", [&] { return cudaSetDevice(previous); });
  return s;
}

}  // namespace ferry::cuda::driver
