// The link between two hosts over c10d's TCPStore and a Gloo pair, between real processes on the
// loopback: what crosses it, and how a killed, frozen or absent peer is reported.
#include "hosts/host_link.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>

#include <ATen/ATen.h>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include "../catch.hpp"

#include "ipc/error.hpp"
#include "ipc/stats.hpp"
#include "runtime/shared_tensor.hpp"
#include "test/gpu_check.hpp"
#include "test/hosts/forked_host.hpp"

namespace ferry::hosts {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

LinkOptions loopback(std::chrono::milliseconds timeout) {
  LinkOptions o;
  o.address = "127.0.0.1";
  o.timeout = timeout;
  o.join_timeout = timeout;
  return o;
}

// The host's side of a test: joins the link as the host and runs `body` on it.
template <class Body>
auto as_host(Body body) {
  return [body](const c10::intrusive_ptr<c10d::Store>& store) {
    HostLink link(store, "link/1", 1, loopback(10s));
    return body(link);
  };
}

// A host that says it is there, then idles until it is killed or stopped.
auto heartbeat_then_idle() {
  return as_host([](HostLink& link) {
    link.send(FrameKind::heartbeat, 0, "", {});
    ::pause();
    return 0;
  });
}

// The head's side of the link to `host`, once the host's first heartbeat has come.
std::unique_ptr<HostLink> heard_from(test::ForkedHost& host,
                                     const c10::intrusive_ptr<c10d::Store>& store) {
  host.tell_port(store_port(store));
  auto link = std::make_unique<HostLink>(store, "link/1", 0, loopback(10s));
  CHECK(link->recv(10s).frame.kind == FrameKind::heartbeat);
  return link;
}

Errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("no ferry::Error");
  return Errc::system;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

TEST_CASE("hosts: tensors cross a link intact and in order, both ways", "[multihost]") {
  // The host answers each task with its tensors doubled and its body reversed.
  test::ForkedHost peer(as_host([](HostLink& link) {
    for (;;) {
      Message m = link.recv(10s);
      if (m.frame.kind == FrameKind::bye) return 0;
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : m.tensors) out.push_back(t.dtype() == at::kBool ? t : t * 2);
      std::string body(m.frame.body.rbegin(), m.frame.body.rend());
      link.send(FrameKind::result, m.frame.seq, body, out);
    }
  }));
  auto store = listen_store("127.0.0.1", 0, 10s);
  peer.tell_port(store_port(store));
  HostLink link(store, "link/1", 0, loopback(10s));

  const at::Tensor matrix = at::arange(12, at::kFloat).reshape({3, 4});
  const std::vector<at::Tensor> inputs = {
      matrix,
      matrix.t(),  // not contiguous: sent as a contiguous copy
      at::scalar_tensor(7, at::kLong),
      at::empty({0, 5}, at::kDouble),
      at::arange(3) % 2 == 0,          // bool
      at::ones({1 << 20}, at::kHalf),  // 2 MiB
  };
  // A send completes once the peer has posted its receive, so results are taken on a thread of
  // their own while tasks go out, as the head does.
  std::vector<Message> results;
  std::string receive_error;
  std::thread receiver([&] {
    try {
      for (int i = 0; i < 3; ++i) results.push_back(link.recv(10s));
    } catch (const std::exception& e) {
      receive_error = e.what();
    }
  });
  // Task 2 is small enough to ride in its frame, tasks 1 and 3 are not (the 2 MiB tensor).
  const std::vector<at::Tensor> small(inputs.begin(), inputs.end() - 1);
  auto sent = [&](std::uint64_t seq) { return seq == 2 ? small : inputs; };
  for (std::uint64_t seq = 1; seq <= 3; ++seq) link.send(FrameKind::task, seq, "abc", sent(seq));
  receiver.join();
  REQUIRE(receive_error.empty());
  REQUIRE(results.size() == 3);
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {
    const Message& m = results[seq - 1];
    CHECK(m.frame.kind == FrameKind::result);
    CHECK(m.frame.seq == seq);
    CHECK(m.frame.body == "cba");
    const std::vector<at::Tensor> in = sent(seq);
    REQUIRE(m.tensors.size() == in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      INFO("task " << seq << ", tensor " << i);
      CHECK(m.tensors[i].dtype() == in[i].dtype());
      CHECK(m.tensors[i].sizes() == in[i].sizes());
      const at::Tensor want = in[i].dtype() == at::kBool ? in[i] : in[i] * 2;
      CHECK(at::equal(m.tensors[i], want));
      // Received into the shared-memory arena: recycled memory, and no copy to a local worker.
      if (m.tensors[i].nbytes() > 0) CHECK(is_shared(m.tensors[i]));
    }
  }
  link.send(FrameKind::bye, 0, "", {});
  CHECK(peer.exit_code() == 0);
  CHECK_FALSE(link.broken());
}

