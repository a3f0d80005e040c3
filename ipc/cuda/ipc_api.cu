#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>

#include "ipc/cuda/driver.hpp"
#include "ipc/cuda/gate.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/cuda/vmm_api.hpp"

namespace ferry::cuda {
namespace {

using driver::fail;
using driver::on_device;
using driver::timed;

using PointerGetAttributesFn = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);

PointerGetAttributesFn pointer_get_attributes() {
  static const auto fn =
      reinterpret_cast<PointerGetAttributesFn>(driver::entry("cuPointerGetAttributes"));
  return fn;
}

}  // namespace

bool Status::already_mapped() const noexcept {
  return code == static_cast<int>(cudaErrorAlreadyMapped);
}

bool available() noexcept {
  enter("cudaGetDeviceCount");
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

Status block_of(const void* ptr, BlockInfo* out) noexcept {
  enter("cuPointerGetAttributes");
  *out = BlockInfo{};
  PointerGetAttributesFn get = pointer_get_attributes();
  if (get == nullptr) return {static_cast<int>(cudaErrorNoDevice), "no CUDA driver entry point"};
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
      CU_POINTER_ATTRIBUTE_BUFFER_ID,        CU_POINTER_ATTRIBUTE_IS_MANAGED,
      CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,   CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
  };
  unsigned memory_type = 0;
  int ordinal = -1;
  CUdeviceptr start = 0;
  std::size_t size = 0;
  unsigned long long buffer_id = 0;
  unsigned managed = 0;
  void* mempool = nullptr;
  unsigned legacy = 0;
  void* values[] = {&memory_type, &ordinal, &start, &size, &buffer_id, &managed, &mempool, &legacy};
  CUresult r = timed("cuPointerGetAttributes", [&] {
    return get(sizeof attrs / sizeof attrs[0], attrs, values, reinterpret_cast<CUdeviceptr>(ptr));
  });
  if (r != CUDA_SUCCESS) return fail("cuPointerGetAttributes", r);
  out->device = ordinal;
  out->base = static_cast<std::uintptr_t>(start);
  out->size = size;
  out->buffer_id = buffer_id;
  out->legacy_ipc = legacy != 0;
  if (managed) {
    out->kind = MemoryKind::managed;
  } else if (memory_type == CU_MEMORYTYPE_HOST) {
    out->kind = MemoryKind::host;
  } else if (memory_type != CU_MEMORYTYPE_DEVICE) {
    out->kind = MemoryKind::unknown;
  } else if (mempool != nullptr) {
    out->kind = MemoryKind::pool;
  } else if (!legacy) {
    out->kind = MemoryKind::vmm;
    Chunk c;
    out->fd_exportable = device_vmm().chunk_at(out->base, &c).ok() && c.fd_exportable;
  } else {
    out->kind = MemoryKind::device;
  }
  return {};
}

Status device_uuid(int device, Uuid* out) noexcept {
  enter("cudaGetDeviceProperties");
  cudaDeviceProp p{};
  if (cudaError_t e =
          timed("cudaGetDeviceProperties", [&] { return cudaGetDeviceProperties(&p, device); });
      e != cudaSuccess) {
    return fail("cudaGetDeviceProperties", e);
  }
  std::memcpy(out->data(), p.uuid.bytes, out->size());
  return {};
}

int device_with_uuid(const Uuid& uuid) noexcept {
  enter("cudaGetDeviceCount");
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  for (int d = 0; d < n; ++d) {
    Uuid u{};
    if (device_uuid(d, &u).ok() && u == uuid) return d;
  }
  return -1;
}

bool can_access_peer(int from, int to) noexcept {
  if (from == to) return true;
  enter("cudaDeviceCanAccessPeer");
  int ok = 0;
  if (timed("cudaDeviceCanAccessPeer", [&] { return cudaDeviceCanAccessPeer(&ok, from, to); }) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return ok != 0;
}

Status get_mem_handle(int device, std::uintptr_t base, IpcHandle* out) noexcept {
  enter("cudaIpcGetMemHandle");
  return on_device(device, [&] {
    cudaIpcMemHandle_t h;
    cudaError_t e = timed("cudaIpcGetMemHandle",
                          [&] { return cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)); });
    if (e == cudaSuccess) std::memcpy(out->data(), &h, out->size());
    return fail("cudaIpcGetMemHandle", e);
  });
}

