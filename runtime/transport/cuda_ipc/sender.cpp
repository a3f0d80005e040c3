#include "runtime/transport/cuda_ipc/sender.hpp"

#include <chrono>
#include <thread>

#include "ipc/cuda/send_policy.hpp"
#include "ipc/cuda/vmm_api.hpp"
#include "ipc/env.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/segment_server.hpp"
#include "ipc/step_times.hpp"
#include "ipc/wire.hpp"
#include "runtime/transport/cuda_ipc/background.hpp"
#include "runtime/transport/cuda_ipc/calls.hpp"

namespace ferry::detail {
namespace {

using Clock = std::chrono::steady_clock;

// A count setting from 1 to 2^24 (what the old reader allowed), or `fallback` when unset.
std::uint32_t env_count(const char* name, std::uint32_t fallback) {
  return static_cast<std::uint32_t>(env::integer(name, fallback, 1, std::int64_t{1} << 24));
}

// Ends leases as receivers release them, so device memory returns to the caching allocator
// without waiting for the next send: a check of one shared word every 20 ms, and every 100 ms a
// look for holders that died (the supervisor's pidfd tells the pool sooner; this covers any
// receiver).
void reap(Ledger& l) {
  steps::set_thread_role("reaper");
  auto next_dead_check = Clock::now();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (g_cuda_threads_exiting) return;
    const bool dead_due = Clock::now() >= next_dead_check;
    if (dead_due) next_dead_check = Clock::now() + kOwnerCheck;
    if (dead_due || l.has_releases()) {
      const steps::Timed step("reaper: reclaim leases");
      l.reclaim(dead_due);
    }
  }
}

std::mutex g_sender_mu;
Sender* g_sender = nullptr;
pid_t g_sender_pid = 0;

}  // namespace

Sender::Sender()
    : spans(cuda::device_vmm()),
      events(env_count("FERRY_CUDA_EVENTS", 64)),
      sync_mode(cuda::sync_mode_from(env::text("FERRY_CUDA_SYNC", ""))) {}

bool Sender::refused_by_locked(pid_t pid, const cuda::BlockInfo& b) {
  if (ledger) {
    for (const auto& r : ledger->take_refusals()) {
      const auto* sent = static_cast<const SentStorage*>(r.keepalive.get());
      refused.insert({r.by, sent->block.device, sent->block.base, sent->block.buffer_id});
    }
  }
  return pid != 0 && refused.count({pid, b.device, b.base, b.buffer_id}) > 0;
}

Ledger& Sender::ledger_locked() {
  if (!ledger) {
    ledger = Ledger::create(env_count("FERRY_CUDA_LEASE_SLOTS", 4096));
    publish_segment(wire::kCudaLedgerSeq, ledger->segment());
    stop_threads_at_exit();
    std::thread([l = ledger.get()] { reap(*l); }).detach();
  }
  return *ledger;
}

bool Sender::copies_exportable_locked(int device) {
  auto it = copies_exportable.find(device);
  if (it == copies_exportable.end()) {
    const at::Tensor probe = at::empty({1}, at::TensorOptions(at::kByte).device(at::kCUDA, device));
    cuda::BlockInfo b;
    check(cuda::block_of(probe.storage().data(), &b), "locating LibTorch's CUDA memory");
    it = copies_exportable.emplace(device, cuda::exportable(b)).first;
  }
  return it->second;
}

const cuda::Uuid& Sender::uuid_locked(int device) {
  auto it = uuids.find(device);
  if (it == uuids.end()) {
    cuda::Uuid u{};
    check(cuda::device_uuid(device, &u), "reading the UUID of cuda:" + std::to_string(device));
    it = uuids.emplace(device, u).first;
  }
  return it->second;
}

DeviceFlags& Sender::flags_locked(int device) {
  auto it = flags.find(device);
  if (it != flags.end()) return it->second;
  DeviceFlags& f = flags[device];
  // A wait that never ends would hang nothing here: the probe polls, for at most this long.
  constexpr int kProbeMs = 1000;
  bool ok = false;
  cuda::Status st = cuda::probe_memops(device, kProbeMs, &ok, &f.why);
  if (!st.ok()) f.why = st.error;
  if (ok) {
    st = cuda::alloc_device(device, f.timeline.bytes(), &f.buffer);
    if (st.ok())
      st = cuda::get_mem_handle(device, reinterpret_cast<std::uintptr_t>(f.buffer), &f.handle);
    if (!st.ok()) {
      ok = false;
      f.why = "the flag buffer: " + st.error;
    }
  }
  f.ok = ok;
  if (ok) {
    log().debug("cuda:{}: receivers wait on a timeline counter (memops){}", device,
                f.why.empty() ? "" : " (" + f.why + ")");
  } else {
    log().info(
        "cuda:{}: stream memory operations do not work here ({}); receivers wait on "
        "interprocess events instead",
        device, f.why);
  }
  return f;
}

Sender* existing_sender() {
  std::lock_guard<std::mutex> lock(g_sender_mu);
  return g_sender_pid == current_pid() ? g_sender : nullptr;
}

Sender& sender() {
  std::lock_guard<std::mutex> lock(g_sender_mu);
  if (g_sender == nullptr || g_sender_pid != current_pid()) {
    g_sender = new Sender;
    g_sender_pid = current_pid();
  }
  return *g_sender;
}

}  // namespace ferry::detail
