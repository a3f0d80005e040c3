#include "runtime/transport/shm_cpu/shm_cpu.hpp"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>

#include "ipc/arena.hpp"
#include "ipc/error.hpp"
#include "ipc/peer_segments.hpp"
#include "ipc/process.hpp"
#include "ipc/receipt_policy.hpp"
#include "ipc/segment.hpp"
#include "ipc/stats.hpp"
#include "ipc/step_times.hpp"
#include "runtime/transport/dtype.hpp"
#include "runtime/transport/shm_cpu/exit_custody.hpp"
#include "runtime/transport/shm_cpu/received_storages.hpp"
#include "runtime/transport/tensor_view.hpp"

namespace ferry::detail {
namespace {

constexpr auto kFetchTimeout = std::chrono::seconds(5);

constexpr std::int64_t kDeadCheckNs = 100'000'000;  // how often a sender looks for dead holders
std::atomic<std::int64_t> g_last_dead_check{0};

// Ends leases receivers released (no syscall unless something changed) and, at most every
// 100 ms, those whose holder died. Senders call it, so an owner notices without a helper thread.
void reclaim_if_due(Ledger& ledger) {
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::int64_t last = g_last_dead_check.load(std::memory_order_relaxed);
  const bool dead_due =
      now - last >= kDeadCheckNs && g_last_dead_check.compare_exchange_strong(last, now);
  if (dead_due || ledger.has_releases()) ledger.reclaim(dead_due);
}

class ShmCpu final : public Transport {
 public:
  Outgoing encode(const at::Tensor& t, std::size_t index, const SendContext& ctx) const override {
    const steps::Timed step("send: encode a CPU tensor");
    return encode_cpu(t, index, ctx.arena, ctx.detached);
  }
  void claim(Claim& c, pid_t me, const CustodyLookup& custody) const override {
    claim_cpu(c, me, custody);
  }
  at::Tensor decode(Claim& c, pid_t me) const override {
    const steps::Timed step("recv: decode a CPU record");
    return decode_cpu(c, me);
  }
  std::size_t in_flight() const override {
    Ledger* ledger = Arena::local().existing_ledger();
    return ledger ? ledger->in_flight() : 0;
  }
  void peer_exited(pid_t pid) const override { relocate_from_dead(pid); }
  void before_send(const SendContext& ctx) const override { reclaim_if_due(ctx.arena.ledger()); }
  void before_receive() const override {
    copy_on_receipt_below();  // a bad FERRY_COPY_ON_RECEIPT_BELOW fails with no message taken
    relocate_from_dead_if_due();
  }
  ExitWait at_exit() const override { return wait_for_uncovered(); }
};

}  // namespace

const Transport& shm_cpu_transport() {
  // Never destroyed: flush_at_exit() asks every transport from an atexit handler, which runs
  // after the statics made since its registration were destroyed.
  static const auto* t = new ShmCpu;
  return *t;
}

Outgoing describe_in_arena(const at::Tensor& shared, std::shared_ptr<BlockHandle> block,
                           Arena& arena) {
  Outgoing out;
  out.record = wire::make_record();
  out.ledger = &arena.ledger();
  wire::Record& r = out.record;
  describe_view(shared, r);
  r.device_type = static_cast<std::uint8_t>(wire::DeviceType::cpu);
  r.device_index = -1;
  r.owner_token = process_token();
  r.owner_pid = current_pid();
  r.segment_seq = block->block.segment_seq;
  r.segment_size = arena.segment(block->block.segment_seq)->size();
  r.block_offset = block->block.offset;
  const std::uint32_t segment = block->block.segment_seq;
  out.segment = segment;
  out.lease = arena.ledger().acquire(std::move(block), segment);
  r.lease_slot = out.lease.slot;
  r.lease_gen = out.lease.gen;
  return out;
}

Outgoing encode_cpu(const at::Tensor& t, std::size_t index, Arena& arena, bool detached) {
  check_sendable(t, index);
  std::shared_ptr<BlockHandle> block = detached ? nullptr : arena_block_of(t);
  if (block) return describe_in_arena(t, std::move(block), arena);
  const CopyReason reason = detached         ? CopyReason::detached
                            : is_received(t) ? CopyReason::received
                            : in_an_arena(t) ? CopyReason::foreign_arena
                                             : CopyReason::not_shared;
  at::Tensor shared = copy_to_arena(arena, t);
  Outgoing out = describe_in_arena(shared, arena_block_of(shared), arena);
  out.record.flags = wire::kFlagCopied;
  out.copied = reason;
  return out;
}

std::uint64_t copy_on_receipt_below() {
  // Read once per process (a forked child keeps its parent's value).
  static const std::uint64_t below = copy_on_receipt_below_from_env();
  return below;
}

namespace {

// A peer's segment, from the peer or, once it has died, from the queue's custody; where neither
// has it, the error says why and what keeps it next time.
std::shared_ptr<Segment> map_sender_segment(Claim& c, std::uint32_t seq, std::size_t size,
                                            const CustodyLookup& custody) {
  const wire::Record& r = c.record;
  try {
    return map_peer_segment(r.owner_pid, r.owner_token, seq, size, kFetchTimeout, custody,
                            &c.sender_exited);
  } catch (const Error& e) {
    if (e.code() != Errc::peer_dead) throw;
    throw Error(Errc::peer_dead,
                e.detail() +
                    " (the queue's custody did not hold it: its sender attached the queue without "
                    "the custody fd, so what it sent lived only as long as it did; pass "
                    "custody_fd() along with fd() to TensorQueue::attach. Or the custody refused "
                    "it, which the sender logged with the remedy)");
  }
}

}  // namespace

void claim_cpu(Claim& c, pid_t me, const CustodyLookup& custody) {
  const steps::Timed step("recv: claim a CPU record (in the pop)");
  const wire::Record& r = c.record;
  auto ledger = map_sender_segment(c, 0, 0, custody);
  if (!Ledger::claim(*ledger, r.lease_slot, r.lease_gen, me)) {
    c.error = "lease " + std::to_string(r.lease_slot) + "/" + std::to_string(r.lease_gen) +
              " of pid " + std::to_string(r.owner_pid) + " does not match the record";
    return;
  }
  c.ledger = std::move(ledger);
  // Mapped before the pop commits, so once a sender sees its lease claimed it may exit: the
  // receiver already holds the memory.
  c.data = map_sender_segment(c, r.segment_seq, r.segment_size, custody);
}

at::Tensor decode_cpu(Claim& c, pid_t me) {
  const wire::Record& r = c.record;
  if (std::string bad = wire::validate_location(r, c.data->size()); !bad.empty()) {
    throw Error(Errc::bad_record, bad);
  }
  const std::uint64_t copy_below = copy_on_receipt_below();
  if (decide_receipt(r.flags, r.block_length, copy_below, c.sender_exited) == Receipt::copy_out) {
    // The whole block, so the copy keeps the record's strides and storage offset exactly.
    c10::DataPtr own = c10::GetCPUAllocator()->allocate(r.block_length);
    if (r.block_length > 0) std::memcpy(own.get(), c.data->data() + r.block_offset, r.block_length);
    c10::Storage storage(c10::Storage::use_byte_size_t(), r.block_length, std::move(own),
                         c10::GetCPUAllocator(), true);
    at::Tensor t = at::empty({0}, at::TensorOptions().dtype(from_wire_dtype(r.dtype)))
                       .set_(std::move(storage), r.storage_offset, at::IntArrayRef(r.sizes, r.rank),
                             at::IntArrayRef(r.strides, r.rank));
    Ledger::release(*c.ledger, r.lease_slot, r.lease_gen, me);
    c.ledger.reset();  // released: the caller must not release it again
    bump(counters().tensors_copied_on_receipt);
    bump(counters().bytes_copied_on_receipt, r.block_length);
    return t;
  }
  at::Tensor t = received_view(r, std::move(c.data), c.ledger, me);
  c.ledger.reset();  // the view's deleter holds the lease now
  if (r.owner_token != process_token()) track_received(t.storage(), r.owner_token, r.owner_pid);
  return t;
}

}  // namespace ferry::detail
