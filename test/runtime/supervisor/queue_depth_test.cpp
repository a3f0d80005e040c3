// The depth rule alone: how deep a worker's queue goes for short, long and changing tasks.
#include "runtime/supervisor/queue_depth.hpp"

#include "../../catch.hpp"

namespace ferry::supervisor {
namespace {

using namespace std::chrono_literals;

QueueDepth after(Clock::duration took, int tasks) {
  QueueDepth q;
  for (int i = 0; i < tasks; ++i) q.record(took);
  return q;
}

}  // namespace

TEST_CASE("queue depth: a worker with no result yet holds the fixed default's 3") {
  CHECK(QueueDepth{}.depth() == 3);
  CHECK_FALSE(QueueDepth{}.typical());
}

TEST_CASE("queue depth: tasks of up to about 156 microseconds fill the deepest queue, 64") {
  CHECK(QueueDepth::kMaxDepth == 64);
  CHECK(after(0us, 1).depth() == 64);  // a clock too coarse to see it
  CHECK(after(1us, 1).depth() == 64);
  CHECK(after(156us, 1).depth() == 64);
  CHECK(after(200us, 1).depth() == 50);
  CHECK(after(600us, 1).depth() == 17);
}

TEST_CASE("queue depth: the queue holds about 10 ms of work") {
  CHECK(after(1ms, 1).depth() == 10);
  CHECK(after(2500us, 1).depth() == 4);
  CHECK(after(3ms, 1).depth() == 4);  // rounded up: a queue a little over the cover
}

TEST_CASE("queue depth: tasks of a third of the cover or more keep the default 3") {
  CHECK(after(3340us, 1).depth() == 3);
  CHECK(after(50ms, 1).depth() == 3);
  CHECK(after(10s, 1).depth() == 3);
}

TEST_CASE("queue depth: one long task among short ones makes the queue shallow at once") {
  QueueDepth q = after(10us, 50);
  REQUIRE(q.depth() == QueueDepth::kMaxDepth);
  q.record(1s);  // a quarter of it is 250 ms: far past the cover
  CHECK(q.depth() == 3);
}

TEST_CASE("queue depth: after long tasks, short ones deepen the queue within a few dozen") {
  QueueDepth q = after(100ms, 5);
  REQUIRE(q.depth() == 3);
  int tasks = 0;
  while (q.depth() < QueueDepth::kMaxDepth && tasks < 1000) {
    q.record(10us);
    ++tasks;
  }
  CHECK(q.depth() == QueueDepth::kMaxDepth);
  CHECK(tasks < 30);  // (3/4)^n of 100 ms under the 156 us that asks for 64
}

TEST_CASE("queue depth: tasks of megabytes hold about 32 MiB of data a worker") {
  constexpr std::uint64_t MiB = 1 << 20;
  QueueDepth q;
  q.record(100us, 2 * MiB);  // a 1 MiB input and its 1 MiB result
  CHECK(q.depth() == 16);    // time alone would allow 64
  q = {};
  q.record(400us, 8 * MiB);
  CHECK(q.depth() == 4);  // time alone: 25
  q = {};
  q.record(10us, 64 * MiB);
  CHECK(q.depth() == QueueDepth::kMinDepth);  // never below the default's depth
  q = {};
  q.record(2ms, 2 * MiB);
  CHECK(q.depth() == 5);  // the time binds first
  q = {};
  q.record(10us, 64 * 1024);
  CHECK(q.depth() == QueueDepth::kMaxDepth);  // small tensors: the data rule does not bind
}

TEST_CASE("queue depth: the data a task moves is averaged as its time is") {
  constexpr std::uint64_t MiB = 1 << 20;
  QueueDepth q = after(10us, 20);
  REQUIRE(q.depth() == QueueDepth::kMaxDepth);
  q.record(10us, 16 * MiB);  // a quarter of 16 MiB: 4 MiB a task from now on
  CHECK(q.typical_bytes() == 4 * MiB);
  CHECK(q.depth() == 8);
  int tasks = 0;
  while (q.depth() < QueueDepth::kMaxDepth && tasks < 1000) {
    q.record(10us, 0);
    ++tasks;
  }
  CHECK(q.depth() == QueueDepth::kMaxDepth);
  CHECK(tasks < 30);  // (3/4)^n of 4 MiB under the half MiB that allows 64
}

TEST_CASE("queue depth: a negative time (clocks of two threads) counts as none") {
  QueueDepth q;
  q.record(-5us);
  CHECK(q.typical() == Clock::duration::zero());
  CHECK(q.depth() == QueueDepth::kMaxDepth);
}

}  // namespace ferry::supervisor
