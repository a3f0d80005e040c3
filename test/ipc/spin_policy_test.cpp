// How long a waiter polls before it sleeps: one case per rule of SpinPolicy, the poll itself, and
// what a user relies on in a channel: an idle waiter costs no CPU once its spin is spent.
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../catch.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ipc/channel.hpp"
#include "ipc/error.hpp"
#include "ipc/spin_policy.hpp"

using ferry::SpinPolicy;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

constexpr nanoseconds kCeiling = microseconds(50);

void record_all(SpinPolicy& p, const std::vector<nanoseconds>& waits) {
  for (nanoseconds w : waits) p.record(w);
}

nanoseconds budget_after(const std::vector<nanoseconds>& waits, nanoseconds ceiling = kCeiling) {
  SpinPolicy p(ceiling);
  record_all(p, waits);
  return p.budget();
}

std::vector<nanoseconds> times(int n, nanoseconds w) {
  return std::vector<nanoseconds>(n, w);
}

double cpu_seconds(const rusage& r) {
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

}  // namespace

TEST_CASE("a fresh waiter spins up to the ceiling", "[spin]") {
  CHECK(SpinPolicy(kCeiling).budget() == kCeiling);
}

TEST_CASE("answers that come quickly give a budget of twice their time", "[spin]") {
  CHECK(budget_after(times(20, microseconds(5))).count() ==
        Approx(static_cast<double>(nanoseconds(microseconds(10)).count())).epsilon(0.05));
}

TEST_CASE("the budget is never under the floor nor over the ceiling", "[spin]") {
  CHECK(budget_after(times(20, nanoseconds(100))) == SpinPolicy::kMinSpin);
  CHECK(budget_after(times(20, microseconds(40))) == kCeiling);
}

TEST_CASE("one long idle wait stops the spinning at once", "[spin]") {
  CHECK(budget_after({milliseconds(100)}) == nanoseconds(0));
  CHECK(budget_after({microseconds(5), microseconds(5), milliseconds(100)}) == nanoseconds(0));
}

TEST_CASE("a few quick answers after an idle spell start it again", "[spin]") {
  const std::vector<nanoseconds> idle = times(10, milliseconds(100));  // many wait slices
  SpinPolicy p(kCeiling);
  record_all(p, idle);
  REQUIRE(p.budget() == nanoseconds(0));
  int quick = 0;
  while (p.budget() == nanoseconds(0) && quick < 100) {
    p.record(microseconds(3));
    ++quick;
  }
  CHECK(quick <= 10);
  CHECK(p.budget() > nanoseconds(0));
}

TEST_CASE("waits as long as the ceiling, spun or slept, keep the budget at the ceiling", "[spin]") {
  // A spin that ends just short is followed by a sleep; the longer wait it records widens the
  // next budget instead of narrowing it.
  SpinPolicy p(kCeiling);
  record_all(p, times(20, microseconds(20)));
  CHECK(p.budget() >= microseconds(40));
  CHECK(p.budget() < kCeiling);
  for (int i = 0; i < 20; ++i) p.record(microseconds(45));
  CHECK(p.budget() == kCeiling);
}

TEST_CASE("a ceiling of 0 never spins, whatever the history", "[spin]") {
  CHECK(SpinPolicy(nanoseconds(0)).budget() == nanoseconds(0));
  CHECK(budget_after(times(50, microseconds(1)), nanoseconds(0)) == nanoseconds(0));
  CHECK(SpinPolicy(nanoseconds(-5)).budget() == nanoseconds(0));
}

TEST_CASE("a wait that slept counts until its waker's stamp, not until the sleeper ran again",
          "[spin]") {
  using std::chrono::steady_clock;
  const steady_clock::time_point start = steady_clock::now();
  const steady_clock::time_point end = start + milliseconds(300);
  // The waker stamped 30 ms in; the sleeper ran again 270 ms later.
  CHECK(ferry::answered_after(start, start + milliseconds(30), end) == milliseconds(30));
  CHECK(ferry::answered_after(start, start, end) == nanoseconds(0));
  CHECK(ferry::answered_after(start, end, end) == milliseconds(300));
  // A stamp from before the wait is an earlier wake-up's; one after it is not this wait's
  // (another clock, or a later waker): the whole wait counts.
  CHECK(ferry::answered_after(start, start - milliseconds(1), end) == milliseconds(300));
  CHECK(ferry::answered_after(start, steady_clock::time_point{}, end) == milliseconds(300));
  CHECK(ferry::answered_after(start, end + nanoseconds(1), end) == milliseconds(300));
}

