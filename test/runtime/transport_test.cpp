// Transports: which one carries a tensor or a record (one pure choice), and the CPU transport
// driven through the interface alone, between real processes.
#include "../catch.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "../test_util.hpp"
#include "ipc/arena.hpp"
#include "ipc/process.hpp"
#include "ipc/stats.hpp"
#include "ipc/wire.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/transport/shm_cpu/storages.hpp"
#include "runtime/transport/transport.hpp"
#include "runtime/transport_table.hpp"

using ferry::detail::Carrier;
using ferry::detail::choose;
using namespace std::chrono_literals;

namespace {

ferry::wire::Record record_of(ferry::wire::DeviceType type, std::uint32_t flags) {
  ferry::wire::Record r = ferry::wire::make_record();
  r.device_type = static_cast<std::uint8_t>(type);
  r.flags = flags;
  return r;
}

// Waits up to 10 s for `pred`.
template <typename Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

}  // namespace

TEST_CASE("choose: a tensor travels by its device, a small copy inside its record", "[transport]") {
  using ferry::detail::Sending;
  constexpr std::uint64_t fits = ferry::wire::kInlineBytes;
  // Sending{cuda, shared, contiguous, bytes}
  CHECK(choose(Sending{true, false, true, 8}) == Carrier::cuda_ipc);  // however small
  CHECK(choose(Sending{true, true, true, 1 << 20}) == Carrier::cuda_ipc);
  CHECK(choose(Sending{false, false, true, 0}) == Carrier::in_record);
  CHECK(choose(Sending{false, false, true, fits}) == Carrier::in_record);
  CHECK(choose(Sending{false, false, true, fits + 1}) == Carrier::shm_cpu);  // too big
  CHECK(choose(Sending{false, true, true, 8}) == Carrier::shm_cpu);    // shared: stays in place
  CHECK(choose(Sending{false, false, false, 8}) == Carrier::shm_cpu);  // strided: keeps its view
  CHECK(choose(Sending{}) == Carrier::shm_cpu);  // undefined or sparse: shm_cpu names the fault
}

TEST_CASE("sending: what choose() is told of a tensor", "[transport]") {
  using ferry::detail::sending;
  const at::Tensor small = at::arange(4, at::kLong);
  CHECK(choose(sending(small, false)) == Carrier::in_record);
  CHECK(sending(small, false).bytes == 32);
  CHECK(choose(sending(at::zeros({4, 4}).t(), false)) == Carrier::shm_cpu);
  CHECK(choose(sending(at::zeros({1000}), false)) == Carrier::shm_cpu);
  const at::Tensor shared = ferry::empty_shared({4}, at::kLong);
  CHECK(choose(sending(shared, false)) == Carrier::shm_cpu);
  CHECK(choose(sending(shared, true)) == Carrier::in_record);  // detached: a copy anyway
  CHECK(choose(sending(at::Tensor(), false)) == Carrier::shm_cpu);
  CHECK(choose(sending(at::eye(3).to_sparse(), false)) == Carrier::shm_cpu);
}

TEST_CASE("choose: a record returns through the transport that made it", "[transport]") {
  using ferry::wire::DeviceType;
  CHECK(choose(record_of(DeviceType::cpu, 0)) == Carrier::shm_cpu);
  CHECK(choose(record_of(DeviceType::cpu, ferry::wire::kFlagCopied)) == Carrier::shm_cpu);
  CHECK(choose(record_of(DeviceType::cuda, 0)) == Carrier::cuda_ipc);
  CHECK(choose(record_of(DeviceType::cuda, ferry::wire::kFlagByFd)) == Carrier::cuda_ipc);
  // A CUDA tensor staged through shared memory for a receiver that cannot open device memory:
  // a CPU record, which the CUDA transport moves back to the device.
  CHECK(choose(record_of(DeviceType::cpu, ferry::wire::kFlagCopied | ferry::wire::kFlagToDevice)) ==
        Carrier::cuda_ipc);
  CHECK(std::string(ferry::detail::carrier_name(Carrier::shm_cpu)) == "shm_cpu");
  CHECK(choose(record_of(DeviceType::cpu, ferry::wire::kFlagInline | ferry::wire::kFlagCopied)) ==
        Carrier::in_record);
  CHECK(std::string(ferry::detail::carrier_name(Carrier::cuda_ipc)) == "cuda_ipc");
  CHECK(std::string(ferry::detail::carrier_name(Carrier::in_record)) == "in_record");
}

TEST_CASE("the table gives each carrier its transport, and all of them", "[transport]") {
  const auto all = ferry::detail::all_transports();
  CHECK(all[0] == &ferry::detail::transport(Carrier::shm_cpu));
  CHECK(all[1] == &ferry::detail::transport(Carrier::cuda_ipc));
  CHECK(all[2] == &ferry::detail::transport(Carrier::in_record));
  CHECK(all[0] != all[1]);
  CHECK(all[1] != all[2]);
}

