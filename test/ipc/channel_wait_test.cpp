// Who counts a channel's sleepers: a waker takes out those the kernel says it woke, a sleeper whose
// sleep ended otherwise takes itself out. So a sleeper woken but not yet run draws no second
// futex_wake, and a count never stays short of the sleepers (which would lose a wake-up).
#include "ipc/channel_wait.hpp"

#include "../catch.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

using namespace std::chrono_literals;

namespace ferry::ring {
namespace {

struct Word {
  std::atomic<std::uint32_t> seq{0};
  std::atomic<std::uint32_t> waiters{0};
  std::atomic<std::int64_t> woken_ns{0};
};

// Waits until `w` counts `n` sleepers, then a while more, so they are in the kernel.
void until_asleep(const Word& w, std::uint32_t n) {
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  while (w.waiters.load() != n && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(w.waiters.load() == n);
  std::this_thread::sleep_for(50ms);
}

}  // namespace

TEST_CASE("a sleeper that a wake reached is out of the count before it runs again",
          "[spin][channel]") {
  Word w;
  SpinPolicy never(0ns);  // sleep at once
  std::atomic<bool> back{false};
  std::thread sleeper([&] {
    wait_for_change(&w.seq, &w.waiters, &w.woken_ns, 0, 5s, never);
    back = true;
  });
  until_asleep(w, 1);
  wake(&w.seq, &w.waiters, &w.woken_ns);
  // The waker took it out: a second message finds no one to wake, whether or not it has run.
  CHECK(w.waiters.load() == 0);
  sleeper.join();
  CHECK(back.load());
  CHECK(w.waiters.load() == 0);  // and it did not take itself out a second time
}

TEST_CASE("a sleeper whose slice ends, or whose word had moved, takes itself out",
          "[spin][channel]") {
  Word w;
  SpinPolicy never(0ns);
  wait_for_change(&w.seq, &w.waiters, &w.woken_ns, 0, 20ms, never);  // nobody wakes it
  CHECK(w.waiters.load() == 0);
  wait_for_change(&w.seq, &w.waiters, &w.woken_ns, 7, 5s, never);  // the word is not 7: at once
  CHECK(w.waiters.load() == 0);
}

TEST_CASE("a wake with a count wakes that many, and each sleeper is counted out once",
          "[spin][channel]") {
  Word w;
  SpinPolicy never(0ns);
  std::atomic<int> back{0};
  std::thread a([&] {
    wait_for_change(&w.seq, &w.waiters, &w.woken_ns, 0, 5s, never);
    ++back;
  });
  std::thread b([&] {
    wait_for_change(&w.seq, &w.waiters, &w.woken_ns, 0, 5s, never);
    ++back;
  });
  until_asleep(w, 2);
  wake(&w.seq, &w.waiters, &w.woken_ns, 1);
  CHECK(w.waiters.load() == 1);  // the other still sleeps, still counted: the next wake is made
  wake_all(&w.seq, &w.waiters);
  CHECK(w.waiters.load() == 0);
  a.join();
  b.join();
  CHECK(back.load() == 2);
  CHECK(w.waiters.load() == 0);
}

}  // namespace ferry::ring
