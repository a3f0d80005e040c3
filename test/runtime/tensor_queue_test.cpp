#include "runtime/tensor_queue.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>

#include "../catch.hpp"

#include <torch/version.h>

#include <sstream>

#include "../test_util.hpp"
#include "ipc/env.hpp"
#include "ipc/stats.hpp"
#include "ipc/wire.hpp"
#include "runtime/shared_tensor.hpp"

using ferry::Errc;
using ferry::Error;
using ferry::TensorQueue;
using ferry::Tensors;
using namespace std::chrono_literals;

namespace {

// The child receives one message, checks it against what `expect` rebuilds from the same seed,
// and answers with its own copy so the parent can compare too.
void echo_child(TensorQueue& in, TensorQueue& out) {
  Tensors m = in.recv(30s);
  Tensors back;
  for (auto& t : m) back.push_back(t.clone());
  out.send(back, 30s);
  if (ferry::flush(30s) != 0) ::_exit(9);  // stay until the parent has taken the reply
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         (a.numel() == 0 || at::equal(a.to(at::kDouble), b.to(at::kDouble)));
}

at::Tensor sample(at::ScalarType t) {
  if (t == at::kBool) return at::rand({5, 3}) > 0.5;
  if (at::isComplexType(t)) return at::randn({5, 3}, at::kComplexDouble).to(t);
  return (at::rand({5, 3}) * 100).to(t);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The fds open in this process, each with what it names.
std::map<int, std::string> open_fds() {
  std::map<int, std::string> out;
  char target[512];
  for (int fd = 0; fd < 4096; ++fd) {
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target);
    if (n > 0) out[fd] = std::string(target, static_cast<std::size_t>(n));
  }
  return out;
}

// The fds open now that were not open in `before`.
std::vector<std::string> opened_since(const std::map<int, std::string>& before) {
  std::vector<std::string> out;
  for (const auto& [fd, what] : open_fds()) {
    const auto it = before.find(fd);
    if (it == before.end() || it->second != what) out.push_back(std::to_string(fd) + " " + what);
  }
  return out;
}

// Waits until no fd is open that was not open in `before`, calling nothing of ferry's meanwhile;
// returns what is still open after `limit`.
std::vector<std::string> wait_for_fds_of(const std::map<int, std::string>& before,
                                         std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<std::string> left;
  while (!(left = opened_since(before)).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  return left;
}

// Mappings of shared-memory segments in this process.
std::size_t shm_mappings() {
  const std::string dir = ferry::env::text("FERRY_SHM_DIR", "/dev/shm");
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  std::string maps;
  char buf[65536];
  for (ssize_t n; fd >= 0 && (n = ::read(fd, buf, sizeof buf)) > 0;) maps.append(buf, n);
  if (fd >= 0) ::close(fd);
  std::size_t count = 0;
  std::istringstream lines(maps);
  for (std::string line; std::getline(lines, line);) {
    const auto path = line.find('/');
    if (path != std::string::npos && ferry::test::is_segment_path(line.substr(path), dir)) ++count;
  }
  return count;
}

// Makes this process's arena, its lease ledger and its segment server (they stay for good) before
// a test counts what it has open: one message to itself, taken back.
void make_arena() {
  auto q = TensorQueue::create({2});
  q.send({ferry::empty_shared({1}, at::kFloat)}, 5s);
  q.recv(5s);
}

// In a forked child: re-executes this binary to run only the hidden test case `tag`, with fds
// `a` and `b` inherited and named in the environment variable `env` ("a,b").
[[noreturn]] void exec_peer(const char* tag, const char* env, int a, int b) {
  for (int fd : {a, b}) ::fcntl(fd, F_SETFD, 0);  // inherit across exec
  const std::string fds = std::to_string(a) + "," + std::to_string(b);
  ::setenv(env, fds.c_str(), 1);
  ::execl("/proc/self/exe", "runtime_tests", tag, nullptr);
  ::_exit(127);
}

// Requires that within 5 s, with no call into ferry, no fd is open that was not in `before`, and
// the arena has no more leases out than `leases_before`.
void require_nothing_left(const std::map<int, std::string>& before, std::uint64_t leases_before) {
  const std::vector<std::string> left = wait_for_fds_of(before, 5s);
  INFO("still open: " << (left.empty() ? std::string() : left.front()));
  REQUIRE(left.empty());
  REQUIRE(ferry::arena_stats().leases_outstanding == leases_before);
}

// A consumer that takes one message from `q`, says so on `ctl` and holds it until killed; run
// in a child forked from the test, or in a runtime_tests exec'd from one (spawn).
[[noreturn]] void hold_until_killed(TensorQueue& q, TensorQueue& ctl) {
  Tensors held = q.recv(30s);
  ctl.send({}, 30s);
  for (;;) ::pause();
}

}  // namespace

TEST_CASE("every dtype crosses to another process and back, bit for bit", "[queue]") {
  std::vector<at::ScalarType> types = {
      at::kByte,          at::kChar,  at::kShort,   at::kInt,         at::kLong,
      at::kHalf,          at::kFloat, at::kDouble,  at::kComplexHalf, at::kComplexFloat,
      at::kComplexDouble, at::kBool,  at::kBFloat16};
#if TORCH_VERSION_MAJOR >= 2 && TORCH_VERSION_MINOR >= 3
  types.insert(types.end(), {at::kUInt16, at::kUInt32, at::kUInt64});
#endif
  auto to_child = TensorQueue::create({64});
  auto to_parent = TensorQueue::create({64});
  Tensors sent;
  for (auto t : types) {
    auto plain = sample(t);
    sent.push_back(plain);                    // copied on send
    sent.push_back(ferry::to_shared(plain));  // zero-copy
  }
  const pid_t child = ferry::test::fork_child([&] { echo_child(to_child, to_parent); });
  to_child.send(sent, 30s);
  Tensors back = to_parent.recv(30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
  REQUIRE(back.size() == sent.size());
  for (std::size_t i = 0; i < sent.size(); ++i) {
    INFO("tensor " << i << " dtype " << sent[i].scalar_type());
    REQUIRE(same(back[i], sent[i]));
    // Bit for bit, not just equal values (NaN payloads, -0.0).
    REQUIRE(std::memcmp(back[i].contiguous().data_ptr(), sent[i].contiguous().data_ptr(),
                        sent[i].nbytes()) == 0);
  }
}

TEST_CASE("0-d, empty and strided views keep their shape and strides", "[queue]") {
  auto q = TensorQueue::create({32});
  auto base = ferry::empty_shared({6, 8}, at::kFloat);
  base.copy_(at::arange(48, at::kFloat).view({6, 8}));
  Tensors sent = {
      ferry::to_shared(at::scalar_tensor(3.5)),   // 0-d
      at::empty({0, 4}),                          // empty
      base.t(),                                   // transposed: strides (1, 8)
      base.slice(1, 1, 7, 2),                     // every other column: strides (8, 2), offset 1
      base[2],                                    // a row: offset 16
      base.t().slice(0, 0, 8, 3),                 // gapped and transposed, copied? no: zero-copy
      at::arange(40, at::kInt).view({5, 8}).t(),  // ordinary transposed: copied, strides kept
  };
  const pid_t child = ferry::test::fork_child([&] {
    Tensors m = q.recv(30s);
    if (m.size() != 7) ::_exit(10);
    if (m[0].dim() != 0 || m[0].item<double>() != 3.5) ::_exit(11);
    if (m[1].sizes() != at::IntArrayRef({0, 4})) ::_exit(12);
    if (m[2].strides() != at::IntArrayRef({1, 8}) || m[2].is_contiguous()) ::_exit(13);
    if (m[3].strides() != at::IntArrayRef({8, 2}) || m[3].storage_offset() != 1) ::_exit(14);
    if (m[4].storage_offset() != 16 || m[4][3].item<float>() != 19) ::_exit(15);
    if (m[5].strides() != at::IntArrayRef({3, 8})) ::_exit(16);
    if (m[6].strides() != at::IntArrayRef({1, 8})) ::_exit(17);
    auto expect = at::arange(48, at::kFloat).view({6, 8});
    if (!m[2].equal(expect.t()) || !m[3].equal(expect.slice(1, 1, 7, 2)) ||
        !m[5].equal(expect.t().slice(0, 0, 8, 3)) ||
        !m[6].equal(at::arange(40, at::kInt).view({5, 8}).t())) {
      ::_exit(18);
    }
  });
  q.send(sent, 30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
}

TEST_CASE("zero-copy: the receiver sees the sender's memory, not a copy", "[queue]") {
  auto q = TensorQueue::create({4});
  auto ack = TensorQueue::create({4});
  auto t = ferry::empty_shared({1024}, at::kInt);
  t.fill_(1);
  const auto before = ferry::transport_stats();
  const pid_t child = ferry::test::fork_child([&] {
    Tensors m = q.recv(30s);
    m[0].fill_(42);  // writes through to the sender's block
    ack.send({}, 30s);
  });
  q.send({t}, 30s);
  ack.recv(30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
  REQUIRE(t.eq(42).all().item<bool>());
  const auto after = ferry::transport_stats();
  REQUIRE(after.tensors_zero_copy - before.tensors_zero_copy == 1);
  REQUIRE(after.tensors_copied == before.tensors_copied);
}

TEST_CASE("copy-on-send is counted with its reason, and forwarding a received tensor copies",
          "[queue]") {
  auto q = TensorQueue::create({4});
  auto loop = TensorQueue::create({4});
  const auto before = ferry::transport_stats();
  // An ordinary tensor, large enough (256 KiB) that the receiver keeps a view of the sender's
  // block: a smaller one would be copied on receipt, and forwarding it would be an ordinary send.
  const at::Tensor ones = at::ones({1 << 16});
  q.send({ones}, 5s);
  Tensors got = q.recv(5s);
  loop.send(got, 5s);  // received from a peer (here, ourselves): forwarded by copy
  REQUIRE(loop.recv(5s)[0].equal(ones));
  const auto after = ferry::transport_stats();
  const auto reason = [&](ferry::CopyReason r) {
    return after.copies_by_reason[static_cast<int>(r)] -
           before.copies_by_reason[static_cast<int>(r)];
  };
  REQUIRE(reason(ferry::CopyReason::not_shared) == 1);
  REQUIRE(reason(ferry::CopyReason::received) == 1);
  REQUIRE(after.bytes_copied - before.bytes_copied == 2 * ones.nbytes());
}

TEST_CASE("send reports how each tensor travelled: shared in place, or copied and why", "[queue]") {
  auto q = TensorQueue::create({8});
  const at::Tensor shared = ferry::empty_shared({1024}, at::kFloat).fill_(1);
  const at::Tensor ordinary = at::ones({100}, at::kDouble);
  const ferry::SendReport r = q.send({shared, ordinary}, 5s);
  REQUIRE(r.tensors.size() == 2);
  CHECK_FALSE(r.tensors[0].copied.has_value());
  CHECK(r.tensors[0].bytes == 4096);
  REQUIRE(r.tensors[1].copied.has_value());
  CHECK(*r.tensors[1].copied == ferry::CopyReason::not_shared);
  CHECK(r.tensors[1].bytes == 800);
  const ferry::TransferCounts c = r.counts();
  CHECK(c.tensors_zero_copy == 1);
  CHECK(c.bytes_zero_copy == 4096);
  CHECK(c.tensors_copied == 1);
  CHECK(c.bytes_copied == 800);
  CHECK(c.copies_by_reason[static_cast<int>(ferry::CopyReason::not_shared)] == 1);
  CHECK(r.counts(1).tensors_zero_copy == 0);  // a caller's header can be left out

  TensorQueue::SendOptions detached;
  detached.detached = true;
  detached.timeout = 5s;
  const ferry::SendReport d = q.send({shared}, detached);
  REQUIRE(d.tensors.size() == 1);
  CHECK(d.tensors[0].copied == ferry::CopyReason::detached);
  CHECK(q.recv(5s).size() == 2);
  CHECK(q.recv(5s)[0].equal(shared));
}

TEST_CASE("send_described puts first a tensor made from how the rest travelled", "[queue]") {
  auto q = TensorQueue::create({8});
  const at::Tensor shared = ferry::empty_shared({16}, at::kInt).fill_(7);
  const at::Tensor ordinary = at::arange(32, at::kLong);
  const auto before = ferry::transport_stats();
  const ferry::SendReport r = q.send_described(
      [](const ferry::SendReport& body) {
        const ferry::TransferCounts c = body.counts();
        return at::tensor({static_cast<std::int64_t>(c.bytes_zero_copy),
                           static_cast<std::int64_t>(c.bytes_copied)});
      },
      {shared, ordinary}, TensorQueue::SendOptions{});
  CHECK(r.tensors.size() == 2);  // the body's report; the header is not in it
  Tensors got = q.recv(5s);
  REQUIRE(got.size() == 3);
  CHECK(got[0][0].item<std::int64_t>() == 64);   // the shared tensor's bytes
  CHECK(got[0][1].item<std::int64_t>() == 256);  // the ordinary one's
  CHECK(got[1].equal(shared));
  CHECK(got[2].equal(ordinary));
  const auto after = ferry::transport_stats();
  CHECK(after.tensors_copied - before.tensors_copied == 1);        // the ordinary tensor
  CHECK(after.tensors_in_record - before.tensors_in_record == 1);  // the 16-byte header
  CHECK(after.tensors_zero_copy - before.tensors_zero_copy == 1);
}

TEST_CASE("a small ordinary tensor crosses inside its record: no block, no lease, no custody",
          "[queue]") {
  auto q = TensorQueue::create({8});
  const auto before = ferry::transport_stats();
  const pid_t child = ferry::test::fork_child([&] {
    // Exits at once, leaving nothing in the queue's custody: the bytes are in the records.
    ::setenv("FERRY_EXIT_LINGER_MS", "20000", 1);
    const at::Tensor large = at::ones({1000});
    const ferry::SendReport r =
        q.send({at::arange(6, at::kLong).view({2, 3}), at::scalar_tensor(1.5), large}, 5s);
    if (!r.tensors[0].in_record || !r.tensors[1].in_record || r.tensors[2].in_record) ::_exit(10);
    if (r.counts().tensors_copied != 1) ::_exit(11);  // the large one only
    // Only the large one took a block and a lease.
    if (ferry::arena_stats().leases_outstanding != 1) ::_exit(12);
    if (ferry::arena_stats().blocks_in_use != 1) ::_exit(13);
    std::exit(0);
  });
  REQUIRE(ferry::test::wait_child(child) == 0);
  Tensors m = q.recv(5s);
  REQUIRE(m.size() == 3);
  CHECK(m[0].equal(at::arange(6, at::kLong).view({2, 3})));
  CHECK(m[1].dim() == 0);
  CHECK(m[1].item<float>() == 1.5f);
  CHECK(m[2].equal(at::ones({1000})));
  const auto after = ferry::transport_stats();
  CHECK(after.tensors_received - before.tensors_received == 3);
  CHECK(after.tensors_copied_on_receipt - before.tensors_copied_on_receipt == 1);  // the large one
}

TEST_CASE(
    "a tensor received in its record is the receiver's own, as one at::empty made: "
    "writable, resizable, aligned for its dtype",
    "[queue]") {
  auto q = TensorQueue::create({8});
  const Tensors sent = {at::randn({5}, at::kComplexDouble), at::arange(3, at::kLong),
                        at::ones({2, 2}, at::kHalf), at::zeros({0}, at::kFloat)};
  q.send(sent, 5s);
  Tensors m = q.recv(5s);
  REQUIRE(m.size() == sent.size());
  for (std::size_t i = 0; i < m.size(); ++i) {
    CHECK(m[i].equal(sent[i]));
    const auto at = reinterpret_cast<std::uintptr_t>(m[i].data_ptr());
    CHECK(at % m[i].element_size() == 0);
  }
  m[1].add_(1);
  CHECK(m[1].equal(at::arange(1, 4, at::kLong)));
  // Grown past what the record carried: new memory, the values kept, as for any CPU tensor.
  m[1].resize_({1000});
  m[1].fill_(7);
  CHECK(m[1].sum().item<std::int64_t>() == 7000);
  m[3].resize_({4}).fill_(2);
  CHECK(m[3].sum().item<float>() == 8.0f);
}

TEST_CASE("empty_for_sending makes a buffer where it travels cheapest: its record, or the arena",
          "[queue]") {
  auto q = TensorQueue::create({8});
  const at::Tensor small =
      ferry::empty_for_sending(static_cast<std::int64_t>(ferry::wire::kInlineBytes));
  const at::Tensor large =
      ferry::empty_for_sending(static_cast<std::int64_t>(ferry::wire::kInlineBytes) + 1);
  CHECK_FALSE(ferry::is_shared(small));
  CHECK(ferry::is_shared(large));
  CHECK(small.scalar_type() == at::kByte);
  CHECK(large.numel() == static_cast<std::int64_t>(ferry::wire::kInlineBytes) + 1);
  small.fill_(7);
  large.fill_(9);
  const ferry::SendReport r = q.send({small, large}, 5s);
  CHECK(r.tensors[0].in_record);
  CHECK_FALSE(r.tensors[0].copied);
  CHECK_FALSE(r.tensors[1].in_record);
  CHECK_FALSE(r.tensors[1].copied);  // made in the arena: shared in place
  Tensors m = q.recv(5s);
  REQUIRE(m.size() == 2);
  CHECK(m[0].equal(small));
  CHECK(m[1].equal(large));
  CHECK(ferry::empty_for_sending(0).numel() == 0);
  try {
    ferry::empty_for_sending(-1);
    FAIL("no error for -1 bytes");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("-1 bytes"));
  }
}

TEST_CASE("a detached send copies even a shared tensor, so the receiver's view is its own",
          "[queue]") {
  auto q = TensorQueue::create({4});
  auto done = TensorQueue::create({4});
  at::Tensor t = ferry::empty_shared({256}, at::kFloat).fill_(1);
  const pid_t child = ferry::test::fork_child([&] {
    Tensors m = q.recv(30s);
    done.recv(30s);  // the sender has changed its tensor by now
    if (!m[0].equal(at::ones({256}))) ::_exit(10);
  });
  const auto before = ferry::transport_stats();
  TensorQueue::SendOptions detached;
  detached.detached = true;
  detached.timeout = 30s;
  q.send({t}, detached);
  ferry::flush(30s);
  t.fill_(2);  // a zero-copy send would show this to the receiver
  done.send({}, 30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
  const auto after = ferry::transport_stats();
  CHECK(after.copies_by_reason[static_cast<int>(ferry::CopyReason::detached)] ==
        before.copies_by_reason[static_cast<int>(ferry::CopyReason::detached)] + 1);
  CHECK(after.tensors_zero_copy == before.tensors_zero_copy);
}

TEST_CASE("after warm-up, sending maps nothing and passes no fd", "[queue]") {
  auto q = TensorQueue::create({8});
  auto done = TensorQueue::create({2});
  const pid_t child = ferry::test::fork_child([&] {
    for (int i = 0; i < 3; ++i) q.recv(30s);  // warm-up: the ledger and data segments
    const auto warm = ferry::transport_stats();
    for (int i = 0; i < 200; ++i) {
      Tensors m = q.recv(30s);
      if (m[0][0].item<float>() != static_cast<float>(i)) ::_exit(20);
    }
    const auto after = ferry::transport_stats();
    if (after.segments_mapped != warm.segments_mapped || after.fds_fetched != warm.fds_fetched) {
      ::_exit(21);
    }
    done.send({}, 30s);
  });
  for (int i = 0; i < 3; ++i) q.send({ferry::empty_shared({256}, at::kFloat)}, 30s);
  const auto warm = ferry::transport_stats();
  for (int i = 0; i < 200; ++i) {
    auto t = ferry::empty_shared({256}, at::kFloat);
    t.fill_(static_cast<float>(i));
    q.send({t}, 30s);
  }
  done.recv(30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
  REQUIRE(ferry::transport_stats().segments_created == warm.segments_created);
}

TEST_CASE("bad tensors are refused with the index and a remedy, the queue stays usable",
          "[queue]") {
  auto q = TensorQueue::create({4});
  auto expect_invalid = [&](const Tensors& m, const std::string& needle) {
    try {
      q.send(m, 1s);
      FAIL("no error for " << needle);
    } catch (const Error& e) {
      REQUIRE(e.code() == Errc::invalid_argument);
      REQUIRE_THAT(e.what(), Catch::Contains(needle));
    }
  };
  expect_invalid({at::ones({2}), at::Tensor()}, "tensor 1 of the message is undefined");
  expect_invalid({at::ones({2, 2}).to_sparse()}, "to_dense");
  expect_invalid({at::quantize_per_tensor(at::ones({2}), 0.1, 0, at::kQUInt8)}, "dequantize");
  std::vector<std::int64_t> thirteen(13, 1);
  expect_invalid({at::ones(thirteen)}, "limit of 12");
  expect_invalid(Tensors(5, at::ones({1})), "capacity 4");
  q.send({at::ones({3})}, 1s);
  REQUIRE(q.recv(1s)[0].equal(at::ones({3})));
  REQUIRE(q.size() == 0);
}

TEST_CASE("waits end: timeout, close, and a sender that died", "[queue]") {
  auto q = TensorQueue::create({2});
  REQUIRE_FALSE(q.try_recv(20ms).has_value());
  try {
    q.recv(20ms);
    FAIL("no timeout");
  } catch (const Error& e) {
    REQUIRE(e.code() == Errc::timeout);
  }
  q.send({at::ones({1})}, 1s);
  q.send({at::ones({1})}, 1s);
  REQUIRE_THROWS_AS(q.send({at::ones({1})}, 20ms), Error);  // full

  // Closing wakes a receiver blocked in another process; queued messages drain first.
  auto r = TensorQueue::create({2});
  const pid_t child = ferry::test::fork_child([&] {
    try {
      r.recv();
      ::_exit(30);
    } catch (const Error& e) {
      ::_exit(e.code() == Errc::closed ? 0 : 31);
    }
  });
  std::this_thread::sleep_for(50ms);
  r.close();
  REQUIRE(ferry::test::wait_child(child, std::chrono::seconds(10)) == 0);
  q.close();
  REQUIRE(q.recv(1s).size() == 1);
  REQUIRE(q.recv(1s).size() == 1);
  REQUIRE_THROWS_AS(q.recv(1s), Error);
  REQUIRE_THROWS_AS(q.send({at::ones({1})}, 1s), Error);

  // A receiver waiting forever is woken when its only sender is killed.
  auto d = TensorQueue::create({2});
  const pid_t sender = ferry::test::fork_child([&] {
    d.send({at::ones({1})}, 5s);
    ::pause();
  });
  REQUIRE(d.recv(10s).size() == 1);
  ::kill(sender, SIGKILL);
  ferry::test::wait_child(sender);
  try {
    d.recv();
    FAIL("no error");
  } catch (const Error& e) {
    REQUIRE(e.code() == Errc::peer_dead);
  }
}

TEST_CASE("lazy conjugate and negative views arrive resolved", "[queue]") {
  auto q = TensorQueue::create({4});
  auto z = at::randn({4, 3}, at::kComplexFloat);
  q.send({z.conj(), at::_neg_view(z)}, 1s);
  Tensors m = q.recv(1s);
  REQUIRE(m[0].equal(z.conj().resolve_conj()));
  REQUIRE(m[1].equal(z.neg()));
}

TEST_CASE("a message whose sender was SIGKILLed the instant send() returned is delivered",
          "[queue][custody]") {
  auto q = TensorQueue::create({16});
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round);
    const pid_t child = ferry::test::fork_child([&] {
      // A view of the arena, a copy on send (too large for its record) and one inside its
      // record; after a first message, so the custody holds what this one adds too.
      q.send({ferry::empty_shared({64}, at::kFloat).fill_(round)}, 5s);
      q.send({ferry::empty_shared({1000}, at::kFloat).fill_(7), at::full({5000}, 3.0),
              at::full({4}, 2.0)},
             5s);
      ::raise(SIGKILL);  // no flush, no exit handler: only the custody outlives it
    });
    REQUIRE(ferry::test::wait_child(child) == 128 + SIGKILL);
    Tensors first = q.recv(5s);
    REQUIRE(first[0].eq(round).all().item<bool>());
    Tensors m = q.recv(5s);
    REQUIRE(m.size() == 3);
    REQUIRE(m[0].eq(7).all().item<bool>());
    REQUIRE(m[1].eq(3).all().item<bool>());
    REQUIRE(m[2].eq(2).all().item<bool>());
  }
}

TEST_CASE(
    "a sender attached without the custody: a message it was killed before sending on is "
    "reported, not jammed",
    "[queue][custody]") {
  auto q = TensorQueue::create({4});
  const pid_t child = ferry::test::fork_child([&] {
    // Closes the socket it inherited, then holds the queue by its ring alone.
    ::close(q.custody_fd());
    auto bare = TensorQueue::attach(q.fd());
    bare.send({ferry::empty_shared({64}, at::kFloat)}, 5s);
    ::raise(SIGKILL);  // nothing of it outlives it: the memory goes with the process
  });
  REQUIRE(ferry::test::wait_child(child) == 128 + SIGKILL);
  try {
    q.recv(5s);
    FAIL("no error");
  } catch (const Error& e) {
    REQUIRE(e.code() == Errc::peer_dead);
    const std::string what = e.what();
    REQUIRE_THAT(what, Catch::Contains(std::to_string(child) + ") exited"));
    REQUIRE(what.find("ferry:", 1) == std::string::npos);  // one prefix, not one per layer
  }
  q.send({at::ones({2})}, 1s);  // the dead message is gone; the queue works on
  REQUIRE(q.recv(1s)[0].equal(at::ones({2})));
}

TEST_CASE("a message of no tensors arrives as an empty list", "[queue]") {
  auto q = TensorQueue::create({2});
  q.send({}, 1s);
  REQUIRE(q.recv(1s).empty());
}

TEST_CASE("flush waits until the receiver has taken what was sent", "[queue]") {
  auto q = TensorQueue::create({4});
  REQUIRE(ferry::flush(0ms) == 0);
  // Both in blocks (the ordinary one too large for its record): two leases to wait for.
  q.send({ferry::empty_shared({10}, at::kFloat), at::ones({100})}, 1s);
  REQUIRE(ferry::flush(20ms) == 2);  // nobody has received yet
  const pid_t child = ferry::test::fork_child([&] {
    std::this_thread::sleep_for(50ms);
    q.recv(10s);
  });
  REQUIRE(ferry::flush(30s) == 0);
  REQUIRE(ferry::test::wait_child(child) == 0);
}

TEST_CASE("a sender that exits right after sending still delivers", "[queue]") {
  auto q = TensorQueue::create({4});
  const pid_t child = ferry::test::fork_child([&] {
    q.send({ferry::empty_shared({1000}, at::kFloat).fill_(7), at::full({10}, 3.0)}, 5s);
    std::exit(0);  // a normal exit lingers until the message is claimed
  });
  Tensors m = q.recv(30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
  REQUIRE(m[0].eq(7).all().item<bool>());
  REQUIRE(m[1].eq(3).all().item<bool>());
}

TEST_CASE("a sender that exits at once is delivered after it has gone, and does not wait to exit",
          "[queue][custody]") {
  auto q = TensorQueue::create({8});
  const auto copied_before = ferry::transport_stats().tensors_copied_on_receipt;
  const std::size_t mapped_before = shm_mappings();
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = ferry::test::fork_child([&] {
    // So long that a sender which waited for its receiver to claim would still be here.
    ::setenv("FERRY_EXIT_LINGER_MS", "20000", 1);
    // Each larger than a record holds, so each is a block that custody must keep.
    q.send({ferry::empty_shared({1000}, at::kFloat).fill_(7), at::full({100}, 3.0),
            at::arange(1 << 16, at::kFloat)},
           5s);
    q.send({at::ones({100})}, 5s);
    std::exit(0);
  });
  REQUIRE(ferry::test::wait_child(child) == 0);  // gone before anything was received
  REQUIRE(seconds_since(start) < 10);
  Tensors m = q.recv(5s);
  REQUIRE(m.size() == 3);
  REQUIRE(m[0].eq(7).all().item<bool>());
  REQUIRE(m[1].eq(3).all().item<bool>());
  REQUIRE(m[2].equal(at::arange(1 << 16, at::kFloat)));
  REQUIRE(q.recv(5s)[0].equal(at::ones({100})));
  // Each is the receiver's own copy, so nothing of the dead sender stays mapped here.
  REQUIRE(ferry::transport_stats().tensors_copied_on_receipt - copied_before == 4);
  REQUIRE(shm_mappings() <= mapped_before);
}

TEST_CASE("every consumer gets what an exited sender left in the queue, each message once",
          "[queue][custody]") {
  auto q = TensorQueue::create({16});
  auto done = TensorQueue::create({4});
  const pid_t sender = ferry::test::fork_child([&] {
    for (int i = 0; i < 6; ++i) q.send({ferry::empty_shared({256}, at::kInt).fill_(i)}, 5s);
    std::exit(0);
  });
  REQUIRE(ferry::test::wait_child(sender) == 0);
  auto take_three = [&] {
    int got = 0;
    for (int k = 0; k < 3; ++k) {
      Tensors m = q.recv(5s);
      const int i = m[0][0].item<int>();
      if (!m[0].eq(i).all().item<bool>()) throw std::runtime_error("a torn message");
      got |= 1 << i;
    }
    return got;
  };
  // Forked after the sender has gone: it reaches the custody through the queue it inherited.
  const pid_t other = ferry::test::fork_child([&] {
    done.send({at::full({1}, take_three(), at::kInt)}, 5s);
    // fork_child ends in _exit(), which runs no exit handler: hand over by hand, at once.
    if (ferry::flush_at_exit(0ms) != 0) ::_exit(9);
  });
  const int mine = take_three();
  const int theirs = done.recv(10s)[0].item<int>();
  REQUIRE(ferry::test::wait_child(other) == 0);
  REQUIRE((mine & theirs) == 0);
  REQUIRE((mine | theirs) == 63);
}

// Run only when the test below re-executes this binary: a spawned sender that exits at once.
TEST_CASE("exec'd peer: attach with the custody, send and exit", "[.exec_sender]") {
  const std::string fds = ferry::env::text("FERRY_TEST_SENDER_FDS", "");
  if (fds.empty()) return;
  int fd = -1, custody = -1;
  REQUIRE(std::sscanf(fds.c_str(), "%d,%d", &fd, &custody) == 2);
  auto q = TensorQueue::attach(fd, false, custody);
  ::setenv("FERRY_EXIT_LINGER_MS", "20000", 1);
  q.send({ferry::empty_shared({100}, at::kFloat).fill_(5), at::arange(10)}, 30s);
  if (ferry::env::text("FERRY_TEST_SENDER_KILLS_ITSELF", "") == "1") ::raise(SIGKILL);
}

TEST_CASE("a spawned sender that exits at once, or is SIGKILLed, is delivered after it has gone",
          "[queue][custody]") {
  const bool killed = GENERATE(false, true);
  INFO((killed ? "SIGKILLed" : "exits") << " after its send");
  auto q = TensorQueue::create({4});
  REQUIRE(q.custody_fd() >= 0);
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = ferry::test::fork_child([&] {
    ::setenv("FERRY_TEST_SENDER_KILLS_ITSELF", killed ? "1" : "0", 1);
    exec_peer("[.exec_sender]", "FERRY_TEST_SENDER_FDS", q.fd(), q.custody_fd());
  });
  REQUIRE(ferry::test::wait_child(child) == (killed ? 128 + SIGKILL : 0));
  REQUIRE(seconds_since(start) < 10);
  Tensors m = q.recv(5s);
  REQUIRE(m.size() == 2);
  REQUIRE(m[0].eq(5).all().item<bool>());
  REQUIRE(m[1].equal(at::arange(10)));
}

// Run only when the test below re-executes this binary: a spawned consumer to be killed.
TEST_CASE("exec'd peer: hold a message until killed", "[.exec_holder]") {
  const std::string fds = ferry::env::text("FERRY_TEST_HOLDER_FDS", "");
  if (fds.empty()) return;
  int in_fd = -1, ctl_fd = -1;
  REQUIRE(std::sscanf(fds.c_str(), "%d,%d", &in_fd, &ctl_fd) == 2);
  auto in = TensorQueue::attach(in_fd);
  auto ctl = TensorQueue::attach(ctl_fd);
  hold_until_killed(in, ctl);
}

TEST_CASE("a consumer SIGKILLed holding tensors leaves the producer nothing open", "[lease]") {
  const bool spawned = GENERATE(false, true);
  INFO((spawned ? "spawned" : "forked") << " consumer");
  make_arena();  // the arena, its ledger and server exist before
  const auto leases_before = ferry::arena_stats().leases_outstanding;
  const auto before = open_fds();
  {
    auto q = TensorQueue::create({4});
    auto ctl = TensorQueue::create({2});
    const pid_t child = ferry::test::fork_child([&] {
      if (!spawned) hold_until_killed(q, ctl);
      exec_peer("[.exec_holder]", "FERRY_TEST_HOLDER_FDS", q.fd(), ctl.fd());
    });
    q.send({ferry::empty_shared({1 << 16}, at::kFloat)}, 30s);  // 256 KiB: held as a view
    ctl.recv(60s);
    ::kill(child, SIGKILL);
    ferry::test::wait_child(child);
  }
  // The queues are dropped; the dead consumer's lease was all that kept q's channel open. No
  // call into ferry from here: the producer lets go on its own.
  require_nothing_left(before, leases_before);
}

// Run only when the test below re-executes this binary: a spawned consumer that takes some of
// what is queued, holds it and is killed, with the rest still in flight.
TEST_CASE("exec'd peer: take some, hold them until killed", "[.exec_partial]") {
  const std::string fds = ferry::env::text("FERRY_TEST_PARTIAL_FDS", "");
  if (fds.empty()) return;
  int in_fd = -1, ctl_fd = -1;
  REQUIRE(std::sscanf(fds.c_str(), "%d,%d", &in_fd, &ctl_fd) == 2);
  auto in = TensorQueue::attach(in_fd);
  auto ctl = TensorQueue::attach(ctl_fd);
  std::vector<Tensors> held;
  for (int i = 0; i < 10; ++i) held.push_back(in.recv(30s));
  ctl.send({}, 30s);
  for (;;) ::pause();
}

TEST_CASE(
    "a consumer SIGKILLed with messages still queued: once the producer drops the queue, "
    "nothing of it stays open, round after round",
    "[lease][abandoned]") {
  const bool spawned = GENERATE(false, true);
  INFO((spawned ? "spawned" : "forked") << " consumer");
  make_arena();  // the arena, its ledger and server exist before
  const auto leases_before = ferry::arena_stats().leases_outstanding;
  const auto abandoned_before = ferry::transport_stats().leases_abandoned;
  const auto before = open_fds();
  constexpr int kRounds = 4;  // a round's leak shows in the next: the fds are counted exactly
  for (int round = 0; round < kRounds; ++round) {
    INFO("round " << round);
    {
      auto q = TensorQueue::create({64});
      auto ctl = TensorQueue::create({2});
      const pid_t child = ferry::test::fork_child([&] {
        if (!spawned) {
          std::vector<Tensors> held;
          for (int i = 0; i < 10; ++i) held.push_back(q.recv(30s));
          ctl.send({}, 30s);
          for (;;) ::pause();
        }
        exec_peer("[.exec_partial]", "FERRY_TEST_PARTIAL_FDS", q.fd(), ctl.fd());
      });
      // 16 KiB each, not from the arena: copied on send, and held as views (or copied out on
      // receipt, which ends their leases at once).
      for (int i = 0; i < 16; ++i) q.send({at::full({4096}, float(i))}, 30s);
      ctl.recv(60s);
      ::kill(child, SIGKILL);
      ferry::test::wait_child(child);
    }
    // Both queues are dropped, 6 messages still in one of them: no process can pop them any
    // more. No call into ferry from here: the producer lets go on its own, within a second or so.
    require_nothing_left(before, leases_before);
  }
  REQUIRE(ferry::transport_stats().leases_abandoned - abandoned_before >= kRounds);
}

TEST_CASE("FERRY_EXIT_LINGER_MS: a bad value is the first send's error, a unit is read as such",
          "[queue][env]") {
  auto q = TensorQueue::create({4});
  const pid_t child = ferry::test::fork_child([&] {
    // Once this meant an exit that waits forever; now the send says so and sends nothing.
    ::setenv("FERRY_EXIT_LINGER_MS", "-5", 1);
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        q.send({at::ones({2})}, 5s);
        ::_exit(10);
      } catch (const Error& e) {
        const std::string what = e.what();
        if (e.code() != Errc::invalid_argument ||
            what.find("FERRY_EXIT_LINGER_MS='-5'") == std::string::npos ||
            what.find("from 0 ms to 1 h") == std::string::npos) {
          std::fprintf(stderr, "wrong error: %s\n", what.c_str());
          ::_exit(11);
        }
      }
    }
    // "10s" is ten seconds (it once was 10 ms): the exit below waits for the receiver, which
    // takes its time.
    ::setenv("FERRY_EXIT_LINGER_MS", "10s", 1);
    q.send({ferry::empty_shared({100}, at::kFloat).fill_(5)}, 5s);
    std::exit(0);
  });
  std::this_thread::sleep_for(500ms);
  Tensors m = q.recv(30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
  REQUIRE(m.size() == 1);
  REQUIRE(m[0].eq(5).all().item<bool>());
}

TEST_CASE("tensors of 1 GiB and more cross zero-copy", "[queue][large]") {
  struct statvfs vfs {};
  const bool room = ::statvfs("/dev/shm", &vfs) == 0 &&
                    std::uint64_t{vfs.f_bavail} * vfs.f_frsize > (std::uint64_t{5} << 29);
  if (!room) {
    WARN("SKIP: /dev/shm has less than 2.5 GiB free; the 1 GiB test needs room for it");
    return;
  }
  auto q = TensorQueue::create({2});
  auto ack = TensorQueue::create({2});
  const std::int64_t n = (std::int64_t{1} << 30) / 4 + 1024;  // just over 1 GiB of int32
  auto t = ferry::empty_shared({n}, at::kInt);
  t.fill_(5);
  t[n - 1] = 9;
  const pid_t child = ferry::test::fork_child([&] {
    Tensors m = q.recv(60s);
    if (m[0].numel() != n || m[0][n - 1].item<int>() != 9 || m[0][12345].item<int>() != 5) {
      ::_exit(40);
    }
    ack.send({}, 60s);
  });
  q.send({t}, 60s);
  ack.recv(120s);
  REQUIRE(ferry::test::wait_child(child) == 0);
}

// Run only when the test below re-executes this binary: the exec'd half of a spawned peer.
TEST_CASE("exec'd peer: attach by inherited fd and echo", "[.exec_peer]") {
  const std::string fds = ferry::env::text("FERRY_TEST_QUEUE_FDS", "");
  if (fds.empty()) return;
  int in_fd = -1, out_fd = -1;
  REQUIRE(std::sscanf(fds.c_str(), "%d,%d", &in_fd, &out_fd) == 2);
  auto in = TensorQueue::attach(in_fd);
  auto out = TensorQueue::attach(out_fd);
  Tensors m = in.recv(30s);
  out.send({m[0] + 1, m[1]}, 30s);
  REQUIRE(ferry::flush(30s) == 0);
}

TEST_CASE("a queue crosses exec by its fd", "[queue]") {
  auto to_peer = TensorQueue::create({4});
  auto from_peer = TensorQueue::create({4});
  const pid_t child = ferry::test::fork_child(
      [&] { exec_peer("[.exec_peer]", "FERRY_TEST_QUEUE_FDS", to_peer.fd(), from_peer.fd()); });
  auto shared = ferry::empty_shared({3}, at::kFloat);
  shared.fill_(1);
  to_peer.send({at::arange(5), shared}, 30s);
  Tensors back = from_peer.recv(30s);
  REQUIRE(ferry::test::wait_child(child) == 0);
  REQUIRE(back[0].equal(at::arange(5) + 1));
  REQUIRE(back[1].equal(shared));
  REQUIRE_THROWS_AS(TensorQueue::attach(-1), Error);
}
