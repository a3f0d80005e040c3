// A host serving its head while its own pool is still starting (a Python host learns its
// workers' setup only when it joins): tasks wait for the pool, heartbeats keep the head from
// dropping it, and a pool that cannot start ends the host with a goodbye and its reason. Real
// processes on the loopback: the head is this process's end of the link, the host a fork.
#include "hosts/host_serve.hpp"

#include <ATen/ATen.h>
#include "../catch.hpp"

#include <chrono>
#include <optional>
#include <thread>

#include "ipc/error.hpp"
#include "test/hosts/forked_host.hpp"

namespace ferry::hosts {
namespace {

using namespace std::chrono_literals;

LinkOptions loopback() {
  LinkOptions o;
  o.address = "127.0.0.1";
  o.timeout = 2s;
  o.join_timeout = 10s;
  return o;
}

// The head here is the test's bare end of the link, which sends no heartbeats of its own.
ServeOptions quick() {
  ServeOptions s;
  s.heartbeat = 100ms;
  s.lost_after = 10s;
  return s;
}

}  // namespace

TEST_CASE(
    "hosts: tasks that come while a host's pool starts wait for it, heartbeats go out, and "
    "a task's prelude reaches its workers",
    "[multihost]") {
  test::ForkedHost host([](const c10::intrusive_ptr<c10d::Store>& store) {
    HostLink link(store, "ferry/link/1", 1, loopback());
    std::optional<Pool> pool;
    const std::atomic<bool> stop{false};
    const ServeEnd end = serve_head(
        [&]() -> Pool& {
          std::this_thread::sleep_for(1500ms);  // longer than the head's wait for a frame
          PoolOptions o;
          o.devices = {"cpu"};
          o.start = Start::Spawn;
          o.worker_executable = FERRY_TEST_WORKER;
          pool.emplace(std::move(o));
          return *pool;
        },
        link, quick(), stop);
    return end == ServeEnd::head_left ? 0 : 1;
  });
  auto store = listen_store("127.0.0.1", 0, 10s);
  host.tell_port(store_port(store));
  HostLink link(store, "ferry/link/1", 0, loopback());
  link.send(FrameKind::task, 7, "sleep_echo",
            {at::scalar_tensor(1000, at::kLong), at::full({4}, 3.0, at::kDouble)});
  int starting = 0;  // heartbeats saying the pool is starting, then plain ones
  bool ready = false;
  Message m;
  for (;;) {
    m = link.recv(500ms);  // fails if the host goes quiet while its pool starts
    if (m.frame.kind != FrameKind::heartbeat) break;
    if (m.frame.body == kStarting) {
      CHECK_FALSE(ready);
      ++starting;
    } else {
      ready = true;
    }
  }
  CHECK(starting >= 5);
  REQUIRE(m.frame.kind == FrameKind::result);
  CHECK(m.frame.seq == 7);
  CHECK(parse_result_body(m.frame.body).ok);
  REQUIRE(m.tensors.size() == 1);
  CHECK(m.tensors[0].equal(at::full({4}, 3.0, at::kDouble)));
  // A task with a prelude: its tensors lead the frame's, and its task sees it (prelude_add
  // answers its sum with the input and the id the host's pool gave it, not the head's).
  for (std::uint64_t seq = 8; seq < 10; ++seq) {
    link.send(FrameKind::task, seq, task_body("prelude_add", 99, 1),
              {at::full({4}, 100, at::kLong), at::full({4}, 2, at::kLong)});
    do {
      m = link.recv(10s);
    } while (m.frame.kind == FrameKind::heartbeat);
    REQUIRE(m.frame.kind == FrameKind::result);
    CHECK(m.frame.seq == seq);
    REQUIRE(parse_result_body(m.frame.body).ok);
    REQUIRE(m.tensors.size() == 2);
    CHECK(m.tensors[0].equal(at::full({4}, 102, at::kLong)));
    CHECK(m.tensors[1].item<std::int64_t>() != 0);
  }
  link.send(FrameKind::bye, 0, "", {});
  CHECK(host.exit_code() == 0);
}

TEST_CASE("hosts: a host whose pool cannot start says goodbye and reports why", "[multihost]") {
  test::ForkedHost host([](const c10::intrusive_ptr<c10d::Store>& store) {
    HostLink link(store, "ferry/link/1", 1, loopback());
    const std::atomic<bool> stop{false};
    try {
      serve_head([]() -> Pool& { throw Error(Errc::worker_lost, "no worker could start"); }, link,
                 quick(), stop);
    } catch (const Error& e) {
      return e.code() == Errc::worker_lost ? 0 : 1;
    }
    return 4;
  });
  auto store = listen_store("127.0.0.1", 0, 10s);
  host.tell_port(store_port(store));
  HostLink link(store, "ferry/link/1", 0, loopback());
  link.send(FrameKind::task, 1, "sleep_echo",
            {at::scalar_tensor(1000, at::kLong), at::full({4}, 1.0, at::kDouble)});
  Message m;
  do {
    m = link.recv(2s);
  } while (m.frame.kind == FrameKind::heartbeat);
  CHECK(m.frame.kind == FrameKind::bye);  // no result: the head retries the task elsewhere
  link.send(FrameKind::bye, 0, "", {});   // the head answers, as HeadHub does
  CHECK(host.exit_code() == 0);
}

}  // namespace ferry::hosts
