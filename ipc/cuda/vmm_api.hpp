// The calls that share memory made by CUDA's virtual memory management (cuMemCreate and
// cuMemMap, which is how LibTorch's expandable segments allocate) by file descriptor, behind one
// interface with two implementations:
// - device_vmm(): the CUDA driver, with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR handles;
// - host_vmm(): the same contract on host memory (a memfd per allocation, mapped into a
//   PROT_NONE reservation), so that exporting, passing, importing and mapping run, with real
//   fds and real processes, on machines without a GPU.
//
// A chunk is one physical allocation mapped at one place: the unit that is exported, passed and
// imported. A span is a run of chunks contiguous in the owner's address space (vmm_span.hpp).
// No call throws.
#pragma once

#include <cstdint>

#include "ipc/cuda/status.hpp"
#include "ipc/fd.hpp"

namespace ferry::cuda {

struct Chunk {
  std::uint64_t base = 0;       // where it is mapped in its owner
  std::uint64_t size = 0;       // the whole allocation (a mapping covers all of it)
  std::uint64_t buffer_id = 0;  // unique per mapping in the owner, never reused
  int device = -1;
  bool fd_exportable = false;  // made with the POSIX file-descriptor handle type
};

class VmmOps {
 public:
  virtual ~VmmOps() = default;

  // The chunk mapped at `addr` in this process (any address inside it).
  virtual Status chunk_at(std::uint64_t addr, Chunk* out) noexcept = 0;
  // A new fd for chunk `c`'s allocation; the fd keeps the allocation alive until it is closed.
  virtual Status export_fd(const Chunk& c, UniqueFd* out) noexcept = 0;
  // The size that reservations, allocations and mappings on `device` are multiples of.
  virtual Status granularity(int device, std::uint64_t* out) noexcept = 0;

  // A new exportable allocation of `size` bytes on `device` (what an allocator does).
  virtual Status create(int device, std::uint64_t size, std::uint64_t* handle) noexcept = 0;
  // Imports a peer's allocation from `fd` (the caller still closes the fd).
  virtual Status import_fd(int device, int fd, std::uint64_t* handle) noexcept = 0;
  // Drops this process's handle; the memory goes once nothing maps it and no fd names it.
  virtual Status release(std::uint64_t handle) noexcept = 0;

  // Address space for `size` bytes, aligned to `alignment`, mapping nothing yet.
  virtual Status reserve(std::uint64_t size, std::uint64_t alignment,
                         std::uint64_t* va) noexcept = 0;
  virtual Status free_reservation(std::uint64_t va, std::uint64_t size) noexcept = 0;
  // Maps all `size` bytes of `handle` at `va` (inside a reservation) for `device` to read and
  // write.
  virtual Status map(int device, std::uint64_t va, std::uint64_t size,
                     std::uint64_t handle) noexcept = 0;
  virtual Status unmap(std::uint64_t va, std::uint64_t size) noexcept = 0;
};

VmmOps& device_vmm() noexcept;
VmmOps& host_vmm() noexcept;

}  // namespace ferry::cuda
