// device_vmm(): the CUDA driver's virtual memory management calls, with POSIX file-descriptor
// handles. Every driver function is looked up once through the runtime.
#include <cuda.h>

#include <cstdint>

#include "ipc/cuda/driver.hpp"
#include "ipc/cuda/gate.hpp"
#include "ipc/cuda/vmm_api.hpp"

namespace ferry::cuda {
namespace {

using driver::fail;
using driver::on_device;
using driver::timed;

constexpr auto kFdType = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

// The driver functions used here, or null members without a driver.
struct Driver {
  decltype(&cuPointerGetAttributes) pointer_get_attributes;
  decltype(&cuMemGetAddressRange) address_range;
  decltype(&cuMemRetainAllocationHandle) retain;
  decltype(&cuMemGetAllocationPropertiesFromHandle) properties;
  decltype(&cuMemExportToShareableHandle) export_handle;
  decltype(&cuMemImportFromShareableHandle) import_handle;
  decltype(&cuMemGetAllocationGranularity) granularity;
  decltype(&cuMemCreate) create;
  decltype(&cuMemRelease) release;
  decltype(&cuMemAddressReserve) reserve;
  decltype(&cuMemAddressFree) free;
  decltype(&cuMemMap) map;
  decltype(&cuMemSetAccess) set_access;
  decltype(&cuMemUnmap) unmap;
  bool ok() const noexcept { return unmap != nullptr; }
};

template <class F>
void look_up(F& f, const char* name) {
  f = reinterpret_cast<F>(driver::entry(name));
}

const Driver& drv() {
  static const Driver d = [] {
    Driver x{};
    look_up(x.pointer_get_attributes, "cuPointerGetAttributes");
    look_up(x.address_range, "cuMemGetAddressRange");
    look_up(x.retain, "cuMemRetainAllocationHandle");
    look_up(x.properties, "cuMemGetAllocationPropertiesFromHandle");
    look_up(x.export_handle, "cuMemExportToShareableHandle");
    look_up(x.import_handle, "cuMemImportFromShareableHandle");
    look_up(x.granularity, "cuMemGetAllocationGranularity");
    look_up(x.create, "cuMemCreate");
    look_up(x.release, "cuMemRelease");
    look_up(x.reserve, "cuMemAddressReserve");
    look_up(x.free, "cuMemAddressFree");
    look_up(x.map, "cuMemMap");
    look_up(x.set_access, "cuMemSetAccess");
    // Last: ok() tests it, so a driver missing any of the others reads as missing.
    bool all = x.pointer_get_attributes && x.address_range && x.retain && x.properties &&
               x.export_handle && x.import_handle && x.granularity && x.create && x.release &&
               x.reserve && x.free && x.map && x.set_access;
    if (all) look_up(x.unmap, "cuMemUnmap");
    return x;
  }();
  return d;
}

Status no_driver() {
  return {static_cast<int>(cudaErrorNoDevice), "no CUDA driver with virtual memory management"};
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = kFdType;
  return p;
}

class DeviceVmm final : public VmmOps {
 public:
  Status chunk_at(std::uint64_t addr, Chunk* out) noexcept override {
    enter("cuPointerGetAttributes");
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    *out = Chunk{};
    // The pointer's RANGE_START_ADDR and RANGE_SIZE name the whole reservation (all of an
    // expandable segment's address space), not the allocation mapped at addr: mapping that size
    // from one chunk's handle fails in the peer (CUDA_ERROR_NOT_SUPPORTED, seen on an H200).
    // cuMemGetAddressRange gives the mapping itself.
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    unsigned long long id = 0;
    int ordinal = -1;
    void* values[] = {&id, &ordinal};
    if (CUresult r = timed("cuPointerGetAttributes",
                           [&] { return d.pointer_get_attributes(2, attrs, values, addr); });
        r != CUDA_SUCCESS)
      return fail("cuPointerGetAttributes", r);
    CUdeviceptr start = 0;
    std::size_t size = 0;
    if (CUresult r =
            timed("cuMemGetAddressRange", [&] { return d.address_range(&start, &size, addr); });
        r != CUDA_SUCCESS)
      return fail("cuMemGetAddressRange", r);
    out->base = start;
    out->size = size;
    out->buffer_id = id;
    out->device = ordinal;
    CUmemGenericAllocationHandle h{};
    if (CUresult r = timed("cuMemRetainAllocationHandle",
                           [&] { return d.retain(&h, reinterpret_cast<void*>(start)); });
        r != CUDA_SUCCESS)
      return fail("cuMemRetainAllocationHandle", r);
    CUmemAllocationProp p{};
    CUresult r =
        timed("cuMemGetAllocationPropertiesFromHandle", [&] { return d.properties(&p, h); });
    (void)timed("cuMemRelease", [&] { return d.release(h); });
    if (r != CUDA_SUCCESS) return fail("cuMemGetAllocationPropertiesFromHandle", r);
    out->fd_exportable = (p.requestedHandleTypes & kFdType) != 0;
    return {};
  }

