// device_vmm() in a build without nvcc: every call says why it cannot run.
#include "ipc/cuda/vmm_api.hpp"

namespace ferry::cuda {
namespace {

Status unbuilt() {
  return {-1, "ferry was built without CUDA (no nvcc at configure time)"};
}

class NoDeviceVmm final : public VmmOps {
 public:
  Status chunk_at(std::uint64_t, Chunk* out) noexcept override {
    *out = Chunk{};
    return unbuilt();
  }
  Status export_fd(const Chunk&, UniqueFd*) noexcept override { return unbuilt(); }
  Status granularity(int, std::uint64_t*) noexcept override { return unbuilt(); }
  Status create(int, std::uint64_t, std::uint64_t*) noexcept override { return unbuilt(); }
  Status import_fd(int, int, std::uint64_t*) noexcept override { return unbuilt(); }
  Status release(std::uint64_t) noexcept override { return unbuilt(); }
  Status reserve(std::uint64_t, std::uint64_t, std::uint64_t*) noexcept override {
    return unbuilt();
  }
  Status free_reservation(std::uint64_t, std::uint64_t) noexcept override { return unbuilt(); }
  Status map(int, std::uint64_t, std::uint64_t, std::uint64_t) noexcept override {
    return unbuilt();
  }
  Status unmap(std::uint64_t, std::uint64_t) noexcept override { return unbuilt(); }
};

}  // namespace

VmmOps& device_vmm() noexcept {
  static NoDeviceVmm ops;
  return ops;
}

}  // namespace ferry::cuda
