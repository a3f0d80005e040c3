// host_vmm(): the VmmOps contract on host memory. An allocation is a memfd; its handle is an fd
// of it; a mapping is mmap(MAP_SHARED | MAP_FIXED) into a PROT_NONE reservation and holds its
// own fd, as a CUDA mapping holds its allocation after cuMemRelease. Exported fds are new fds of
// the same file, so a peer that imports one sees the very bytes, as with the device.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "ipc/cuda/vmm_api.hpp"

namespace ferry::cuda {
namespace {

Status os_fail(const char* call) {
  const int err = errno;
  return {err == 0 ? -1 : err, std::string(call) + ": " + std::strerror(err)};
}

struct Mapping {
  std::uint64_t size;
  std::uint64_t buffer_id;
  int device;
  UniqueFd fd;  // the mapping's own reference to the allocation
};

class HostVmm final : public VmmOps {
 public:
  Status chunk_at(std::uint64_t addr, Chunk* out) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    *out = Chunk{};
    auto it = mappings_.upper_bound(addr);
    if (it == mappings_.begin()) return not_mapped(addr);
    --it;
    if (addr >= it->first + it->second.size) return not_mapped(addr);
    *out = Chunk{it->first, it->second.size, it->second.buffer_id, it->second.device, true};
    return {};
  }

  Status export_fd(const Chunk& c, UniqueFd* out) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mappings_.find(c.base);
    if (it == mappings_.end()) return not_mapped(c.base);
    out->reset(::fcntl(it->second.fd.get(), F_DUPFD_CLOEXEC, 0));
    return *out ? Status{} : os_fail("fcntl(F_DUPFD_CLOEXEC)");
  }

  Status granularity(int, std::uint64_t* out) noexcept override {
    *out = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    return {};
  }

  Status create(int, std::uint64_t size, std::uint64_t* handle) noexcept override {
    UniqueFd fd(::memfd_create("ferry-vmm", MFD_CLOEXEC));
    if (!fd) return os_fail("memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return os_fail("ftruncate");
    *handle = static_cast<std::uint64_t>(fd.release());
    return {};
  }

  Status import_fd(int, int fd, std::uint64_t* handle) noexcept override {
    const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return os_fail("fcntl(F_DUPFD_CLOEXEC)");
    *handle = static_cast<std::uint64_t>(own);
    return {};
  }

  Status release(std::uint64_t handle) noexcept override {
    return ::close(static_cast<int>(handle)) == 0 ? Status{} : os_fail("close");
  }

  Status reserve(std::uint64_t size, std::uint64_t alignment, std::uint64_t* va) noexcept override {
    // Over-reserve, then trim to the alignment asked.
    const std::uint64_t span = size + alignment;
    void* p = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return os_fail("mmap(PROT_NONE)");
    const auto start = reinterpret_cast<std::uint64_t>(p);
    const std::uint64_t aligned =
        alignment == 0 ? start : (start + alignment - 1) / alignment * alignment;
    if (aligned > start) ::munmap(p, aligned - start);
    const std::uint64_t end = start + span;
    if (end > aligned + size)
      ::munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
    *va = aligned;
    return {};
  }

  Status free_reservation(std::uint64_t va, std::uint64_t size) noexcept override {
    return ::munmap(reinterpret_cast<void*>(va), size) == 0 ? Status{} : os_fail("munmap");
  }

  Status map(int device, std::uint64_t va, std::uint64_t size,
             std::uint64_t handle) noexcept override {
    UniqueFd own(::fcntl(static_cast<int>(handle), F_DUPFD_CLOEXEC, 0));
    if (!own) return os_fail("fcntl(F_DUPFD_CLOEXEC)");
    void* p = ::mmap(reinterpret_cast<void*>(va), size, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_FIXED, own.get(), 0);
    if (p == MAP_FAILED) return os_fail("mmap(MAP_FIXED)");
    std::lock_guard<std::mutex> lock(mu_);
    mappings_[va] = Mapping{size, next_id_++, device, std::move(own)};
    return {};
  }

  Status unmap(std::uint64_t va, std::uint64_t size) noexcept override {
    // Back to reserved address space, as cuMemUnmap leaves it.
    void* p = ::mmap(reinterpret_cast<void*>(va), size, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) return os_fail("mmap(PROT_NONE)");
    std::lock_guard<std::mutex> lock(mu_);
    mappings_.erase(va);
    return {};
  }

 private:
  static Status not_mapped(std::uint64_t addr) {
    return {EINVAL, "address " + std::to_string(addr) + " is in no host_vmm mapping"};
  }

  std::mutex mu_;
  std::map<std::uint64_t, Mapping> mappings_;
  std::uint64_t next_id_ = 1;
};

}  // namespace

VmmOps& host_vmm() noexcept {
  static HostVmm ops;
  return ops;
}

}  // namespace ferry::cuda
