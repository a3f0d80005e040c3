// Leases: a received tensor keeps the sender's block alive exactly as long as it is used.
#include "../catch.hpp"

#include <random>

#include "../test_util.hpp"
#include "ipc/stats.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/tensor_queue.hpp"

using ferry::TensorQueue;
using ferry::Tensors;
using namespace std::chrono_literals;

namespace {

// Polls arena_stats() (which reclaims) until `pred` holds or 10 s pass.
template <typename Pred>
ferry::ArenaStats settle(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  ferry::ArenaStats s = ferry::arena_stats();
  while (!pred(s) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    s = ferry::arena_stats();
  }
  return s;
}

}  // namespace

TEST_CASE("a block returns to the sender when the receiver drops its last view", "[lease]") {
  const auto base = ferry::arena_stats();
  auto q = TensorQueue::create({4});
  auto up = TensorQueue::create({4});    // child -> parent
  auto down = TensorQueue::create({4});  // parent -> child
  const pid_t child = ferry::test::fork_child([&] {
    Tensors m = q.recv(30s);
    at::Tensor view = m[0].slice(0, 10, 20);  // a view keeps the lease too
    m.clear();
    up.send({}, 30s);  // "dropped the message, kept a view"
    down.recv(30s);
    view.reset();
    up.send({}, 30s);  // "dropped everything"
    down.recv(30s);
  });
  {
    auto t = ferry::empty_shared({1 << 18}, at::kFloat);  // 1 MiB
    q.send({t}, 30s);
  }  // the sender's own reference is gone; the receiver's lease is all that is left
  up.recv(30s);
  auto held = ferry::arena_stats();
  REQUIRE(held.blocks_in_use == base.blocks_in_use + 1);
  REQUIRE(held.leases_outstanding == base.leases_outstanding + 1);
  down.send({}, 30s);
  up.recv(30s);
  auto freed =
      settle([&](const ferry::ArenaStats& s) { return s.blocks_in_use == base.blocks_in_use; });
  REQUIRE(freed.blocks_in_use == base.blocks_in_use);
  REQUIRE(freed.bytes_in_use == base.bytes_in_use);
  REQUIRE(freed.leases_outstanding == base.leases_outstanding);
  down.send({}, 30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
}

TEST_CASE("steady streaming reuses blocks instead of growing", "[lease]") {
  auto q = TensorQueue::create({8});
  const pid_t child = ferry::test::fork_child([&] {
    for (int i = 0; i < 500; ++i) q.recv(30s);
  });
  for (int i = 0; i < 500; ++i) q.send({ferry::empty_shared({1 << 16}, at::kFloat)}, 30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
  auto s = settle([](const ferry::ArenaStats& s) { return s.leases_outstanding == 0; });
  // 500 x 256 KiB went through, yet the arena holds no more than a couple of segments.
  REQUIRE(s.segments <= 2);
  REQUIRE(s.leases_outstanding == 0);
}

TEST_CASE("a receiver SIGKILLed while holding tensors gives its leases back", "[lease]") {
  const auto base = ferry::arena_stats();
  const auto reclaimed_before = ferry::transport_stats().leases_reclaimed;
  auto q = TensorQueue::create({8});
  auto ctl = TensorQueue::create({2});
  const pid_t child = ferry::test::fork_child([&] {
    Tensors a = q.recv(30s);
    Tensors b = q.recv(30s);
    ctl.send({}, 30s);
    ::pause();  // holds a and b until killed
  });
  q.send({ferry::empty_shared({1000}, at::kFloat), ferry::empty_shared({10}, at::kLong)}, 30s);
  // Copied on send, and large enough (256 KiB) that the receiver keeps a view rather than a copy
  // of its own: its block is leased the same way.
  q.send({at::ones({1 << 16})}, 30s);
  ctl.recv(30s);
  REQUIRE(ferry::arena_stats().leases_outstanding == base.leases_outstanding + 3);
  ::kill(child, SIGKILL);
  ferry::test::wait_child(child);
  auto s =
      settle([&](const ferry::ArenaStats& s) { return s.blocks_in_use == base.blocks_in_use; });
  REQUIRE(s.blocks_in_use == base.blocks_in_use);
  REQUIRE(s.leases_outstanding == base.leases_outstanding);
  REQUIRE(ferry::transport_stats().leases_reclaimed - reclaimed_before == 3);
}

TEST_CASE("receivers killed at random instants leak nothing and jam nothing", "[lease][kill]") {
  const auto base = ferry::arena_stats();
  auto q = TensorQueue::create({16});
  std::mt19937 rng(7);
  int delivered_to_survivor = 0;
  for (int round = 0; round < 30; ++round) {
    const pid_t child = ferry::test::fork_child([&] {
      for (;;) {
        Tensors m = q.recv(30s);
        if (m.size() != 2 || m[0][0].item<int>() != m[1][0].item<int>()) ::_exit(50);
      }
    });
    for (int i = 0; i < 20; ++i) {
      const Tensors m = {ferry::empty_shared({4096}, at::kInt).fill_(i),
                         at::full({8}, i, at::kInt)};
      // Until the new child's first pop registers it, a full queue whose only consumer was
      // killed answers peer_dead: the sender is told, and may try again.
      for (;;) {
        try {
          q.send(m, 30s);
          break;
        } catch (const ferry::Error& e) {
          REQUIRE(e.code() == ferry::Errc::peer_dead);
          std::this_thread::sleep_for(1ms);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    ::kill(child, SIGKILL);
    const int code = ferry::test::wait_child(child);
    REQUIRE((code == 128 + SIGKILL || code == 0));
  }
  // Whatever the killed receivers left queued still arrives whole here.
  while (auto m = q.try_recv(50ms)) {
    REQUIRE(m->size() == 2);
    REQUIRE((*m)[0][0].item<int>() == (*m)[1][0].item<int>());
    ++delivered_to_survivor;
  }
  auto s =
      settle([&](const ferry::ArenaStats& s) { return s.blocks_in_use == base.blocks_in_use; });
  REQUIRE(s.blocks_in_use == base.blocks_in_use);
  REQUIRE(s.leases_outstanding == base.leases_outstanding);
  INFO("messages left for the survivor: " << delivered_to_survivor);
}
