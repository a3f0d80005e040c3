// What a receiver keeps costs what it holds (design invariant 9): small copied tensors become
// its own at once, and what it received from a sender that died moves into its own memory, so
// the sender's segments are unmapped. Real processes, real shared memory, /proc as the witness.
// LibTorch first: its glog defines CHECK, which Catch's must replace.
#include "runtime/tensor_queue.hpp"

#include <signal.h>

#include "../catch.hpp"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "../test_util.hpp"
#include "ipc/segment.hpp"
#include "ipc/stats.hpp"
#include "runtime/peer_exit.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/transport/shm_cpu/shm_cpu.hpp"

using ferry::Error;
using ferry::TensorQueue;
using ferry::Tensors;
using namespace std::chrono_literals;

namespace {

constexpr std::int64_t kLarge = 1 << 18;  // float32 elements: 1 MiB, a view when received

// A line of /proc/self/maps: the address range and the file mapped there.
struct Mapping {
  std::uintptr_t begin = 0, end = 0;
  unsigned long inode = 0;
  std::string path;
};

std::vector<Mapping> mappings() {
  std::vector<Mapping> out;
  std::ifstream in("/proc/self/maps");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev;
    Mapping m;
    fields >> range >> perms >> offset >> dev >> m.inode;
    std::getline(fields >> std::ws, m.path);
    const auto dash = range.find('-');
    m.begin = std::stoull(range.substr(0, dash), nullptr, 16);
    m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    out.push_back(m);
  }
  return out;
}

bool is_segment(const Mapping& m) {
  return ferry::test::is_segment_path(m.path, ferry::default_shm_dir());
}

std::set<unsigned long> mapped_segments() {
  std::set<unsigned long> out;
  for (const Mapping& m : mappings()) {
    if (is_segment(m)) out.insert(m.inode);
  }
  return out;
}

bool in_shared_memory(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (const Mapping& m : mappings()) {
    if (a >= m.begin && a < m.end) return is_segment(m);
  }
  return false;
}

// Shared memory mapped and touched by this process, in KiB.
long rss_shmem_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("RssShmem:", 0) == 0) return std::stol(line.substr(9));
  }
  return -1;
}

std::set<unsigned long> minus(const std::set<unsigned long>& a, const std::set<unsigned long>& b) {
  std::set<unsigned long> out;
  for (auto i : a) {
    if (b.count(i) == 0) out.insert(i);
  }
  return out;
}

bool any_mapped(const std::set<unsigned long>& segments) {
  return !minus(segments, minus(segments, mapped_segments())).empty();
}

// Polls `done` every 5 ms, running `poke` between polls, for up to 10 s.
template <typename Done, typename Poke>
bool eventually(Done done, Poke poke) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    poke();
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// A recv that only gives the queue's housekeeping a chance to run: the queue is empty and its
// senders are dead, so it ends at once with peer_dead (or a timeout).
void poke_recv(TensorQueue& q) {
  try {
    q.try_recv(0ms);
  } catch (const Error& e) {
    if (e.code() != ferry::Errc::peer_dead) throw;
  }
}

}  // namespace