TEST_CASE("in_record through the interface: the bytes cross in the record, nothing is held",
          "[transport]") {
  const ferry::detail::Transport& in = ferry::detail::transport(Carrier::in_record);
  const std::uint64_t leases = ferry::arena_stats().leases_outstanding;
  const std::uint64_t blocks = ferry::arena_stats().blocks_in_use;
  const ferry::detail::SendContext ctx{ferry::Arena::local(), {}, false};
  for (const at::Tensor& t :
       {at::arange(6, at::kInt).view({2, 3}), at::scalar_tensor(2.5), at::empty({0, 3}),
        at::arange(44, at::kFloat), at::ones({2, 1, 3}, at::kDouble).narrow(1, 0, 1)}) {
    ferry::detail::Outgoing o = in.encode(t, 0, ctx);
    CHECK(o.ledger == nullptr);  // no lease
    CHECK_FALSE(o.copied);
    o.record.msg_count = 1;  // the queue frames the message
    CHECK(ferry::wire::validate(o.record) == "");
    CHECK(choose(o.record) == Carrier::in_record);
    // What a receiver in another process sees: only the record's bytes.
    ferry::detail::Claim c;
    std::memcpy(&c.record, &o.record, sizeof c.record);
    in.claim(c, ferry::current_pid(), {});
    CHECK(c.error.empty());
    CHECK(c.ledger == nullptr);
    const at::Tensor got = in.decode(c, ferry::current_pid());
    CHECK(got.sizes() == t.sizes());
    CHECK(got.scalar_type() == t.scalar_type());
    CHECK(got.equal(t));
    if (t.numel() > 0) CHECK(got.data_ptr() != t.data_ptr());
    CHECK_FALSE(ferry::detail::is_received(got));  // the receiver's own memory
  }
  CHECK(in.in_flight() == 0);
  CHECK(ferry::arena_stats().leases_outstanding == leases);
  CHECK(ferry::arena_stats().blocks_in_use == blocks);
  // encode() refuses what choose() would not give it, rather than truncate it.
  CHECK_THROWS_WITH(in.encode(at::zeros({100}), 3, ctx),
                    Catch::Contains("tensor 3 (400 bytes) does not fit a record"));
  CHECK_THROWS_WITH(in.encode(at::zeros({4, 4}).t(), 0, ctx), Catch::Contains("contiguous"));
  CHECK(choose(ferry::detail::sending(at::zeros({2}, at::kComplexFloat).conj(), false)) ==
        Carrier::shm_cpu);  // lazy: its bytes are not its values
  CHECK(choose(ferry::detail::sending(at::zeros({2}, at::kComplexFloat).conj().resolve_conj(),
                                      false)) == Carrier::in_record);
}

TEST_CASE("shm_cpu through the interface: encode, claim, decode give a view of the sender's block",
          "[transport]") {
  int records[2];
  int dropped[2];
  REQUIRE(::pipe(records) == 0);
  REQUIRE(::pipe(dropped) == 0);
  const pid_t sender = ferry::test::fork_child([&] {
    const ferry::detail::Transport& cpu = ferry::detail::transport(Carrier::shm_cpu);
    const std::uint64_t base = ferry::arena_stats().leases_outstanding;
    at::Tensor t = ferry::empty_shared({1024}, at::kFloat).fill_(7);
    const ferry::detail::SendContext ctx{ferry::Arena::local(), {}, false};
    ferry::detail::Outgoing o = cpu.encode(t, 0, ctx);
    if (o.copied || o.ledger != &ferry::Arena::local().ledger()) ::_exit(10);  // in place
    if (cpu.in_flight() != 1) ::_exit(11);
    if (::write(records[1], &o.record, sizeof o.record) != sizeof o.record) ::_exit(12);
    // The receiver's claim is what ends "in flight"; its view's death ends the lease.
    if (!eventually([&] { return cpu.in_flight() == 0; })) ::_exit(13);
    char c;
    if (::read(dropped[0], &c, 1) != 1) ::_exit(14);
    t.reset();  // the lease is all that holds the block now
    if (!eventually([&] { return ferry::arena_stats().leases_outstanding == base; })) ::_exit(15);
  });
  ferry::detail::Claim c;
  REQUIRE(::read(records[0], &c.record, sizeof c.record) == sizeof c.record);
  REQUIRE(choose(c.record) == Carrier::shm_cpu);
  const ferry::detail::Transport& cpu = ferry::detail::transport(choose(c.record));
  const pid_t me = ferry::current_pid();
  cpu.claim(c, me, {});
  REQUIRE(c.error.empty());
  REQUIRE(c.ledger != nullptr);
  {
    at::Tensor got = cpu.decode(c, me);
    CHECK(ferry::detail::is_received(got));  // a view, not a copy
    CHECK(got.numel() == 1024);
    CHECK(got.eq(7).all().item<bool>());
  }
  REQUIRE(::write(dropped[1], "x", 1) == 1);
  CHECK(ferry::test::wait_child(sender) == 0);
}