TEST_CASE("hosts: payloads up to a slab, and just over it, cross intact and in order",
          "[multihost]") {
  // The host echoes each task's tensors plus one; it is slow to take the first four, so the slabs
  // sent apart among them queue up behind the one receive it keeps posted.
  test::ForkedHost peer(as_host([](HostLink& link) {
    for (int n = 0;; ++n) {
      Message m = link.recv(10s);
      if (m.frame.kind == FrameKind::bye) return 0;
      if (n < 4) std::this_thread::sleep_for(50ms);
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : m.tensors) out.push_back(t + 1);
      link.send(FrameKind::result, m.frame.seq, "ok", out);
    }
  }));
  auto store = listen_store("127.0.0.1", 0, 10s);
  peer.tell_port(store_port(store));
  HostLink link(store, "link/1", 0, loopback(10s));

  const std::int64_t slab_floats = kSlabBytes / 4;
  auto floats = [](std::int64_t n, double from) {
    return at::arange(from, from + static_cast<double>(n), at::kFloat);
  };
  // Each message changes how the next frame goes (host_frame.hpp): a slab apart announces a wide
  // frame, a slab in a wide frame keeps the stream wide, anything else in a wide frame ends it.
  // The results go back the same way, so both directions run through every case.
  const std::vector<std::vector<at::Tensor>> tasks = {
      {floats(slab_floats, 0)},                      // exactly one slab, apart
      {floats(5000, 1)},                             // 20 KB, more than the frame holds: wide
      {},                                            // nothing: a wide frame's padding
      {floats(slab_floats - 8, 2), floats(8, 3)},    // two tensors filling one slab, apart
      {floats(slab_floats + 1, 4)},                  // one float over: a wide frame, then apart
      {floats(100, 5)},                              // in the frame
      {floats(9000, 6), at::empty({0}, at::kFloat),  // a slab with an empty tensor in it, apart
       at::arange(7, at::kLong)},
      {floats(slab_floats, 7)},  // wide
      {floats(10, 8)},           // in a wide frame's frame
      {floats(slab_floats, 9)},  // apart again
  };
  std::vector<Message> results;
  std::string receive_error;
  std::thread receiver([&] {
    try {
      for (std::size_t i = 0; i < tasks.size(); ++i) results.push_back(link.recv(10s));
    } catch (const std::exception& e) {
      receive_error = e.what();
    }
  });
  for (std::size_t i = 0; i < tasks.size(); ++i) link.send(FrameKind::task, i, "", tasks[i]);
  receiver.join();
  REQUIRE(receive_error.empty());
  REQUIRE(results.size() == tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    REQUIRE(results[i].frame.seq == i);
    REQUIRE(results[i].tensors.size() == tasks[i].size());
    for (std::size_t k = 0; k < tasks[i].size(); ++k) {
      INFO("task " << i << ", tensor " << k);
      CHECK(results[i].tensors[k].sizes() == tasks[i][k].sizes());
      CHECK(at::equal(results[i].tensors[k], tasks[i][k] + 1));
    }
  }
  link.send(FrameKind::bye, 0, "", {});
  CHECK(peer.exit_code() == 0);
  CHECK_FALSE(link.broken());
}