  Status export_fd(const Chunk& c, UniqueFd* out) noexcept override {
    enter("cuMemExportToShareableHandle");
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    CUmemGenericAllocationHandle h{};
    if (CUresult r = timed("cuMemRetainAllocationHandle",
                           [&] { return d.retain(&h, reinterpret_cast<void*>(c.base)); });
        r != CUDA_SUCCESS)
      return fail("cuMemRetainAllocationHandle", r);
    int fd = -1;
    CUresult r =
        timed("cuMemExportToShareableHandle", [&] { return d.export_handle(&fd, h, kFdType, 0); });
    (void)timed("cuMemRelease", [&] { return d.release(h); });
    if (r != CUDA_SUCCESS) return fail("cuMemExportToShareableHandle", r);
    out->reset(fd);
    return {};
  }

  Status granularity(int device, std::uint64_t* out) noexcept override {
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    CUmemAllocationProp p = device_prop(device);
    std::size_t g = 0;
    if (CUresult r = d.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM); r != CUDA_SUCCESS)
      return fail("cuMemGetAllocationGranularity", r);
    *out = g;
    return {};
  }

  Status create(int device, std::uint64_t size, std::uint64_t* handle) noexcept override {
    enter("cuMemCreate");
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    return on_device(device, [&]() -> Status {
      CUmemAllocationProp p = device_prop(device);
      CUmemGenericAllocationHandle h{};
      if (CUresult r = d.create(&h, size, &p, 0); r != CUDA_SUCCESS) return fail("cuMemCreate", r);
      *handle = h;
      return {};
    });
  }

  Status import_fd(int device, int fd, std::uint64_t* handle) noexcept override {
    enter("cuMemImportFromShareableHandle");
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    return on_device(device, [&]() -> Status {
      CUmemGenericAllocationHandle h{};
      void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
      if (CUresult r = timed("cuMemImportFromShareableHandle",
                             [&] { return d.import_handle(&h, os_handle, kFdType); });
          r != CUDA_SUCCESS)
        return fail("cuMemImportFromShareableHandle", r);
      *handle = h;
      return {};
    });
  }

  Status release(std::uint64_t handle) noexcept override {
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    return fail("cuMemRelease", timed("cuMemRelease", [&] { return d.release(handle); }));
  }

  Status reserve(std::uint64_t size, std::uint64_t alignment, std::uint64_t* va) noexcept override {
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    CUdeviceptr p = 0;
    if (CUresult r =
            timed("cuMemAddressReserve", [&] { return d.reserve(&p, size, alignment, 0, 0); });
        r != CUDA_SUCCESS)
      return fail("cuMemAddressReserve", r);
    *va = p;
    return {};
  }

  Status free_reservation(std::uint64_t va, std::uint64_t size) noexcept override {
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    return fail("cuMemAddressFree", timed("cuMemAddressFree", [&] { return d.free(va, size); }));
  }

  Status map(int device, std::uint64_t va, std::uint64_t size,
             std::uint64_t handle) noexcept override {
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    return on_device(device, [&]() -> Status {
      if (CUresult r = timed("cuMemMap", [&] { return d.map(va, size, 0, handle, 0); });
          r != CUDA_SUCCESS)
        return fail("cuMemMap", r);
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      if (CUresult r = timed("cuMemSetAccess", [&] { return d.set_access(va, size, &access, 1); });
          r != CUDA_SUCCESS) {
        (void)d.unmap(va, size);
        return fail("cuMemSetAccess", r);
      }
      return {};
    });
  }

  Status unmap(std::uint64_t va, std::uint64_t size) noexcept override {
    const Driver& d = drv();
    if (!d.ok()) return no_driver();
    return fail("cuMemUnmap", timed("cuMemUnmap", [&] { return d.unmap(va, size); }));
  }
};

}  // namespace

VmmOps& device_vmm() noexcept {
  static DeviceVmm ops;
  return ops;
}

}  // namespace ferry::cuda