TEST_CASE("FERRY_SPIN_US sets the ceiling, a bad value is refused by name", "[spin]") {
  struct Restore {
    ~Restore() { ::unsetenv("FERRY_SPIN_US"); }
  } restore;
  ::setenv("FERRY_SPIN_US", "0", 1);
  CHECK(SpinPolicy::ceiling_from_env() == nanoseconds(0));
  ::setenv("FERRY_SPIN_US", "20", 1);
  if (std::thread::hardware_concurrency() > 1) {
    CHECK(SpinPolicy::ceiling_from_env() == microseconds(20));
  }
  for (const char* bad : {"lots", "-1", "20000"}) {
    ::setenv("FERRY_SPIN_US", bad, 1);
    try {
      SpinPolicy::ceiling_from_env();
      FAIL("accepted FERRY_SPIN_US=" << bad);
    } catch (const ferry::Error& e) {
      CHECK(e.code() == ferry::Errc::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("FERRY_SPIN_US"));
      CHECK_THAT(e.what(), Catch::Contains(bad));
    }
  }
}

TEST_CASE("the poll sees a change made by another thread and gives up after its budget", "[spin]") {
  std::atomic<std::uint32_t> word{7};
  CHECK_FALSE(ferry::spin_until_changed(word, 7, nanoseconds(0)));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(ferry::spin_until_changed(word, 7, microseconds(200)));
  CHECK(std::chrono::steady_clock::now() - t0 >= microseconds(200));
  CHECK(ferry::spin_until_changed(word, 6, microseconds(200)));  // already different

  std::thread other([&] {
    std::this_thread::sleep_for(milliseconds(5));
    word.store(8, std::memory_order_release);
  });
  // A budget long enough to outlast the other thread's nap: the change is what ends it.
  const bool changed = ferry::spin_until_changed(word, 7, std::chrono::seconds(5));
  other.join();
  CHECK(changed);
}

TEST_CASE("a yielding poll on a core it shares sees the change and gives up after its budget",
          "[spin]") {
  // Both threads on one CPU: the poller gives that core away between its polls, so the other
  // thread's store lands while the poll is still within its budget.
  cpu_set_t one;
  CPU_ZERO(&one);
  cpu_set_t all;
  REQUIRE(::sched_getaffinity(0, sizeof all, &all) == 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &all)) ++cpu;
  CPU_SET(cpu, &one);
  std::atomic<std::uint32_t> word{7};
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(ferry::spin_until_changed(word, 7, microseconds(200), true));
  CHECK(std::chrono::steady_clock::now() - t0 >= microseconds(200));

  std::atomic<bool> pinned{false};
  std::thread other([&] {
    ::sched_setaffinity(0, sizeof one, &one);
    pinned = true;
    std::this_thread::sleep_for(milliseconds(5));
    word.store(8, std::memory_order_release);
  });
  REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);
  while (!pinned) std::this_thread::yield();
  const bool changed = ferry::spin_until_changed(word, 7, std::chrono::seconds(5), true);
  ::sched_setaffinity(0, sizeof all, &all);
  other.join();
  CHECK(changed);
  ferry::SpinPolicy policy(microseconds(100));
  CHECK_FALSE(policy.yielding());  // off unless a queue asks for it
  policy.set_yielding(true);
  CHECK(policy.yielding());
}

TEST_CASE("a process waiting on an empty channel costs no CPU once its spin is spent",
          "[spin][channel]") {
  auto ch = ferry::Channel::create({8, 64, 0});
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::vector<std::byte> out;
    rusage before{}, after_wait{};
    ::getrusage(RUSAGE_SELF, &before);
    int code = 0;
    try {
      ch->pop(out, milliseconds(400));  // nobody pushes: it times out
      code = 2;
    } catch (const ferry::Error& e) {
      code = e.code() == ferry::Errc::timeout ? 0 : 3;
    }
    ::getrusage(RUSAGE_SELF, &after_wait);
    const double cpu = cpu_seconds(after_wait) - cpu_seconds(before);
    (void)!::write(fds[1], &cpu, sizeof cpu);
    ::_exit(code);
  }
  ::close(fds[1]);
  double cpu = -1;
  REQUIRE(::read(fds[0], &cpu, sizeof cpu) == static_cast<ssize_t>(sizeof cpu));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // 400 ms of waiting: a waiter that kept polling would have used most of it. The spin and the
  // four wake-ups of the wait slices take well under a millisecond; 40 ms leaves room for a
  // loaded machine's accounting.
  CHECK(cpu < 0.040);
}

