// The thin layer: every CUDA call the IPC transport makes, behind plain C++ types, so the
// decisions around them (what to open, when to copy, when to close) are code with no CUDA in it.
// Built from ipc_api.cu with nvcc, or from ipc_api_none.cpp, where every call reports that
// ferry was built without CUDA. Driver calls go through cudaGetDriverEntryPointByVersion, so a
// binary still starts on a machine with no driver. No call here throws.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ipc/cuda/status.hpp"

namespace ferry::cuda {

using IpcHandle = std::array<std::uint8_t, 64>;  // cudaIpcMemHandle_t / cudaIpcEventHandle_t
using Uuid = std::array<std::uint8_t, 16>;

// What kind of memory a pointer is, as far as exporting it goes.
enum class MemoryKind : std::uint8_t {
  device,   // cudaMalloc (directly or through a caching allocator): exportable
  managed,  // cudaMallocManaged
  pool,     // a stream-ordered pool (cudaMallocAsync) without an IPC handle type
  vmm,      // cuMemCreate/cuMemMap (e.g. expandable segments) without legacy IPC
  host,     // pinned or registered host memory
  unknown,  // not memory CUDA knows (or no driver)
};
const char* memory_kind_name(MemoryKind k) noexcept;

// The allocation a pointer lies in: the unit CUDA IPC exports.
struct BlockInfo {
  MemoryKind kind = MemoryKind::unknown;
  bool legacy_ipc = false;      // cudaIpcGetMemHandle works on it
  bool fd_exportable = false;   // vmm memory made for export by file descriptor (vmm_api.hpp)
  int device = -1;              // ordinal in this process
  std::uintptr_t base = 0;      // start of the allocation
  std::size_t size = 0;         // its length in bytes
  std::uint64_t buffer_id = 0;  // unique per allocation in the owning process, never reused
};

// True when ferry was built with nvcc and a driver answered with at least one device.
bool available() noexcept;

// The allocation `ptr` lies in (one driver call: cuPointerGetAttributes).
Status block_of(const void* ptr, BlockInfo* out) noexcept;
// The UUID of device `device` (runtime ordinal).
Status device_uuid(int device, Uuid* out) noexcept;
// The runtime ordinal of the device with this UUID, or -1.
int device_with_uuid(const Uuid& uuid) noexcept;
// Whether device `from` can map memory of device `to` (true when from == to).
bool can_access_peer(int from, int to) noexcept;

Status get_mem_handle(int device, std::uintptr_t base, IpcHandle* out) noexcept;
// Opens a peer's block on `device` (cudaIpcMemLazyEnablePeerAccess). *size_out is the length of
// what was mapped, for checking against the sender's record.
Status open_mem_handle(int device, const IpcHandle& h, void** out, std::size_t* size_out) noexcept;
// Waits for every stream of `device` (work may still read the block), then closes the mapping.
Status close_mem_handle(int device, void* ptr) noexcept;

// Interprocess events (cudaEventInterprocess | cudaEventDisableTiming).
Status create_ipc_event(int device, void** event, IpcHandle* handle) noexcept;
Status open_event_handle(int device, const IpcHandle& h, void** event) noexcept;
Status destroy_event(int device, void* event) noexcept;
Status record_event(void* event, void* stream) noexcept;
Status stream_wait_event(void* stream, void* event) noexcept;
Status stream_synchronize(void* stream) noexcept;
// Waits for all work this process queued on `device`.
Status synchronize_device(int device) noexcept;

// What a sender asks of its current stream before a send (sync_policy.hpp): whether it is being
// captured into a graph (then it may not be queried), whether it has work pending, and its id,
// unique for the process's life (cuStreamGetId: a stream made at a destroyed one's address gets
// another).
Status stream_capturing(void* stream, bool* capturing) noexcept;
Status stream_idle(void* stream, bool* idle) noexcept;
Status stream_id(void* stream, std::uint64_t* id) noexcept;
// A stream of this process's own on `device`, which does not wait for the legacy default stream
// (cudaStreamNonBlocking): the closer's, for its writes.
Status create_stream(int device, void** stream) noexcept;

// Stream memory operations, the timeline counter's (timeline.hpp): a 64-bit write into device
// memory after the stream's earlier work, fenced so that work's writes are seen first; a wait
// that holds the stream's later work until the word is at least `value` (compared as a signed
// difference, so kReleaseValue ends any wait).
Status stream_write_value(void* stream, void* addr, std::uint64_t value) noexcept;
Status stream_wait_value(void* stream, const void* addr, std::uint64_t value) noexcept;
// Whether `device` takes 64-bit stream memory operations: its attribute, then a real write and a
// wait on a stream of its own, within `timeout_ms` (the attribute alone can be wrong either way).
// *why says what failed.
Status probe_memops(int device, int timeout_ms, bool* ok, std::string* why) noexcept;
// `bytes` of zeroed device memory from cudaMalloc itself, not a caching allocator: a flag buffer
// lives as long as its process, and is exported by handle.
Status alloc_device(int device, std::size_t bytes, void** out) noexcept;

// Plain events (cudaEventDisableTiming), which the closer records where a view is dropped and
// polls: whether the work before it has completed.
Status create_plain_event(int device, void** event) noexcept;
Status event_done(void* event, bool* done) noexcept;

// Timing events (no interprocess flag), for the benchmarks: the device's own clock, on a stream.
Status create_timing_event(int device, void** event) noexcept;
Status event_synchronize(void* event) noexcept;
// Milliseconds between two recorded timing events, once `end` has completed.
Status elapsed_ms(void* start, void* end, float* ms) noexcept;

}  // namespace ferry::cuda
