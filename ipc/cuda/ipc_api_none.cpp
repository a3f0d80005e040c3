// The thin layer in a build without nvcc: no device exists, and every call says why.
#include "ipc/cuda/ipc_api.hpp"

namespace ferry::cuda {
namespace {
Status unbuilt() {
  return {-1, "ferry was built without CUDA (no nvcc at configure time)"};
}
}  // namespace

bool Status::already_mapped() const noexcept {
  return false;
}
bool available() noexcept {
  return false;
}
Status block_of(const void*, BlockInfo* out) noexcept {
  *out = BlockInfo{};
  return unbuilt();
}
Status device_uuid(int, Uuid*) noexcept {
  return unbuilt();
}
int device_with_uuid(const Uuid&) noexcept {
  return -1;
}
bool can_access_peer(int from, int to) noexcept {
  return from == to;
}
Status get_mem_handle(int, std::uintptr_t, IpcHandle*) noexcept {
  return unbuilt();
}
Status open_mem_handle(int, const IpcHandle&, void**, std::size_t*) noexcept {
  return unbuilt();
}
Status close_mem_handle(int, void*) noexcept {
  return unbuilt();
}
Status create_ipc_event(int, void**, IpcHandle*) noexcept {
  return unbuilt();
}
Status open_event_handle(int, const IpcHandle&, void**) noexcept {
  return unbuilt();
}
Status destroy_event(int, void*) noexcept {
  return unbuilt();
}
Status record_event(void*, void*) noexcept {
  return unbuilt();
}
Status stream_wait_event(void*, void*) noexcept {
  return unbuilt();
}
Status stream_synchronize(void*) noexcept {
  return unbuilt();
}

Status synchronize_device(int) noexcept {
  return unbuilt();
}
Status stream_capturing(void*, bool* capturing) noexcept {
  *capturing = false;
  return unbuilt();
}
Status stream_idle(void*, bool* idle) noexcept {
  *idle = false;
  return unbuilt();
}
Status stream_id(void*, std::uint64_t* id) noexcept {
  *id = 0;
  return unbuilt();
}
Status create_stream(int, void**) noexcept {
  return unbuilt();
}
Status stream_write_value(void*, void*, std::uint64_t) noexcept {
  return unbuilt();
}
Status stream_wait_value(void*, const void*, std::uint64_t) noexcept {
  return unbuilt();
}
Status probe_memops(int, int, bool* ok, std::string* why) noexcept {
  *ok = false;
  *why = unbuilt().error;
  return unbuilt();
}
Status alloc_device(int, std::size_t, void**) noexcept {
  return unbuilt();
}
Status create_plain_event(int, void**) noexcept {
  return unbuilt();
}
Status event_done(void*, bool* done) noexcept {
  *done = false;
  return unbuilt();
}
Status create_timing_event(int, void**) noexcept {
  return unbuilt();
}
Status event_synchronize(void*) noexcept {
  return unbuilt();
}
Status elapsed_ms(void*, void*, float*) noexcept {
  return unbuilt();
}

}  // namespace ferry::cuda