Status open_mem_handle(int device, const IpcHandle& handle, void** out,
                       std::size_t* size_out) noexcept {
  enter("cudaIpcOpenMemHandle");
  return on_device(device, [&] {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    cudaError_t e = timed("cudaIpcOpenMemHandle", [&] {
      return cudaIpcOpenMemHandle(out, h, cudaIpcMemLazyEnablePeerAccess);
    });
    if (e != cudaSuccess) return fail("cudaIpcOpenMemHandle", e);
    BlockInfo info;
    Status s = block_of(*out, &info);
    *size_out = s.ok() ? info.size : 0;
    return Status{};
  });
}

Status close_mem_handle(int device, void* ptr) noexcept {
  enter("cudaIpcCloseMemHandle");
  return on_device(device, [&] {
    // Views may have been used on any stream of this process: wait for all of them before the
    // mapping goes, so no kernel reads a block its owner is about to reuse.
    if (cudaError_t e = timed("cudaDeviceSynchronize", [] { return cudaDeviceSynchronize(); });
        e != cudaSuccess) {
      return fail("cudaDeviceSynchronize", e);
    }
    return fail("cudaIpcCloseMemHandle",
                timed("cudaIpcCloseMemHandle", [&] { return cudaIpcCloseMemHandle(ptr); }));
  });
}

Status create_ipc_event(int device, void** event, IpcHandle* handle) noexcept {
  enter("cudaEventCreateWithFlags");
  return on_device(device, [&] {
    cudaEvent_t ev = nullptr;
    cudaError_t e = timed("cudaEventCreateWithFlags", [&] {
      return cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming);
    });
    if (e != cudaSuccess) return fail("cudaEventCreateWithFlags", e);
    cudaIpcEventHandle_t h;
    e = timed("cudaIpcGetEventHandle", [&] { return cudaIpcGetEventHandle(&h, ev); });
    if (e != cudaSuccess) {
      (void)cudaEventDestroy(ev);
      return fail("cudaIpcGetEventHandle", e);
    }
    std::memcpy(handle->data(), &h, handle->size());
    *event = ev;
    return Status{};
  });
}

Status open_event_handle(int device, const IpcHandle& handle, void** event) noexcept {
  enter("cudaIpcOpenEventHandle");
  return on_device(device, [&] {
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    cudaEvent_t ev = nullptr;
    cudaError_t e = timed("cudaIpcOpenEventHandle", [&] { return cudaIpcOpenEventHandle(&ev, h); });
    if (e == cudaSuccess) *event = ev;
    return fail("cudaIpcOpenEventHandle", e);
  });
}

Status destroy_event(int device, void* event) noexcept {
  enter("cudaEventDestroy");
  return on_device(device, [&] {
    return fail("cudaEventDestroy", timed("cudaEventDestroy", [&] {
                  return cudaEventDestroy(static_cast<cudaEvent_t>(event));
                }));
  });
}

Status record_event(void* event, void* stream) noexcept {
  enter("cudaEventRecord");
  return fail("cudaEventRecord", timed("cudaEventRecord", [&] {
                return cudaEventRecord(static_cast<cudaEvent_t>(event),
                                       static_cast<cudaStream_t>(stream));
              }));
}

Status stream_wait_event(void* stream, void* event) noexcept {
  enter("cudaStreamWaitEvent");
  return fail("cudaStreamWaitEvent", timed("cudaStreamWaitEvent", [&] {
                return cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                           static_cast<cudaEvent_t>(event), 0);
              }));
}

Status stream_synchronize(void* stream) noexcept {
  enter("cudaStreamSynchronize");
  return fail("cudaStreamSynchronize", timed("cudaStreamSynchronize", [&] {
                return cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
              }));
}

Status synchronize_device(int device) noexcept {
  enter("cudaDeviceSynchronize");
  return on_device(device, [] {
    return fail("cudaDeviceSynchronize",
                timed("cudaDeviceSynchronize", [] { return cudaDeviceSynchronize(); }));
  });
}

Status create_timing_event(int device, void** event) noexcept {
  enter("cudaEventCreate");
  return on_device(device, [&] {
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreate(&ev);
    if (e == cudaSuccess) *event = ev;
    return fail("cudaEventCreate", e);
  });
}

Status event_synchronize(void* event) noexcept {
  enter("cudaEventSynchronize");
  return fail("cudaEventSynchronize", cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

Status elapsed_ms(void* start, void* end, float* ms) noexcept {
  enter("cudaEventElapsedTime");
  return fail("cudaEventElapsedTime", cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start),
                                                           static_cast<cudaEvent_t>(end)));
}

}  // namespace ferry::cuda