TEST_CASE("hosts: where shared memory has no room, a payload is received into ordinary memory",
          "[multihost]") {
  // The receiving host gets a 1 MiB /dev/shm of its own (a mount namespace: root only).
  test::ForkedHost peer([](const c10::intrusive_ptr<c10d::Store>& store) {
    char dir[] = "/tmp/ferry-small-shm-XXXXXX";
    if (::mkdtemp(dir) == nullptr || ::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir, "tmpfs", 0, "size=1m") != 0) {
      return 77;
    }
    ::setenv("FERRY_SHM_DIR", dir, 1);
    HostLink link(store, "link/1", 1, loopback(10s));
    const Message m = link.recv(10s);
    const bool right = m.tensors.size() == 1 && !is_shared(m.tensors[0]) &&
                       at::equal(m.tensors[0], at::arange(1 << 20, at::kFloat));
    link.send(FrameKind::result, m.frame.seq, right ? "ok" : "wrong", {});
    return right ? 0 : 1;
  });
  auto store = listen_store("127.0.0.1", 0, 10s);
  peer.tell_port(store_port(store));
  std::unique_ptr<HostLink> link;
  try {
    link = std::make_unique<HostLink>(store, "link/1", 0, loopback(3s));
  } catch (const Error&) {
    // The peer could not make its small /dev/shm and never joined.
  }
  if (!link) {
    REQUIRE(peer.exit_code() == 77);
    WARN("SKIP: a private small /dev/shm needs root (a mount namespace)");
    return;
  }
  link->send(FrameKind::task, 1, "", {at::arange(1 << 20, at::kFloat)});  // 4 MiB
  CHECK(link->recv(10s).frame.body == "ok");
  CHECK(peer.exit_code() == 0);
}

TEST_CASE("hosts: a CUDA tensor crosses a link as a CPU copy, counted as other_host", "[gpu]") {
  REQUIRE_GPU();  // asked in a child: this process must not touch CUDA before the host forks
  // The host says on which device each tensor came ('c' CPU, 'g' GPU), and sends them back.
  test::ForkedHost peer(as_host([](HostLink& link) {
    Message m = link.recv(10s);
    std::string devices;
    for (const at::Tensor& t : m.tensors) devices += t.device().is_cpu() ? 'c' : 'g';
    link.send(FrameKind::result, m.frame.seq, devices, m.tensors);
    return link.recv(10s).frame.kind == FrameKind::bye ? 0 : 1;
  }));
  auto store = listen_store("127.0.0.1", 0, 10s);
  peer.tell_port(store_port(store));
  HostLink link(store, "link/1", 0, loopback(10s));

  auto copies = [] {
    return transport_stats().copies_by_reason[static_cast<int>(CopyReason::other_host)];
  };
  const auto before = copies();
  const at::Tensor big = at::arange(1 << 20, at::kFloat).to(at::kCUDA).reshape({1024, 1024}).t();
  const at::Tensor small = at::arange(16, at::kLong).to(at::kCUDA);
  // 4 MiB, not contiguous, goes apart; 128 bytes ride in the frame; and a CPU tensor beside them.
  link.send(FrameKind::task, 5, "", {big, small, at::ones({3})});
  CHECK(copies() == before + 2);
  const Message back = link.recv(10s);
  CHECK(back.frame.body == "ccc");
  REQUIRE(back.tensors.size() == 3);
  CHECK(back.tensors[0].device().is_cpu());
  CHECK(at::equal(back.tensors[0], big.cpu()));
  CHECK(at::equal(back.tensors[1], small.cpu()));
  CHECK(at::equal(back.tensors[2], at::ones({3})));
  CHECK(big.is_cuda());  // the sender's own tensor stays where it was
  link.send(FrameKind::bye, 0, "", {});
  CHECK(peer.exit_code() == 0);
}