TEST_CASE("a small copied tensor is the receiver's own at once, a shared one stays a view",
          "[receiver]") {
  if (ferry::detail::copy_on_receipt_below() <= 256) {
    WARN("SKIP: FERRY_COPY_ON_RECEIPT_BELOW is set to 256 bytes or less");
    return;
  }
  const auto base = ferry::arena_stats();
  auto q = TensorQueue::create({4});
  auto up = TensorQueue::create({4});
  auto down = TensorQueue::create({4});
  const at::Tensor values = at::arange(64, at::kFloat);
  at::Tensor shared = ferry::empty_shared({64}, at::kFloat);
  shared.copy_(values);
  const pid_t child = ferry::test::fork_child([&] {
    const auto before = ferry::transport_stats();
    Tensors m = q.recv(30s);
    const auto after = ferry::transport_stats();
    if (!m[0].equal(values) || !m[1].equal(values)) ::_exit(10);
    if (after.tensors_copied_on_receipt - before.tensors_copied_on_receipt != 1) ::_exit(11);
    if (in_shared_memory(m[0].data_ptr())) ::_exit(12);
    if (!in_shared_memory(m[1].data_ptr())) ::_exit(13);
    up.send({}, 30s);  // holding both
    down.recv(30s);    // the sender has written its shared tensor by now
    if (!m[1].equal(at::full({64}, 7.0f))) ::_exit(14);
    if (!m[0].equal(values)) ::_exit(15);
  });
  q.send({values, shared}, 30s);  // 256 bytes copied on send, and 256 bytes shared
  up.recv(30s);
  // The receiver holds both, yet only the shared tensor's lease is out: the copied block is back.
  const auto held = ferry::arena_stats();
  CHECK(held.leases_outstanding == base.leases_outstanding + 1);
  CHECK(held.blocks_in_use == base.blocks_in_use + 1);  // `shared` itself
  shared.fill_(7);
  down.send({}, 30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
}

TEST_CASE("what a dead sender sent moves into the receiver, and its segments are unmapped",
          "[receiver]") {
  auto q = TensorQueue::create({4});
  const auto before = mapped_segments();
  const pid_t child = ferry::test::fork_child([&] {
    at::Tensor shared = ferry::empty_shared({kLarge}, at::kFloat).fill_(5);
    q.send({at::arange(kLarge, at::kFloat), at::full({kLarge}, 3.0f), shared, at::arange(16)}, 30s);
    if (ferry::flush(30s) != 0) ::_exit(9);
    ::pause();  // until killed
  });
  Tensors m = q.recv(30s);
  const auto child_segments = minus(mapped_segments(), before);
  REQUIRE(child_segments.size() >= 2);  // its ledger and the arena segment holding the tensors
  at::Tensor big = m[0];
  at::Tensor part = big.slice(0, 100, 200);  // a second view of big's storage
  at::Tensor shared = m[2];
  at::Tensor small = m[3];
  REQUIRE(in_shared_memory(big.data_ptr()));
  m.clear();  // m[1] is dropped: nothing of it is left to move
  ::kill(child, SIGKILL);
  ferry::test::wait_child(child);
  const auto moved_before = ferry::transport_stats().storages_relocated;

  bool poke_queue = false;
  SECTION("when the supervisor says so") {
    ferry::notify_peer_exit(child);
  }
  SECTION("at the next recv") {
    poke_queue = true;
  }
  SECTION("when the user asks") {
    CHECK(ferry::release_dead_peers() == 2);
  }

  const bool unmapped = eventually([&] { return !any_mapped(child_segments); },
                                   [&] {
                                     if (poke_queue) poke_recv(q);
                                   });
  CHECK(unmapped);
  CHECK(ferry::transport_stats().storages_relocated - moved_before == 2);
  CHECK_FALSE(in_shared_memory(big.data_ptr()));
  CHECK_FALSE(in_shared_memory(shared.data_ptr()));
  CHECK(big.equal(at::arange(kLarge, at::kFloat)));
  CHECK(shared.eq(5).all().item<bool>());
  CHECK(small.equal(at::arange(16)));
  part[5] = -1.0f;  // views of one storage still alias each other
  CHECK(big[105].item<float>() == -1.0f);
}

TEST_CASE("a receiver keeping results of 20 senders killed in turn holds none of their memory",
          "[receiver]") {
  constexpr int kSenders = 20;
  constexpr std::int64_t kResult = 1 << 20;  // float32 elements: 4 MiB
  auto idle = TensorQueue::create({4});      // received on at the end, for its housekeeping
  const auto base_segments = mapped_segments();
  const long base_shmem = rss_shmem_kib();
  const auto moved_before = ferry::transport_stats().storages_relocated;
  std::vector<Tensors> kept;
  for (int i = 0; i < kSenders; ++i) {
    // A queue per sender: one whose only sender died answers peer_dead until the next one pushes.
    auto q = TensorQueue::create({4});
    const pid_t child = ferry::test::fork_child([&] {
      // Small segments, so twenty dead senders' memory fits any /dev/shm.
      ::setenv("FERRY_ARENA_SEGMENT_MB", "8", 1);
      ::setenv("FERRY_LEASE_SLOTS", "256", 1);
      q.send({at::full({kResult}, static_cast<float>(i)), at::full({4}, i)}, 30s);
      if (ferry::flush(30s) != 0) ::_exit(9);
      ::pause();
    });
    Tensors m = q.recv(30s);
    REQUIRE(m[0].sum().item<float>() == static_cast<float>(i) * kResult);  // every page read
    kept.push_back(std::move(m));
    ::kill(child, SIGKILL);
    ferry::test::wait_child(child);
  }
  const bool released =
      eventually([&] { return mapped_segments() == base_segments; }, [&] { poke_recv(idle); });
  CHECK(released);
  INFO("RssShmem before: " << base_shmem << " KiB, after: " << rss_shmem_kib() << " KiB");
  CHECK(rss_shmem_kib() <= base_shmem + 1024);  // 20 senders' results would be 80 MiB
  CHECK(ferry::transport_stats().storages_relocated - moved_before == kSenders);
  for (int i = 0; i < kSenders; ++i) {
    CHECK(kept[i][0].eq(i).all().item<bool>());
    CHECK(kept[i][1].equal(at::full({4}, i)));
  }
}
