// The CUDA send policy, one case per route and reason: decide() alone says how a CUDA tensor
// travels and why, from facts the sender gathers (runtime/transport/cuda_ipc/encode.cpp carries
// it out).
#include "ipc/cuda/send_policy.hpp"

#include "../catch.hpp"

#include <string>

namespace ferry::cuda {
namespace {

SendFacts exportable() {
  SendFacts f;
  f.block.kind = MemoryKind::device;
  f.block.legacy_ipc = true;
  f.block.device = 0;
  f.block.base = 0x7f0000000000;
  f.block.size = 2 << 20;
  f.block.buffer_id = 1;
  return f;
}

SendFacts to_gpu_peer() {
  SendFacts f = exportable();
  f.receiver.known = true;
  f.receiver.cuda = true;
  return f;
}

void check_copy(const SendFacts& f, Route route, CopyReason why) {
  const Decision d = decide(f);
  CHECK(d.route == route);
  REQUIRE(d.reason.has_value());
  CHECK(std::string(copy_reason_name(*d.reason)) == copy_reason_name(why));
}

}  // namespace

TEST_CASE("send policy: an exportable block to a receiver that can open it goes zero-copy") {
  for (const SendFacts& f : {exportable(), to_gpu_peer()}) {
    const Decision d = decide(f);
    CHECK(d.route == Route::zero_copy);
    CHECK_FALSE(d.reason.has_value());
  }
}

TEST_CASE("send policy: cpu_receiver: a CPU-only receiver gets a CPU tensor, whatever else holds") {
  SendFacts f = exportable();
  f.receiver.known = true;
  f.receiver.cuda = false;
  f.empty = true;
  f.detached = true;
  f.ledger_has_room = false;
  f.copies_exportable = false;
  check_copy(f, Route::host_only, CopyReason::cpu_receiver);
}

TEST_CASE("send policy: empty: no allocation to export, it crosses as a record") {
  SendFacts f = to_gpu_peer();
  f.empty = true;
  f.block = {};  // an empty tensor has no block to look up
  check_copy(f, Route::host_copy, CopyReason::empty);
}

TEST_CASE("send policy: ledger_full: no lease slot, so host staging even for a copy") {
  SendFacts f = to_gpu_peer();
  f.ledger_has_room = false;
  check_copy(f, Route::host_copy, CopyReason::ledger_full);
  f.detached = true;  // a device copy would need a lease too
  check_copy(f, Route::host_copy, CopyReason::ledger_full);
}

TEST_CASE("send policy: peer_cannot_open: host staging, as a device copy needs the same open") {
  SendFacts f = to_gpu_peer();
  f.receiver.cannot_open = true;
  check_copy(f, Route::host_copy, CopyReason::peer_cannot_open);
}

TEST_CASE("send policy: an unknown receiver (a shared queue) is assumed able to open") {
  SendFacts f = exportable();
  f.receiver.cannot_open = true;  // only meaningful when the receiver is known
  f.receiver.same_process = true;
  CHECK(decide(f).route == Route::zero_copy);
}

TEST_CASE("send policy: detached: a fresh copy on the device") {
  SendFacts f = to_gpu_peer();
  f.detached = true;
  check_copy(f, Route::device_copy, CopyReason::detached);
}

TEST_CASE("send policy: received: a view on a peer's memory is copied to be sent on") {
  SendFacts f = to_gpu_peer();
  f.received = true;
  check_copy(f, Route::device_copy, CopyReason::received);
}

TEST_CASE("send policy: same_process: the receiver is the sender itself") {
  SendFacts f = to_gpu_peer();
  f.receiver.same_process = true;
  check_copy(f, Route::device_copy, CopyReason::same_process);
}

TEST_CASE("send policy: VMM memory made for export by fd (expandable segments) goes zero-copy") {
  SendFacts f = to_gpu_peer();
  f.block.kind = MemoryKind::vmm;
  f.block.legacy_ipc = false;
  f.block.fd_exportable = true;
  CHECK(decide(f).route == Route::zero_copy);
  CHECK_FALSE(decide(f).reason);
  // The other rules hold for it as for a cudaMalloc block.
  f.received = true;
  check_copy(f, Route::device_copy, CopyReason::received);
  f.received = false;
  f.copies_exportable = false;
  f.detached = true;
  check_copy(f, Route::host_copy, CopyReason::detached);
}

TEST_CASE("send policy: not_exportable: memory neither a handle nor an fd exports is copied") {
  for (MemoryKind k : {MemoryKind::managed, MemoryKind::pool, MemoryKind::vmm, MemoryKind::host,
                       MemoryKind::unknown}) {
    SendFacts f = to_gpu_peer();
    f.block.kind = k;
    INFO(memory_kind_name(k));
    check_copy(f, Route::device_copy, CopyReason::not_exportable);
    f.block.fd_exportable = true;  // only VMM memory is exported by fd
    if (k == MemoryKind::vmm) f.block.fd_exportable = false;
    check_copy(f, Route::device_copy, CopyReason::not_exportable);
  }
  SendFacts f = to_gpu_peer();
  f.block.legacy_ipc = false;  // device memory the driver says has no legacy IPC
  check_copy(f, Route::device_copy, CopyReason::not_exportable);
}

TEST_CASE("send policy: where the device's copies cannot be exported, copies go by host staging") {
  // LibTorch's fresh blocks are VMM memory that no fd exports (fabric handles, say): the reason
  // stays and the route changes.
  SendFacts f = to_gpu_peer();
  f.copies_exportable = false;
  CHECK(decide(f).route == Route::zero_copy);  // nothing to copy: the block itself is exportable
  f.detached = true;
  check_copy(f, Route::host_copy, CopyReason::detached);
  f = to_gpu_peer();
  f.copies_exportable = false;
  f.block.kind = MemoryKind::vmm;
  check_copy(f, Route::host_copy, CopyReason::not_exportable);
  f.block.kind = MemoryKind::device;
  f.received = true;
  check_copy(f, Route::host_copy, CopyReason::received);
  f.received = false;
  f.receiver.same_process = true;
  check_copy(f, Route::host_copy, CopyReason::same_process);
}

TEST_CASE("send policy: every reason has a name for statistics") {
  for (int r = 0; r < static_cast<int>(CopyReason::count_); ++r) {
    CHECK(std::string(copy_reason_name(static_cast<CopyReason>(r))) != "unknown");
  }
}

}  // namespace ferry::cuda