TEST_CASE("hosts: what a link cannot carry is refused before it is sent, and breaks nothing",
          "[multihost]") {
  test::ForkedHost peer(as_host([](HostLink& link) {
    Message m = link.recv(10s);
    return m.frame.kind == FrameKind::bye ? 0 : 1;
  }));
  auto store = listen_store("127.0.0.1", 0, 10s);
  peer.tell_port(store_port(store));
  HostLink link(store, "link/1", 0, loopback(10s));
  using Catch::Contains;
  CHECK_THROWS_WITH(link.send(FrameKind::task, 1, "", {at::ones({2}).to_sparse()}),
                    Contains("tensor 0 is not a dense CPU or CUDA tensor"));
  CHECK_THROWS_WITH(link.send(FrameKind::task, 1, "", {at::Tensor()}),
                    Contains("not a dense CPU or CUDA tensor"));
  CHECK_THROWS_WITH(link.send(FrameKind::task, 1, std::string(kMaxFrameBody + 1, 'x'), {}),
                    Contains("pass large arguments as tensors"));
  CHECK_FALSE(link.broken());
  link.send(FrameKind::bye, 0, "", {});
  CHECK(peer.exit_code() == 0);
}

TEST_CASE("hosts: a killed peer breaks the link at once, with peer_dead, for good", "[multihost]") {
  test::ForkedHost peer(heartbeat_then_idle());
  auto store = listen_store("127.0.0.1", 0, 10s);
  {
    const auto owner = heard_from(peer, store);
    HostLink& link = *owner;
    REQUIRE(::kill(peer.pid(), SIGKILL) == 0);
    const auto t0 = Clock::now();
    CHECK(code_of([&] { link.recv(30s); }) == Errc::peer_dead);
    // Noticed from the closed connection, not at the 30 s timeout.
    CHECK(seconds_since(t0) < 10);
    CHECK(link.broken());
    // Every later call fails at once, naming the first failure.
    using Catch::Contains;
    CHECK_THROWS_WITH(link.send(FrameKind::heartbeat, 0, "", {}),
                      Contains("link/1 is broken") && Contains("joins again"));
  }  // the broken link's teardown returns
}

TEST_CASE("hosts: a peer's last message, sent just before it exits, is delivered, then peer_dead",
          "[multihost]") {
  test::ForkedHost peer(as_host([](HostLink& link) {
    link.send(FrameKind::heartbeat, 0, "", {});
    link.send(FrameKind::result, 7, "last words", {at::arange(6, at::kFloat)});
    return 0;  // and exits: its connection closes behind the message
  }));
  auto store = listen_store("127.0.0.1", 0, 10s);
  const auto owner = heard_from(peer, store);  // the head then waits for the next frame
  HostLink& link = *owner;
  REQUIRE(peer.exit_code() == 0);
  // The message had arrived; the receive the head posts after it is what finds the link closed.
  const Message m = link.recv(10s);
  CHECK(m.frame.seq == 7);
  CHECK(m.frame.body == "last words");
  REQUIRE(m.tensors.size() == 1);
  CHECK(at::equal(m.tensors[0], at::arange(6, at::kFloat)));
  CHECK(code_of([&] { link.recv(10s); }) == Errc::peer_dead);
  CHECK(link.broken());
}

TEST_CASE("hosts: a frozen peer is noticed at the receive's timeout", "[multihost]") {
  test::ForkedHost peer(heartbeat_then_idle());
  auto store = listen_store("127.0.0.1", 0, 10s);
  const auto owner = heard_from(peer, store);
  HostLink& link = *owner;
  REQUIRE(::kill(peer.pid(), SIGSTOP) == 0);
  const auto t0 = Clock::now();
  CHECK(code_of([&] { link.recv(500ms); }) == Errc::timeout);
  const double waited = seconds_since(t0);
  CHECK(waited >= 0.45);
  CHECK(waited < 10);
  CHECK(link.broken());
  ::kill(peer.pid(), SIGKILL);
}

