// A host joining the head through the store, between real processes on the loopback: who is
// admitted, who gets nothing, and that one host stopping half way keeps no other out.
#include "hosts/host_join.hpp"

#include <ATen/ATen.h>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include "../catch.hpp"

#include "ipc/error.hpp"
#include "test/hosts/forked_host.hpp"

namespace ferry::hosts {
namespace {

using namespace std::chrono_literals;
using Catch::Contains;

const Secret kSecret = Secret::from_bytes("the-job-secret-0123456789", "a test");
const Secret kOther = Secret::from_bytes("not-the-job-secret-012345", "a test");

LinkOptions loopback(std::chrono::milliseconds timeout) {
  LinkOptions o;
  o.address = "127.0.0.1";
  o.timeout = timeout;
  o.join_timeout = timeout;
  return o;
}

HostInfo host_info(const std::string& name) {
  return {name, "127.0.0.1", {"cpu", "cpu"}};
}

// Joins with `secret`; exits 10 on a handshake refusal whose message contains `expect`.
auto join_expecting_refusal(const Secret& secret, std::string expect) {
  return [&secret, expect](const c10::intrusive_ptr<c10d::Store>& store) {
    try {
      join_head(store, secret, host_info("intruder"), loopback(5s), 5s);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (e.code() == Errc::handshake && what.find(expect) != std::string::npos) return 10;
      std::fprintf(stderr, "unexpected: %s\n", e.what());
      return 11;
    }
    return 12;  // admitted
  };
}

}  // namespace

TEST_CASE("hosts: a host with the secret is admitted and its link carries tensors", "[multihost]") {
  test::ForkedHost host([](const c10::intrusive_ptr<c10d::Store>& store) {
    Joined j = join_head(store, kSecret, host_info("worker-a"), loopback(10s), 10s);
    Message m = j.link->recv(10s);
    j.link->send(FrameKind::result, m.frame.seq, std::to_string(j.number), {m.tensors.at(0) + 1});
    return 0;
  });
  auto store = listen_store("127.0.0.1", 0, 10s);
  HeadDoor door(store, kSecret, loopback(10s));
  host.tell_port(store_port(store));
  std::optional<Joined> j = door.admit(10s);
  REQUIRE(j);
  CHECK(j->number == 1);
  CHECK(j->host.name == "worker-a");
  CHECK(j->host.address == "127.0.0.1");
  CHECK(j->host.devices == std::vector<std::string>{"cpu", "cpu"});
  j->link->send(FrameKind::task, 7, "", {at::arange(4, at::kFloat)});
  Message m = j->link->recv(10s);
  CHECK(m.frame.seq == 7);
  CHECK(m.frame.body == "1");  // the host knows its number too
  CHECK(at::equal(m.tensors.at(0), at::arange(4, at::kFloat) + 1));
  CHECK(host.exit_code() == 0);
  CHECK(door.refused() == 0);
}

TEST_CASE("hosts: a host with a wrong secret gets nothing, and gives the head nothing",
          "[multihost]") {
  // The host checks the head's answer first: with another secret it is wrong, so the host stops
  // before sending a proof of its own, and the head, told so, refuses it.
  test::ForkedHost host(join_expecting_refusal(kOther, "does not hold this job's secret"));
  auto store = listen_store("127.0.0.1", 0, 10s);
  HeadDoor door(store, kSecret, loopback(5s));
  host.tell_port(store_port(store));
  CHECK_FALSE(door.admit(2s));
  CHECK(door.refused() == 1);
  CHECK(host.exit_code() == 10);
}

TEST_CASE("hosts: a proof recorded from another join is refused", "[multihost]") {
  // An intruder that saw host 1 join replays its proof as host 2: the head's challenge and the
  // host's number differ, so the answer does not fit.
  test::ForkedHost honest([](const c10::intrusive_ptr<c10d::Store>& store) {
    Joined j = join_head(store, kSecret, host_info("honest"), loopback(10s), 10s);
    return j.number == 1 ? 0 : 1;
  });
  test::ForkedHost replayer([](const c10::intrusive_ptr<c10d::Store>& store) {
    // Wait for host 1's proof, then join as host 2 by hand, answering with it.
    store->wait({"ferry/join/1/proof", "ferry/join/1/hello"}, 10s);
    const auto hello = store->get("ferry/join/1/hello");
    const auto proof = store->get("ferry/join/1/proof");
    const auto n = store->add("ferry/hosts", 1);
    const std::string k = "ferry/join/" + std::to_string(n) + "/";
    store->set(k + "hello", hello);
    store->wait({k + "head"}, 10s);
    store->set(k + "proof", proof);
    store->wait({k + "verdict"}, 10s);
    const auto verdict = store->get(k + "verdict");
    return std::string(verdict.begin(), verdict.end()) == "refused" ? 0 : 1;
  });
  auto store = listen_store("127.0.0.1", 0, 10s);
  HeadDoor door(store, kSecret, loopback(5s));
  honest.tell_port(store_port(store));
  replayer.tell_port(store_port(store));
  std::optional<Joined> first = door.admit(10s);
  REQUIRE(first);
  CHECK(first->number == 1);
  CHECK_FALSE(door.admit(3s));
  CHECK(door.refused() == 1);
  CHECK(honest.exit_code() == 0);
  CHECK(replayer.exit_code() == 0);
}

TEST_CASE("hosts: a host gets the head's setup, and may decline it with its reason",
          "[multihost]") {
  test::ForkedHost taker([](const c10::intrusive_ptr<c10d::Store>& store) {
    std::string seen;
    Joined j = join_head(store, kSecret, host_info("taker"), loopback(10s), 10s,
                         [&](const std::string& setup) { seen = setup; });
    return j.setup == R"({"workers":"python"})" && seen == j.setup ? 0 : 1;
  });
  test::ForkedHost decliner([](const c10::intrusive_ptr<c10d::Store>& store) {
    try {
      join_head(store, kSecret, host_info("decliner"), loopback(10s), 10s,
                [](const std::string& setup) { require_workers(setup, "ferry"); });
    } catch (const Error& e) {
      return e.code() == Errc::handshake ? 0 : 1;
    }
    return 4;
  });
  auto store = listen_store("127.0.0.1", 0, 10s);
  HeadDoor door(store, kSecret, loopback(10s), workers_setup("python"));
  taker.tell_port(store_port(store));
  std::optional<Joined> j = door.admit(10s);
  REQUIRE(j);
  CHECK(j->host.name == "taker");
  CHECK(taker.exit_code() == 0);
  decliner.tell_port(store_port(store));
  CHECK_FALSE(door.admit(3s));
  CHECK(door.refused() == 1);
  CHECK(decliner.exit_code() == 0);
}

TEST_CASE("hosts: a setup altered in the store fails the head's answer, the host sends nothing",
          "[multihost]") {
  // Someone who can write to the store (it has no authentication) swaps the setup in the head's
  // answer: the answer covers it, so the host takes the head for one without the secret.
  test::ForkedHost host(join_expecting_refusal(kSecret, "setup was altered"));
  auto store = listen_store("127.0.0.1", 0, 10s);
  store->set("ferry/job", std::vector<std::uint8_t>{'j', 'o', 'b'});
  store->add("ferry/hosts", 0);
  host.tell_port(store_port(store));
  store->wait({"ferry/join/1/hello"}, 10s);
  const auto raw = store->get("ferry/join/1/hello");
  const auto hello = nlohmann::json::parse(std::string(raw.begin(), raw.end()));
  Challenge theirs{};
  const std::string hex = hello.at("challenge").get<std::string>();
  for (std::size_t i = 0; i < theirs.size(); ++i) {
    theirs[i] = static_cast<std::uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  const Challenge mine = make_challenge();
  // The head's true answer for setup A (the context format of host_join.cpp), sent with B.
  const Proof answer = prove(kSecret, Role::head, "job/1\n{\"workers\":\"ferry\"}", theirs, mine);
  auto to_hex = [](const auto& bytes) {
    std::string s;
    char buf[3];
    for (std::uint8_t b : bytes) {
      std::snprintf(buf, sizeof buf, "%02x", b);
      s += buf;
    }
    return s;
  };
  const std::string altered = nlohmann::json{
      {"challenge", to_hex(mine)},
      {"proof", to_hex(answer)},
      {"setup",
       R"({"workers":"python"})"}}.dump();
  store->set("ferry/join/1/head", std::vector<std::uint8_t>(altered.begin(), altered.end()));
  store->wait({"ferry/join/1/proof"}, 10s);
  const auto proof = store->get("ferry/join/1/proof");
  CHECK(std::string(proof.begin(), proof.end()) == "head-refused");
  CHECK(host.exit_code() == 10);
}

TEST_CASE("hosts: a host is told which command joins a job whose workers it lacks") {
  CHECK_NOTHROW(require_workers(workers_setup("ferry"), "ferry"));
  CHECK_NOTHROW(
      require_workers(workers_setup("python", R"({"python.initializer":"x"})"), "python"));
  CHECK_THROWS_WITH(require_workers(workers_setup("python"), "ferry"),
                    Contains("needs python workers") && Contains("python3 -m ferry host"));
  CHECK_THROWS_WITH(require_workers(workers_setup("ferry"), "python"), Contains("`ferry host`"));
  CHECK_THROWS_WITH(require_workers("not json", "ferry"), Contains("not one of ferry's"));
  CHECK_THROWS_WITH(require_workers("{}", "ferry"), Contains("not one of ferry's"));
}

TEST_CASE("hosts: a host that stops half way costs one timeout, and the next is admitted",
          "[multihost]") {
  test::ForkedHost quitter([](const c10::intrusive_ptr<c10d::Store>& store) {
    store->add("ferry/hosts", 1);  // takes number 1, then says nothing more
    return 0;
  });
  test::ForkedHost late([](const c10::intrusive_ptr<c10d::Store>& store) {
    Joined j = join_head(store, kSecret, host_info("late"), loopback(10s), 10s);
    return j.number == 2 ? 0 : 1;
  });
  auto store = listen_store("127.0.0.1", 0, 10s);
  HeadDoor door(store, kSecret, loopback(1s));
  quitter.tell_port(store_port(store));
  REQUIRE(quitter.exit_code() == 0);
  late.tell_port(store_port(store));  // only once the quitter has taken number 1
  std::optional<Joined> j = door.admit(10s);
  REQUIRE(j);
  CHECK(j->number == 2);
  CHECK(j->host.name == "late");
  CHECK(door.refused() == 1);
  CHECK(late.exit_code() == 0);
}

TEST_CASE("hosts: with no host joining, admit returns empty at its timeout", "[multihost]") {
  auto store = listen_store("127.0.0.1", 0, 10s);
  HeadDoor door(store, kSecret, loopback(1s));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(door.admit(300ms));
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
  CHECK(door.refused() == 0);
}

}  // namespace ferry::hosts
