#include <cuda.h>
#include <cuda_runtime.h>

#include <time.h>

#include <cstring>
#include <mutex>
#include <string>

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

// The driver calls of the timeline counter, looked up once (null where the driver lacks them).
using StreamWriteValue64Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
using StreamWaitValue64Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
using StreamGetIdFn = CUresult (*)(CUstream, unsigned long long*);
using DeviceGetAttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);

struct MemopCalls {
  StreamWriteValue64Fn write = nullptr;
  StreamWaitValue64Fn wait = nullptr;
  StreamGetIdFn id = nullptr;
  DeviceGetAttributeFn attribute = nullptr;
};
const MemopCalls& memop_calls() {
  static const MemopCalls calls{
      reinterpret_cast<StreamWriteValue64Fn>(driver::entry("cuStreamWriteValue64")),
      reinterpret_cast<StreamWaitValue64Fn>(driver::entry("cuStreamWaitValue64")),
      reinterpret_cast<StreamGetIdFn>(driver::entry("cuStreamGetId")),
      reinterpret_cast<DeviceGetAttributeFn>(driver::entry("cuDeviceGetAttribute"))};
  return calls;
}

Status missing(const char* call) {
  return {static_cast<int>(cudaErrorNotSupported),
          std::string(call) + ": this driver has no such entry point"};
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

Status stream_capturing(void* stream, bool* capturing) noexcept {
  enter("cudaStreamIsCapturing");
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = timed("cudaStreamIsCapturing", [&] {
    return cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st);
  });
  *capturing = e == cudaSuccess && st != cudaStreamCaptureStatusNone;
  return fail("cudaStreamIsCapturing", e);
}

Status stream_idle(void* stream, bool* idle) noexcept {
  enter("cudaStreamQuery");
  cudaError_t e =
      timed("cudaStreamQuery", [&] { return cudaStreamQuery(static_cast<cudaStream_t>(stream)); });
  *idle = e == cudaSuccess;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: work is pending
    return {};
  }
  return fail("cudaStreamQuery", e);
}

Status stream_id(void* stream, std::uint64_t* id) noexcept {
  enter("cuStreamGetId");
  *id = 0;
  if (memop_calls().id == nullptr) return missing("cuStreamGetId");
  unsigned long long v = 0;
  CUresult r =
      timed("cuStreamGetId", [&] { return memop_calls().id(static_cast<CUstream>(stream), &v); });
  if (r != CUDA_SUCCESS) return driver::fail("cuStreamGetId", r);
  *id = v;
  return {};
}

Status create_stream(int device, void** stream) noexcept {
  enter("cudaStreamCreateWithFlags");
  return on_device(device, [&] {
    cudaStream_t s = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e == cudaSuccess) *stream = s;
    return fail("cudaStreamCreateWithFlags", e);
  });
}

Status stream_write_value(void* stream, void* addr, std::uint64_t value) noexcept {
  enter("cuStreamWriteValue64");
  if (memop_calls().write == nullptr) return missing("cuStreamWriteValue64");
  // The default flags fence the stream's earlier writes before this one, so a receiver that sees
  // the value sees what came before it.
  return driver::fail("cuStreamWriteValue64", timed("cuStreamWriteValue64", [&] {
                        return memop_calls().write(static_cast<CUstream>(stream),
                                                   reinterpret_cast<CUdeviceptr>(addr), value,
                                                   CU_STREAM_WRITE_VALUE_DEFAULT);
                      }));
}

Status stream_wait_value(void* stream, const void* addr, std::uint64_t value) noexcept {
  enter("cuStreamWaitValue64");
  if (memop_calls().wait == nullptr) return missing("cuStreamWaitValue64");
  return driver::fail("cuStreamWaitValue64", timed("cuStreamWaitValue64", [&] {
                        return memop_calls().wait(static_cast<CUstream>(stream),
                                                  reinterpret_cast<CUdeviceptr>(addr), value,
                                                  CU_STREAM_WAIT_VALUE_GEQ);
                      }));
}

