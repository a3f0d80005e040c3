// How many GPUs a CUDA process started here would see, found without initialising CUDA: NVML
// lists the devices and CUDA_VISIBLE_DEVICES narrows them as the CUDA runtime does. Asking the
// runtime instead (cudaGetDeviceCount, torch::cuda::device_count) initialises the driver, after
// which this process can no longer fork a child that uses CUDA; `ferry run`'s default device list
// comes from here, so its supervisor stays free to fork.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ferry::cuda {

// How many of the devices named by `uuids` (NVML's "GPU-..." UUIDs, in NVML's order) a CUDA
// process sees under CUDA_VISIBLE_DEVICES=`env` (null: unset): ordinals or UUID prefixes, read
// up to the first entry that names no device, none at all if an entry repeats. -1 where NVML
// cannot tell (MIG instances, "MIG-..."). Pure.
int visible_count(const char* env, const std::vector<std::string>& uuids);

// NVML's device UUIDs, or nullopt where NVML (libnvidia-ml.so.1, part of the driver) is missing
// or fails.
std::optional<std::vector<std::string>> nvml_uuids() noexcept;

// visible_count() for this process: 0 without a driver, and where it cannot tell (logged).
int visible_gpus() noexcept;

}  // namespace ferry::cuda
