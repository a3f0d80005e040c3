// The checks of ferry-shm check that concern the process and the devices rather than the shm
// directory (internal to shm_check.cpp): System V shared memory, open files, locked memory and
// the CUDA probe. Each returns its CheckItem, numbers and remedy included.
#pragma once

#include <cstdint>

#include "ipc/cuda/devices.hpp"
#include "ipc/diag/check_item.hpp"

namespace ferry::diag {

// kernel.shmmax, shmall and shmmni against the job's `need` (for libraries that use SysV).
CheckItem check_sysv(std::uint64_t need);
// RLIMIT_NOFILE against the fds a job of this size holds.
CheckItem check_open_files(std::uint64_t fds_need);
// RLIMIT_MEMLOCK, which pinned host memory runs into where there are GPUs.
CheckItem check_memlock(bool have_gpus);
// The name of a CUDA compute mode (cudaComputeMode), as reports print it.
const char* compute_mode_name(int mode);
// What the CUDA probe found: driver, devices, their compute mode and IPC support.
CheckItem check_cuda(const cuda::CudaStatus& s);

}  // namespace ferry::diag