TEST_CASE("messages between two processes arrive intact and in order with spinning on and off",
          "[spin][channel]") {
  for (const char* setting : {"0", "50", "10000"}) {
    ::setenv("FERRY_SPIN_US", setting, 1);
    auto ping = ferry::Channel::create({4, 64, 0});
    auto pong = ferry::Channel::create({4, 64, 0});
    ::unsetenv("FERRY_SPIN_US");
    constexpr std::uint32_t kMessages = 2000;
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::vector<std::byte> in(64);
      int code = 0;
      try {
        for (std::uint32_t i = 0; i < kMessages; ++i) {
          ping->pop(in, std::chrono::seconds(20));
          std::uint32_t v = 0;
          std::memcpy(&v, in.data(), sizeof v);
          if (v != i) code = 1;
          pong->push(in.data(), 1, std::chrono::seconds(20));
        }
      } catch (...) {
        code = 2;
      }
      ::_exit(code);
    }
    std::vector<std::byte> msg(64), back;
    for (std::uint32_t i = 0; i < kMessages; ++i) {
      std::memcpy(msg.data(), &i, sizeof i);
      ping->push(msg.data(), 1, std::chrono::seconds(20));
      pong->pop(back, std::chrono::seconds(20));
      std::uint32_t v = 0;
      std::memcpy(&v, back.data(), sizeof v);
      REQUIRE(v == i);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("FERRY_SPIN_US=" << setting);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
}

TEST_CASE("a consumer woken late learns when its message came, not when it ran again",
          "[spin][channel]") {
  if (std::thread::hardware_concurrency() < 2) {
    WARN("skipped: one CPU, where a waiter never spins and learns nothing");
    return;
  }
  // A 10 ms ceiling counts a wait as at most 80 ms; the consumer is kept from running for 300 ms
  // after the message comes, so a wait counted to when it ran again would be 80 ms.
  ::setenv("FERRY_SPIN_US", "10000", 1);
  auto ch = ferry::Channel::create({4, 64, 0});
  ::unsetenv("FERRY_SPIN_US");
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    const std::int64_t before = ch->pop_spin().typical().count();
    (void)!::write(fds[1], "w", 1);
    std::vector<std::byte> out;
    int code = 0;
    try {
      ch->pop(out, std::chrono::seconds(20));
    } catch (...) {
      code = 2;
    }
    // record() moved typical a quarter of the way from `before` to the wait it counted.
    const std::int64_t counted = 4 * ch->pop_spin().typical().count() - 3 * before;
    (void)!::write(fds[1], &counted, sizeof counted);
    ::_exit(code);
  }
  ::close(fds[1]);
  char ready = 0;
  REQUIRE(::read(fds[0], &ready, 1) == 1);
  // Past the consumer's 10 ms spin: it sleeps in the kernel when it is stopped.
  std::this_thread::sleep_for(milliseconds(30));
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, WUNTRACED) == pid);
  REQUIRE(WIFSTOPPED(status));
  std::vector<std::byte> msg(64, std::byte{1});
  ch->push(msg.data(), 1, std::chrono::seconds(5));
  std::this_thread::sleep_for(milliseconds(300));
  REQUIRE(::kill(pid, SIGCONT) == 0);
  std::int64_t counted = -1;
  REQUIRE(::read(fds[0], &counted, sizeof counted) == static_cast<ssize_t>(sizeof counted));
  ::close(fds[0]);
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // About 30 ms: from the start of its wait to the push that woke it. 80 ms would mean it counted
  // its own 300 ms stop; 10 ms (what it knew before) that it never waited. The margins are for a
  // loaded machine.
  INFO("counted wait: " << counted / 1000 << " us");
  CHECK(counted > 12'000'000);
  CHECK(counted < 79'000'000);
}
