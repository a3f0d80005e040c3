#include "ipc/cuda/devices.hpp"
#include "ipc/cuda/gate.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <exception>
#include <string>

namespace ferry::cuda {
namespace {

constexpr int kProbeThreads = 32;
constexpr unsigned kProbeMagic = 0xfe77a000u;

// Each thread writes its own word, so a wrong launch shape shows up as a wrong value, not as a
// pass by luck.
__global__ void probe_kernel(unsigned* out, unsigned magic) {
  out[threadIdx.x] = magic + threadIdx.x;
}

std::string version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string describe(const char* call, cudaError_t err) {
  return std::string(call) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
         ")";
}

// Why cudaGetDeviceCount found nothing, in words that say what to fix.
std::string no_devices_reason(cudaError_t err, const CudaStatus& s) {
  if (err == cudaErrorStubLibrary) {
    return "libcuda.so.1 is the toolkit's stub library, not a real driver";
  }
  if (!s.driver_present) return "no CUDA driver found (libcuda.so.1 not loadable)";
  switch (err) {
    case cudaErrorInsufficientDriver:
      return "the CUDA driver (" + version_string(s.driver_version) +
             ") is older than the CUDA runtime ferry was built with (" +
             version_string(s.runtime_version) + ")";
    case cudaErrorNoDevice:
      return "a CUDA driver is present but no device is visible (check CUDA_VISIBLE_DEVICES and "
             "/dev/nvidia*)";
    default:
      return describe("cudaGetDeviceCount", err);
  }
}

// Runs the probe kernel on the current device; returns "" on success, else what went wrong.
std::string run_probe_kernel() {
  unsigned* d_out = nullptr;
  cudaError_t err = cudaMalloc(&d_out, kProbeThreads * sizeof(unsigned));
  if (err != cudaSuccess) return describe("cudaMalloc", err);

  std::string problem;
  probe_kernel<<<1, kProbeThreads>>>(d_out, kProbeMagic);
  err = cudaGetLastError();
  unsigned h_out[kProbeThreads] = {};
  if (err != cudaSuccess) {
    problem = describe("probe kernel launch", err);
  } else if ((err = cudaMemcpy(h_out, d_out, sizeof h_out, cudaMemcpyDeviceToHost)) !=
             cudaSuccess) {
    problem = describe("cudaMemcpy", err);
  } else {
    for (int i = 0; i < kProbeThreads; ++i) {
      if (h_out[i] != kProbeMagic + static_cast<unsigned>(i)) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "probe kernel wrote 0x%08x at [%d], expected 0x%08x",
                      h_out[i], i, kProbeMagic + static_cast<unsigned>(i));
        problem = buf;
        break;
      }
    }
  }
  cudaFree(d_out);
  return problem;
}

DeviceInfo probe_device(int index) {
  DeviceInfo d;
  d.index = index;
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    d.error = describe("cudaGetDeviceProperties", err);
    cudaGetLastError();
    return d;
  }
  d.name = prop.name;
  d.uuid = uuid_string(reinterpret_cast<const std::uint8_t*>(prop.uuid.bytes));
  d.major = prop.major;
  d.minor = prop.minor;
  d.total_memory = prop.totalGlobalMem;
  d.unified_addressing = prop.unifiedAddressing != 0;
  // CUDA 13 dropped computeMode from cudaDeviceProp; the attribute query works on every version.
  if (cudaDeviceGetAttribute(&d.compute_mode, cudaDevAttrComputeMode, index) != cudaSuccess) {
    d.compute_mode = -1;
    cudaGetLastError();
  }

  d.integrated = prop.integrated != 0;
  d.legacy_ipc = d.unified_addressing && !d.integrated;
  int events = 0;
  if (cudaDeviceGetAttribute(&events, cudaDevAttrIpcEventSupport, index) == cudaSuccess) {
    d.ipc_events = events != 0;
  } else {
    cudaGetLastError();
  }

  if (d.compute_mode == cudaComputeModeProhibited) {
    d.error = "compute mode is Prohibited: no process may create a context on this device";
    return d;
  }
  if ((err = cudaSetDevice(index)) != cudaSuccess) {
    d.error = describe("cudaSetDevice", err);
  } else {
    d.error = run_probe_kernel();
  }
  d.kernel_ok = d.error.empty();
  // A failed launch leaves a (non-sticky) error behind; later calls in the process must not see it.
  cudaGetLastError();
  return d;
}

}  // namespace

CudaStatus probe() noexcept {
  CudaStatus s;
  enter("the CUDA probe (ferry-shm check --cuda)");
  s.built_with_cuda = true;
  try {
    // Both calls work without a driver: the driver version reads 0 then.
    if (cudaDriverGetVersion(&s.driver_version) != cudaSuccess) s.driver_version = 0;
    if (cudaRuntimeGetVersion(&s.runtime_version) != cudaSuccess) s.runtime_version = 0;
    s.driver_present = s.driver_version > 0;

    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      s.error = no_devices_reason(err, s);
      cudaGetLastError();
      return s;
    }
    if (count == 0) {
      s.error = "the CUDA driver reports no devices";
      return s;
    }

    // Leave the caller's current device as it was.
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    for (int i = 0; i < count; ++i) s.devices.push_back(probe_device(i));
    s.peer_access.assign(count, std::vector<bool>(count, false));
    for (int i = 0; i < count; ++i) {
      for (int j = 0; j < count; ++j) {
        int can = i == j ? 1 : 0;
        if (i != j && cudaDeviceCanAccessPeer(&can, i, j) != cudaSuccess) {
          can = 0;
          cudaGetLastError();
        }
        s.peer_access[i][j] = can != 0;
      }
    }
    if (previous >= 0) cudaSetDevice(previous);
    cudaGetLastError();
  } catch (const std::exception& e) {
    s.error = std::string("CUDA probe failed: ") + e.what();
  } catch (...) {
    s.error = "CUDA probe failed";
  }
  return s;
}

}  // namespace ferry::cuda