Status probe_memops(int device, int timeout_ms, bool* ok, std::string* why) noexcept {
  enter("a probe of stream memory operations");
  *ok = false;
  const MemopCalls& calls = memop_calls();
  if (calls.write == nullptr || calls.wait == nullptr || calls.id == nullptr) {
    *why = "the driver lacks cuStreamWriteValue64, cuStreamWaitValue64 or cuStreamGetId";
    return {};
  }
  int attribute = 0;
  if (calls.attribute != nullptr) {
    (void)calls.attribute(&attribute, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device);
  }
  return on_device(device, [&] {
    void* word = nullptr;
    cudaStream_t s = nullptr;
    if (cudaError_t e = cudaMalloc(&word, sizeof(std::uint64_t)); e != cudaSuccess) {
      *why = "cudaMalloc of the probe's word failed";
      return fail("cudaMalloc", e);
    }
    (void)cudaMemset(word, 0, sizeof(std::uint64_t));
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      (void)cudaFree(word);
      *why = "cudaStreamCreateWithFlags failed";
      return fail("cudaStreamCreateWithFlags", e);
    }
    const CUresult w = calls.write(static_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(word), 7,
                                   CU_STREAM_WRITE_VALUE_DEFAULT);
    const CUresult v = w == CUDA_SUCCESS ? calls.wait(static_cast<CUstream>(s),
                                                      reinterpret_cast<CUdeviceptr>(word), 7,
                                                      CU_STREAM_WAIT_VALUE_GEQ)
                                         : w;
    if (v != CUDA_SUCCESS) {
      *why = "a 64-bit write and wait were refused (CUresult " + std::to_string(int(v)) +
             "; attribute " + std::to_string(attribute) + ")";
      (void)cudaStreamSynchronize(s);
      (void)cudaStreamDestroy(s);
      (void)cudaFree(word);
      (void)cudaGetLastError();
      return Status{};
    }
    // Polled, not synchronised: a wait that never ends must not hang the caller.
    cudaError_t q = cudaErrorNotReady;
    for (int waited = 0; waited <= timeout_ms; ++waited) {
      q = cudaStreamQuery(s);
      if (q != cudaErrorNotReady) break;
      struct timespec ms {
        0, 1000000
      };
      nanosleep(&ms, nullptr);
    }
    std::uint64_t seen = 0;
    if (q == cudaSuccess) (void)cudaMemcpy(&seen, word, sizeof seen, cudaMemcpyDeviceToHost);
    if (q == cudaErrorNotReady) {
      // Its stream waits for ever: both are left to the process's end.
      *why = "a 64-bit write then a wait for it did not complete within " +
             std::to_string(timeout_ms) + " ms (attribute " + std::to_string(attribute) + ")";
      (void)cudaGetLastError();
      return Status{};
    }
    (void)cudaStreamDestroy(s);
    (void)cudaFree(word);
    (void)cudaGetLastError();
    if (q != cudaSuccess || seen != 7) {
      *why = std::string("the probe's write was not seen (") + cudaGetErrorName(q) + ")";
      return Status{};
    }
    *ok = true;
    *why = attribute ? "" : "the attribute says no, but a real write and wait work";
    return Status{};
  });
}

Status alloc_device(int device, std::size_t bytes, void** out) noexcept {
  enter("cudaMalloc");
  return on_device(device, [&] {
    if (cudaError_t e = cudaMalloc(out, bytes); e != cudaSuccess) return fail("cudaMalloc", e);
    if (cudaError_t e = cudaMemset(*out, 0, bytes); e != cudaSuccess) {
      (void)cudaFree(*out);
      return fail("cudaMemset", e);
    }
    return fail("cudaDeviceSynchronize", cudaDeviceSynchronize());  // zeroed before any export
  });
}

Status create_plain_event(int device, void** event) noexcept {
  enter("cudaEventCreateWithFlags");
  return on_device(device, [&] {
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) *event = ev;
    return fail("cudaEventCreateWithFlags", e);
  });
}

Status event_done(void* event, bool* done) noexcept {
  enter("cudaEventQuery");
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  *done = e == cudaSuccess;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return {};
  }
  return fail("cudaEventQuery", e);
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
