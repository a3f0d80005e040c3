// What CUDA this process can use: the driver, the runtime ferry was built with, and each device.
// Plain C++ (no CUDA headers) so that code built without nvcc can ask too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::cuda {

// A device UUID as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"), so users
// can match it against CUDA_VISIBLE_DEVICES=GPU-... entries.
inline std::string uuid_string(const std::uint8_t* bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU";
  for (int i = 0; i < 16; ++i) {
    if (i == 0 || i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 15];
  }
  return out;
}

struct DeviceInfo {
  int index = 0;     // the runtime's ordinal, i.e. after CUDA_VISIBLE_DEVICES
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3"
  std::string uuid;  // uuid_string(): "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  int major = 0;     // compute capability
  int minor = 0;
  std::size_t total_memory = 0;     // bytes
  bool unified_addressing = false;  // host and device share one address space (needed for IPC)
  int compute_mode = 0;             // cudaComputeMode: 0 default, 2 prohibited, 3 exclusive-process
  bool integrated = false;          // shares host memory (Tegra, Grace Hopper's iGPU)
  // cudaIpcGetMemHandle/OpenMemHandle work here: unified addressing on a discrete device (Linux).
  // Without it, tensors on this device travel by copy.
  bool legacy_ipc = false;
  bool ipc_events = false;  // cudaIpcGetEventHandle works (cudaDevAttrIpcEventSupport)
  bool kernel_ok = false;   // a probe kernel ran here and its result read back correctly
  std::string error;        // why kernel_ok is false; empty when it is true
};

struct CudaStatus {
  bool built_with_cuda = false;  // ferry was compiled with nvcc (FERRY_HAVE_CUDA)
  bool driver_present = false;   // a libcuda.so.1 was found and loaded
  int driver_version = 0;        // 1000 * major + 10 * minor, e.g. 13000; 0 without a driver
  int runtime_version = 0;       // the (static) runtime ferry was built with, same encoding
  std::string error;  // why `devices` is empty, in plain words; empty when there are devices
  std::vector<DeviceInfo> devices;
  // peer_access[i][j]: device i can map device j's memory (cudaDeviceCanAccessPeer); i == j is
  // true. Square, one row per device.
  std::vector<std::vector<bool>> peer_access;
};

// Reports the driver, the runtime and every visible device, and runs a tiny kernel on each.
// Never throws or aborts, with or without a driver. It creates a CUDA context on each device,
// so a process that forks afterwards must not use CUDA in the child.
CudaStatus probe() noexcept;

}  // namespace ferry::cuda
