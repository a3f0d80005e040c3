// The task book alone: admission, order, retries and exactly-once, with no process anywhere.
#include "runtime/supervisor/task_book.hpp"

#include "../../catch.hpp"

#include <algorithm>

#include "ipc/error.hpp"

namespace ferry::supervisor {
namespace {

using namespace std::chrono_literals;

TaskPtr task(std::size_t index) {
  auto t = std::make_shared<Task>();
  t->name = "t";
  t->index = index;
  return t;
}

const Clock::time_point t0 = Clock::now();

}  // namespace

TEST_CASE("task book: at most workers x per-worker tasks are open, an ending frees a place") {
  TaskBook book(2, 3, 0);
  CHECK(book.capacity() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    REQUIRE_FALSE(book.full());
    book.admit(task(i), t0);
  }
  CHECK(book.full());
  book.set_open(0, true);
  auto h = book.next_hand_over(t0);
  REQUIRE(h);
  CHECK(book.complete(h->worker, h->task->id, h->attempt, true, t0) == h->task);
  CHECK_FALSE(book.full());
  CHECK(book.open() == 5);
}

TEST_CASE("task book: oldest first, to the least loaded open worker with room") {
  TaskBook book(3, 2, 0);
  for (std::size_t i = 0; i < 6; ++i) book.admit(task(i), t0);
  CHECK_FALSE(book.next_hand_over(t0));  // no worker open yet
  book.set_open(0, true);
  book.set_open(2, true);
  std::vector<std::pair<std::size_t, int>> got;
  while (auto h = book.next_hand_over(t0)) got.emplace_back(h->task->index, h->worker);
  // Worker 1 is closed; 0 and 2 alternate by load until each holds 2.
  CHECK(got == std::vector<std::pair<std::size_t, int>>{{0, 0}, {1, 2}, {2, 0}, {3, 2}});
  CHECK(book.load(0) == 2);
  CHECK(book.load(1) == 0);
}

TEST_CASE("task book: a lost task goes back to the front, to another worker, then ends") {
  TaskBook book(2, 3, 1);  // one retry
  book.set_open(0, true);
  const TaskId first = book.admit(task(0), t0);
  book.admit(task(1), t0);
  auto h = book.next_hand_over(t0);
  REQUIRE(h->task->id == first);
  CHECK(h->first);
  CHECK(h->worker == 0);
  book.set_open(1, true);
  CHECK(book.worker_lost(0, "worker 0 killed by SIGKILL").empty());  // retried, not ended
  CHECK(book.retried() == 1);
  CHECK(book.counts(0).lost == 1);
  // The retry goes before the newer task, and away from worker 0 while 1 has room.
  auto r = book.next_hand_over(t0);
  REQUIRE(r);
  CHECK(r->task->id == first);
  CHECK(r->worker == 1);
  CHECK(r->attempt == 2);
  CHECK_FALSE(r->first);
  CHECK(r->task->lost_because == "worker 0 killed by SIGKILL");
  // Lost again: its retries are spent, so it ends, with the last loss.
  auto ended = book.worker_lost(1, "worker 1 killed by SIGSEGV");
  REQUIRE(ended.size() == 1);
  CHECK(ended[0]->id == first);
  CHECK(ended[0]->attempts == 2);
  CHECK(ended[0]->lost_because == "worker 1 killed by SIGSEGV");
  CHECK(book.failed() == 1);
  CHECK(book.open() == 1);
}

TEST_CASE("task book: a retry takes the worker it was lost on when no other has room") {
  TaskBook book(2, 1, 3);
  book.set_open(0, true);
  book.admit(task(0), t0);
  auto h = book.next_hand_over(t0);
  book.worker_lost(0, "lost");
  auto r = book.next_hand_over(t0);  // worker 1 is closed
  REQUIRE(r);
  CHECK(r->worker == 0);
}

TEST_CASE("task book: every task ends once, a result for an attempt no longer current is stale") {
  TaskBook book(2, 2, 2);
  book.set_open(0, true);
  book.set_open(1, true);
  book.admit(task(0), t0);
  auto h1 = book.next_hand_over(t0);
  REQUIRE(h1->worker == 0);
  book.worker_lost(0, "timed out");
  auto h2 = book.next_hand_over(t0);
  REQUIRE(h2->worker == 1);
  // The first attempt's late result (its worker was killed for a timeout) does not count.
  CHECK_FALSE(book.complete(0, h1->task->id, h1->attempt, true, t0));
  CHECK(book.complete(1, h2->task->id, h2->attempt, true, t0));
  CHECK_FALSE(book.complete(1, h2->task->id, h2->attempt, true, t0));  // twice: stale
  CHECK(book.completed() == 1);
  CHECK(book.empty());
}

TEST_CASE("task book: a failed hand-over ends that attempt only") {
  TaskBook book(1, 2, 2);
  book.set_open(0, true);
  book.admit(task(0), t0);
  auto h = book.next_hand_over(t0);
  CHECK(book.hand_over_failed(*h) == h->task);
  CHECK_FALSE(book.hand_over_failed(*h));
  CHECK(book.failed() == 1);
  CHECK(book.load(0) == 0);
}

TEST_CASE("task book: the oldest task of a worker is overdue from when it could start") {
  TaskBook book(1, 3, 0);
  book.set_open(0, true);
  book.admit(task(0), t0);
  book.admit(task(1), t0);
  auto a = book.next_hand_over(t0);
  auto b = book.next_hand_over(t0 + 50ms);
  CHECK(book.overdue(t0 + 99ms, 100ms).empty());
  CHECK(*book.next_deadline(100ms) == t0 + 100ms);
  auto due = book.overdue(t0 + 100ms, 100ms);
  REQUIRE(due.size() == 1);
  CHECK(due[0].second == a->task);
  // The second task could start only when the first finished, at +80 ms.
  book.complete(0, a->task->id, a->attempt, true, t0 + 80ms);
  CHECK(book.overdue(t0 + 150ms, 100ms).empty());
  CHECK(book.overdue(t0 + 180ms, 100ms).at(0).second == b->task);
  CHECK(book.overdue(t0 + 1h, 0ms).empty());  // no limit
  CHECK_FALSE(book.next_deadline(0ms));
}

TEST_CASE(
    "task book: a result out of order ends only its task, and the oldest stays the one timed") {
  TaskBook book(1, 3, 0);
  book.set_open(0, true);
  for (std::size_t i = 0; i < 3; ++i) book.admit(task(i), t0);
  auto a = book.next_hand_over(t0);
  auto b = book.next_hand_over(t0);
  auto c = book.next_hand_over(t0);
  REQUIRE((a && b && c));
  // The middle one first (a worker that answers out of order): the first is still the oldest.
  CHECK(book.complete(0, b->task->id, b->attempt, true, t0 + 10ms) == b->task);
  CHECK(book.overdue(t0 + 100ms, 100ms).at(0).second == a->task);
  // The head next: the last could start from then, and is the only one left.
  CHECK(book.complete(0, a->task->id, a->attempt, true, t0 + 30ms) == a->task);
  CHECK(book.overdue(t0 + 129ms, 100ms).empty());
  CHECK(book.overdue(t0 + 130ms, 100ms).at(0).second == c->task);
  CHECK_FALSE(book.complete(0, b->task->id, b->attempt, true, t0 + 40ms));  // ended once
  CHECK(book.complete(0, c->task->id, c->attempt, true, t0 + 50ms) == c->task);
  CHECK(book.overdue(t0 + 1h, 100ms).empty());
}

TEST_CASE("task book: take_all ends every open task in admission order and empties the book") {
  TaskBook book(1, 4, 0);
  book.set_open(0, true);
  for (std::size_t i = 0; i < 4; ++i) book.admit(task(i), t0);
  auto h = book.next_hand_over(t0);
  auto all = book.take_all();
  REQUIRE(all.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(all[i]->index == i);
  CHECK(book.empty());
  CHECK(book.load(0) == 0);
  CHECK_FALSE(book.next_hand_over(t0));
  CHECK_FALSE(book.complete(0, h->task->id, h->attempt, true, t0));
  CHECK(book.failed() == 4);
}

TEST_CASE(
    "task book: a worker added later brings its own room, takes work once open, and "
    "keeps its own time limits") {
  TaskBook book(1, 2, 1);
  book.set_open(0, true);
  for (std::size_t i = 0; i < 6; ++i) book.admit(task(i), t0);
  const int host = book.add_worker(4);
  CHECK(host == 1);
  CHECK(book.workers() == 2);
  CHECK(book.capacity() == 6);
  std::vector<int> to;
  while (auto h = book.next_hand_over(t0)) to.push_back(h->worker);
  CHECK(to == std::vector<int>{0, 0});  // closed until it says it is ready
  book.set_open(host, true);
  while (auto h = book.next_hand_over(t0)) to.push_back(h->worker);
  CHECK(to == std::vector<int>{0, 0, 1, 1, 1, 1});
  CHECK(book.load(host) == 4);
  // Its tasks are not the local task_timeout's to kill.
  REQUIRE(book.overdue(t0 + 1h, 100ms).size() == 1);
  CHECK(book.overdue(t0 + 1h, 100ms).at(0).first == 0);
}

TEST_CASE("task book: a retired worker's tasks are retried elsewhere and its room is gone") {
  TaskBook book(1, 1, 2);
  book.set_open(0, true);
  const int host = book.add_worker(2);
  book.set_open(host, true);
  for (std::size_t i = 0; i < 3; ++i) book.admit(task(i), t0);
  while (book.next_hand_over(t0)) {
  }
  CHECK(book.load(host) == 2);
  CHECK_THROWS_AS(book.retire(host), Error);  // its tasks must be handed back first
  CHECK(book.worker_lost(host, "host lost").empty());
  book.retire(host);
  CHECK(book.capacity() == 1);
  CHECK(book.full());         // three open tasks, room for one: no more admitted until they end
  book.set_open(host, true);  // a retired worker stays out even if opened by mistake
  auto h = book.next_hand_over(t0);
  CHECK_FALSE(h);  // worker 0 still holds its task
}

TEST_CASE("task book: where the pool chooses, short tasks deepen a worker's queue, long ones not") {
  TaskBook book(2, 0, 0);
  CHECK(book.capacity() == 2 * QueueDepth::kMinDepth);
  book.set_open(0, true);
  book.set_open(1, true);
  // Worker 0 answers each task 10 us after it could start it; worker 1 takes 50 ms.
  Clock::time_point now = t0;
  std::size_t index = 0;
  auto round = [&] {
    while (!book.full()) book.admit(task(index++), now);
    std::vector<HandOver> out;
    while (auto h = book.next_hand_over(now)) out.push_back(*h);
    // Each worker's results in turn, so that one's time is not counted in the other's.
    std::stable_sort(out.begin(), out.end(),
                     [](const HandOver& a, const HandOver& b) { return a.worker < b.worker; });
    for (const HandOver& h : out) {
      now += h.worker == 0 ? Clock::duration(10us) : Clock::duration(50ms);
      REQUIRE(book.complete(h.worker, h.task->id, h.attempt, true, now));
    }
  };
  for (int i = 0; i < 40; ++i) round();
  CHECK(book.limit(0) == QueueDepth::kMaxDepth);
  CHECK(book.limit(1) == QueueDepth::kMinDepth);
  CHECK(book.capacity() == QueueDepth::kMaxDepth + QueueDepth::kMinDepth);
  // One long task, queued behind a short one, makes worker 0 shallow at its result.
  book.set_open(1, false);
  book.admit(task(index++), now);
  book.admit(task(index++), now);
  auto first = book.next_hand_over(now);
  auto second = book.next_hand_over(now);
  REQUIRE((first && second && first->worker == 0 && second->worker == 0));
  now += 10us;
  REQUIRE(book.complete(0, first->task->id, first->attempt, true, now));
  CHECK(book.limit(0) == QueueDepth::kMaxDepth);
  now += 200ms;
  REQUIRE(book.complete(0, second->task->id, second->attempt, true, now));
  CHECK(book.limit(0) == QueueDepth::kMinDepth);
  CHECK(book.capacity() == book.limit(0) + book.limit(1));
}

TEST_CASE("task book: short tasks of megabytes, inputs and results counted, queue shallower") {
  TaskBook book(1, 0, 0);
  book.set_open(0, true);
  Clock::time_point now = t0;
  // Each task takes 10 us with a 1 MiB input and returns 3 MiB: 4 MiB a task.
  for (std::size_t i = 0; i < 40; ++i) {
    TaskPtr t = task(i);
    t->inputs = {at::empty({1 << 18}, at::kFloat)};
    book.admit(t, now);
    auto h = book.next_hand_over(now);
    REQUIRE(h);
    CHECK(h->task->input_bytes == std::uint64_t{1} << 20);
    now += 10us;
    REQUIRE(book.complete(0, h->task->id, h->attempt, true, now, std::uint64_t{3} << 20));
  }
  CHECK(book.limit(0) == QueueDepth::kDataCover / (std::uint64_t{4} << 20));
  CHECK(book.capacity() == book.limit(0));
}

TEST_CASE("task book: a fixed per-worker limit stays whatever the tasks take") {
  TaskBook book(1, 2, 0);
  book.set_open(0, true);
  for (std::size_t i = 0; i < 20; ++i) {
    book.admit(task(i), t0);
    auto h = book.next_hand_over(t0);
    REQUIRE(h);
    REQUIRE(book.complete(0, h->task->id, h->attempt, true, t0 + 1us));
  }
  CHECK(book.limit(0) == 2);
  CHECK(book.capacity() == 2);
}

TaskPtr task_of(std::size_t index, std::size_t inputs, std::size_t prelude = 0) {
  TaskPtr t = task(index);
  t->inputs = Tensors(inputs);
  if (prelude > 0) {
    auto p = std::make_shared<Prelude>();
    p->id = 1;
    p->tensors = Tensors(prelude);
    t->prelude = p;
  }
  return t;
}

TEST_CASE("task book: a worker's handed tasks fit its task queue, however deep its limit") {
  TaskBook book(2, 10, 2, 0, 100);  // 10 tasks, 100 records each
  book.set_open(0, true);
  // A task takes its envelope, its inputs and its prelude: 1 + 30 + 10.
  TaskPtr big = task_of(0, 30, 10);
  book.admit(big, t0);
  CHECK(big->records == 41);
  CHECK(TaskBook::records_of(*task_of(1, 0)) == 1);
  for (std::size_t i = 1; i < 3; ++i) book.admit(task_of(i, 40), t0);
  auto a = book.next_hand_over(t0);
  auto b = book.next_hand_over(t0);
  REQUIRE((a && b));
  CHECK(book.records(0) == 82);
  // The third (41 records) would pass the room though the limit allows 10: it waits.
  CHECK_FALSE(book.next_hand_over(t0));
  CHECK(book.load(0) == 2);
  book.complete(0, a->task->id, a->attempt, true, t0 + 1ms);
  CHECK(book.records(0) == 41);
  auto c = book.next_hand_over(t0 + 1ms);
  REQUIRE(c);
  CHECK(book.records(0) == 82);
  // Small tasks fill what is left, up to 18 records here, then the limit of 10 tasks binds.
  for (std::size_t i = 3; i < 20; ++i) book.admit(task_of(i, 0), t0);
  std::size_t small = 0;
  while (book.next_hand_over(t0 + 1ms)) ++small;
  CHECK(small == 8);
  CHECK(book.load(0) == 10);
  CHECK(book.records(0) == 90);
  // A loss frees the room with the tasks; the retries go out again within it.
  CHECK(book.worker_lost(0, "killed").empty());
  CHECK(book.records(0) == 0);
  book.set_open(1, true);
  CHECK(book.next_hand_over(t0 + 2ms)->worker == 1);  // the retry avoids worker 0
}

TEST_CASE("task book: a task larger than the room still goes to a worker that holds nothing") {
  TaskBook book(1, 4, 0, 0, 10);
  book.set_open(0, true);
  book.admit(task_of(0, 20), t0);
  book.admit(task_of(1, 0), t0);
  auto a = book.next_hand_over(t0);
  REQUIRE(a);
  CHECK(book.records(0) == 21);
  CHECK_FALSE(book.next_hand_over(t0));  // nothing beside it
  REQUIRE(book.complete(0, a->task->id, a->attempt, true, t0 + 1ms));
  CHECK(book.records(0) == 0);
  CHECK(book.next_hand_over(t0 + 1ms));
}

TEST_CASE("task book: without a room, or for a host, only the task limit binds") {
  TaskBook book(1, 3, 0);
  book.set_open(0, true);
  const int host = book.add_worker(3);
  book.set_open(host, true);
  for (std::size_t i = 0; i < 6; ++i) book.admit(task_of(i, 64), t0);
  int handed = 0;
  while (book.next_hand_over(t0)) ++handed;
  CHECK(handed == 6);
  CHECK(book.records(0) == 3 * 65);
}

TEST_CASE(
    "task book: a process is handed its tasks per life, and is spent once they are answered") {
  TaskBook book(2, 4, 0, 3);  // 3 tasks per life
  book.set_open(0, true);
  for (std::size_t i = 0; i < 5; ++i) book.admit(task(i), t0);
  std::vector<HandOver> handed;
  while (auto h = book.next_hand_over(t0)) handed.push_back(*h);
  // Worker 0 has room for 4 but takes 3; worker 1 is closed: two wait.
  REQUIRE(handed.size() == 3);
  CHECK_FALSE(book.life_spent(0));
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK_FALSE(book.life_spent(0));  // not while a result is still to come
    book.complete(0, handed[i].task->id, handed[i].attempt, true, t0);
  }
  CHECK(book.life_spent(0));
  CHECK_FALSE(book.next_hand_over(t0));
  // The fresh process starts a life of its own.
  book.begin_life(0);
  CHECK_FALSE(book.life_spent(0));
  auto h = book.next_hand_over(t0);
  REQUIRE(h);
  CHECK(h->task->index == 3);
  CHECK(book.next_hand_over(t0));
  CHECK(book.load(0) == 2);
}

TEST_CASE("task book: a hand-over that failed is no task of the life, and no limit without one") {
  TaskBook book(1, 4, 0, 1);
  book.set_open(0, true);
  book.admit(task(0), t0);
  book.admit(task(1), t0);
  auto h = book.next_hand_over(t0);
  REQUIRE(h);
  CHECK_FALSE(book.next_hand_over(t0));  // its one task is out
  REQUIRE(book.hand_over_failed(*h));    // ...but never reached it
  CHECK_FALSE(book.life_spent(0));
  auto again = book.next_hand_over(t0);
  REQUIRE(again);
  CHECK(again->task->index == 1);

  TaskBook endless(1, 2, 0);  // tasks_per_life 0: no end
  endless.set_open(0, true);
  for (std::size_t i = 0; i < 50; ++i) {
    endless.admit(task(i), t0);
    auto x = endless.next_hand_over(t0);
    REQUIRE(x);
    endless.complete(0, x->task->id, x->attempt, true, t0);
    CHECK_FALSE(endless.life_spent(0));
  }
}

TEST_CASE("task book: a host's slot has no lives here (its own pool counts them)") {
  TaskBook book(0, 2, 0, 1);
  const int host = book.add_worker(4);
  book.set_open(host, true);
  for (std::size_t i = 0; i < 4; ++i) book.admit(task(i), t0);
  int handed = 0;
  while (book.next_hand_over(t0)) ++handed;
  CHECK(handed == 4);
  CHECK_FALSE(book.life_spent(host));
}

TEST_CASE("task book: a worker needs its collector while it holds a task no caller awaits") {
  TaskBook book(2, 4, 1);  // one retry
  book.set_open(0, true);
  CHECK_FALSE(book.needs_collector(0));  // nothing handed: the collector may sleep

  auto awaited = task(0);
  awaited->awaited = true;
  const TaskId a = book.admit(awaited, t0);
  auto ha = book.next_hand_over(t0);
  REQUIRE(ha);
  CHECK_FALSE(book.needs_collector(0));  // its caller takes the result

  book.admit(task(1), t0);
  auto hb = book.next_hand_over(t0);
  REQUIRE(hb);
  CHECK(book.needs_collector(0));  // the second one's result is the collector's
  REQUIRE(book.complete(0, hb->task->id, hb->attempt, true, t0));
  CHECK_FALSE(book.needs_collector(0));

  SECTION("a caller that stops waiting hands its result to the collector") {
    CHECK(book.stop_awaiting(a) == 0);
    CHECK_FALSE(awaited->awaited);
    CHECK(book.needs_collector(0));
    CHECK(book.stop_awaiting(a) == -1);  // once
  }
  SECTION("an awaited task's end leaves nothing for the collector") {
    REQUIRE(book.complete(0, a, ha->attempt, true, t0));
    CHECK_FALSE(book.needs_collector(0));
    CHECK(book.stop_awaiting(a) == -1);  // ended
  }
  SECTION("a retry stays awaited on its next worker") {
    book.set_open(1, true);
    CHECK(book.worker_lost(0, "killed").empty());
    CHECK_FALSE(book.needs_collector(0));
    auto again = book.next_hand_over(t0);
    REQUIRE(again);
    CHECK(again->worker == 1);
    CHECK_FALSE(book.needs_collector(1));
    CHECK(book.stop_awaiting(a) == 1);
    CHECK(book.needs_collector(1));
  }
  SECTION("a task still pending has no worker to rouse") {
    auto later = task(2);
    later->awaited = true;
    const TaskId l = book.admit(later, t0);
    book.set_open(0, false);
    CHECK(book.stop_awaiting(l) == -1);
    CHECK_FALSE(later->awaited);
  }
}

}  // namespace ferry::supervisor