TEST_CASE("hosts: a peer that never joins fails the join at its timeout, naming the address",
          "[multihost]") {
  auto store = listen_store("127.0.0.1", 0, 10s);
  const auto t0 = Clock::now();
  try {
    HostLink link(store, "link/alone", 0, loopback(1s));
    FAIL("joined with nobody");
  } catch (const Error& e) {
    using Catch::Contains;
    CHECK(e.code() == Errc::timeout);
    CHECK_THAT(e.what(),
               Contains("link/alone") && Contains("joining as head") && Contains("127.0.0.1"));
  }
  CHECK(seconds_since(t0) < 10);
}

TEST_CASE("hosts: a store that is not there is reported with its address", "[multihost]") {
  // A port nobody listens on: the store this test made and closed.
  std::uint16_t port = 0;
  {
    auto store = listen_store("127.0.0.1", 0, 10s);
    port = store_port(store);
  }
  using Catch::Contains;
  CHECK_THROWS_WITH(
      connect_store("127.0.0.1", port, 1s),
      Contains("127.0.0.1:" + std::to_string(port)) && Contains("the head is running"));
}

TEST_CASE("hosts: the store listens on the address given, where c10d lets it", "[multihost]") {
  // 127.0.0.1 and 127.0.0.2 are both this machine's (the loopback is 127.0.0.0/8): a store asked
  // to listen on one is reached there, and through the other only where it listens everywhere.
  auto store = listen_store("127.0.0.2", 0, 10s);
  const std::uint16_t port = store_port(store);
  auto there = connect_store("127.0.0.2", port, 5s);
  there->set("k", std::vector<std::uint8_t>{1});
  CHECK(store->get("k") == std::vector<std::uint8_t>{1});
  if (store_listens_only_where_asked()) {
    CHECK_THROWS_AS(connect_store("127.0.0.1", port, 1s), Error);
  } else {
    // LibTorch 1.13's server binds every address (docs/multi-host.md, "The secret").
    WARN("this LibTorch's store listens on every address; the test checks that it still works");
    CHECK_NOTHROW(connect_store("127.0.0.1", port, 5s));
  }
  // A port taken by another socket is refused with the address and the remedy.
  using Catch::Contains;
  CHECK_THROWS_WITH(listen_store("127.0.0.2", port, 2s),
                    Contains("127.0.0.2:" + std::to_string(port)) && Contains("another port"));
}

TEST_CASE("hosts: how a link failure reads, by what Gloo and c10d say", "[multihost]") {
  CHECK(link_failure_code("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                          "2000ms for recv operation to complete") == Errc::timeout);
  CHECK(link_failure_code("Application timeout caused pair closure") == Errc::timeout);
  CHECK(link_failure_code("Socket Timeout") == Errc::timeout);
  CHECK(link_failure_code("[../gloo/transport/tcp/pair.cc:598] Connection closed by peer "
                          "[127.0.0.1]:14260") == Errc::peer_dead);
  CHECK(link_failure_code("Connection reset by peer") == Errc::peer_dead);
}

TEST_CASE("hosts: ADDRESS:PORT is read strictly, and a bad one names the form expected",
          "[multihost]") {
  using Catch::Contains;
  const Endpoint e = parse_endpoint("10.0.0.1:29400", false);
  CHECK(e.address == "10.0.0.1");
  CHECK(e.port == 29400);
  CHECK(parse_endpoint("head.example:1", false).address == "head.example");
  CHECK(parse_endpoint("127.0.0.1:0", true).port == 0);  // --listen: any free port
  for (const char* bad : {"10.0.0.1", ":29400", "10.0.0.1:", "10.0.0.1:http", "10.0.0.1:65536",
                          "10.0.0.1:123456", "10.0.0.1:-1"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_endpoint(bad, true), Contains("is not ADDRESS:PORT"));
  }
  CHECK_THROWS_WITH(parse_endpoint("10.0.0.1:0", false), Contains("outside 1..65535"));
}

TEST_CASE("hosts: a host's own address is the one on its route to the head", "[multihost]") {
  CHECK(address_towards("127.0.0.1") == "127.0.0.1");
  CHECK_THROWS_AS(address_towards("no-such-host.invalid"), Error);
}

}  // namespace ferry::hosts
