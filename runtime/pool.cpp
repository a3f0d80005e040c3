// The pool: the public API, wiring the supervisor's rooms together (runtime/supervisor/): the
// board they share (board.hpp), the dispatcher (any thread submits and dispatches), the result
// collector (collector threads and the remote side's threads complete), the worker fleet (the
// monitor thread alone starts, kills and reaps) and, with PoolOptions::remote, the remote slots.
// Local and remote workers are both slots of the board (slot.hpp).
#include "runtime/pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "ipc/adaptive_mutex.hpp"
#include "ipc/log.hpp"
#include "runtime/option_table.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/supervisor/board.hpp"
#include "runtime/supervisor/dispatcher.hpp"
#include "runtime/supervisor/remote_slots.hpp"
#include "runtime/supervisor/result_collector.hpp"
#include "runtime/supervisor/stream_wake.hpp"
#include "runtime/supervisor/worker_fleet.hpp"
#include "runtime/worker_protocol.hpp"

namespace ferry {
namespace {

using supervisor::TaskPtr;
using supervisor::WorkerProcess;
using Completion = std::function<void(Pool::Result&&)>;

std::string normalise_device(const std::string& d) {
  if (d == "cpu") return d;
  if (d == "cuda") return "cuda:0";
  if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() < 9 &&
      d.find_first_not_of("0123456789", 5) == std::string::npos) {
    return d;
  }
  throw Error(Errc::invalid_argument,
              "device '" + d + "' is not one of cpu, cuda, cuda:N (e.g. --devices cpu,cuda:0)");
}

// PoolOptions checked, and filled in where left to the pool; the devices normalised.
PoolOptions checked(PoolOptions o) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.workers < 0) {
    throw Error(Errc::invalid_argument,
                "workers = " + std::to_string(o.workers) + " is negative; use 0 for one per core");
  }
  if (o.devices.empty()) o.devices.assign(o.workers == 0 ? cores : o.workers, "cpu");
  // The ranges of docs/options.md, as every caller's (runtime/option_table.hpp).
  ferry::checked(option("maxtasks_inflight"), o.max_inflight_per_worker);
  ferry::checked(option("retries"), o.max_retries);
  ferry::checked(option("threads_per_worker"), o.threads_per_worker);
  ferry::checked(option("start_timeout"), o.start_timeout.count());
  ferry::checked(option("task_timeout"), o.task_timeout.count());
  supervisor::validate(o.restart);
  for (auto& d : o.devices) d = normalise_device(d);
  if (o.threads_per_worker <= 0) {
    o.threads_per_worker = std::max(1, cores / static_cast<int>(o.devices.size()));
  }
  return o;
}

// The records each of a worker's task queues has room for, shared tensors aside: a fixed depth
// of tasks of the most tensors each, or QueueDepth's room where the pool chooses (its deeper
// queues are of smaller tasks: the book keeps the records within this).
std::size_t task_records_per_worker(const PoolOptions& o) {
  const std::size_t depth = o.max_inflight_per_worker > 0
                                ? static_cast<std::size_t>(o.max_inflight_per_worker)
                                : supervisor::QueueDepth::kRoomDepth;
  return depth * (protocol::kMaxTensorsPerTask + 1);
}

}  // namespace

struct Pool::State {
  explicit State(PoolOptions o)
      : opt(std::move(o)),
        board(static_cast<int>(opt.devices.size()), opt.max_inflight_per_worker, opt.max_retries,
              opt.max_tasks_per_worker, task_records_per_worker(opt)),
        dispatcher(board),
        collector(board, dispatcher),
        fleet(board, dispatcher, collector, opt.devices) {}

  PoolOptions opt;
  supervisor::Board board;
  supervisor::Dispatcher dispatcher;
  supervisor::ResultCollector collector;
  supervisor::WorkerFleet fleet;
  std::optional<supervisor::RemoteSlots> remote;  // with opt.remote
  std::thread monitor_thread;
  std::mutex close_mu;  // one close() at a time

  std::size_t capacity() const {
    std::lock_guard<std::mutex> lock(board.mu);
    return board.book.capacity();
  }

  TaskPtr submit(const std::string& name, Tensors inputs, std::optional<std::size_t> index,
                 std::chrono::milliseconds timeout, Completion done, PreludePtr prelude = nullptr,
                 bool awaited = false) {
    auto task = std::make_shared<supervisor::Task>();
    task->awaited = awaited;
    task->name = name;
    task->inputs = std::move(inputs);
    task->prelude = std::move(prelude);
    task->done = [done = std::move(done)](supervisor::Task& t, std::exception_ptr error,
                                          Tensors outputs, int worker) {
      Result r;
      r.index = t.index;
      r.outputs = std::move(outputs);
      r.error = std::move(error);
      r.latency = Clock::now() - t.admitted;
      r.worker = worker;
      done(std::move(r));
    };
    dispatcher.submit(task, index, timeout);
    return task;
  }

  void close(Shutdown how) {
    if (how == Shutdown::Kill) {
      // A Kill cuts short a Drain that another thread is waiting on (a Python join() that
      // Ctrl-C left behind): that close() then kills, and this one finds the pool closed.
      std::lock_guard<std::mutex> lock(board.mu);
      board.life.ask_kill();
      board.changed.notify_all();
    }
    std::lock_guard<std::mutex> once(close_mu);
    std::vector<TaskPtr> cancelled;
    {
      std::unique_lock<std::mutex> lock(board.mu);
      if (board.life.closed()) return;
      board.life.begin_close();
      board.changed.notify_all();
      for (supervisor::LocalSlot* x : board.here) x->gate.wake.notify_one();  // to drain
      if (how == Shutdown::Drain) {
        board.changed.wait_for(lock, opt.drain_timeout,
                               [&] { return board.book.empty() || board.life.kill_asked(); });
      }
      // A kill asked meanwhile (by another thread's close) wins over this close's manner.
      if (board.life.kill_asked()) how = Shutdown::Kill;
      cancelled = board.book.take_all();
      board.life.begin_stop(how == Shutdown::Kill);
    }
    const std::string why =
        how == Shutdown::Drain  ? "the pool closed and its drain_timeout passed first"
        : how == Shutdown::Kill ? "the pool was terminated (Shutdown::Kill) first"
                                : "the pool was closed (Shutdown::Cancel) first";
    for (auto& t : cancelled) {
      supervisor::end_task(
          *t, std::make_exception_ptr(TaskError(Errc::closed, t->name, t->index, t->worker, "", -1,
                                                "not finished: " + why)));
    }
    // No remote event comes after this: the hosts are told, their threads joined.
    if (opt.remote) opt.remote->stop();
    board.monitor.rouse();
    if (monitor_thread.joinable()) monitor_thread.join();
    std::lock_guard<std::mutex> lock(board.mu);
    board.life.end();
  }
};

// ---- Pool ------------------------------------------------------------------------------------

namespace {

// PoolOptions::shared as the workers will get it: CPU tensors moved into shared memory in place
// (the caller's own tensors with them), CUDA ones checked against every worker's device.
NamedTensors shared_for(const NamedTensors& shared,
                        const std::vector<std::unique_ptr<WorkerProcess>>& workers) {
  if (shared.size() > kMaxSharedTensors) {
    throw Error(Errc::invalid_argument, "PoolOptions::shared holds " +
                                            std::to_string(shared.size()) + " tensors, more than " +
                                            std::to_string(kMaxSharedTensors) +
                                            "; share a few large tensors and views of them");
  }
  NamedTensors out;
  for (const auto& [name, t] : shared) {
    if (name.empty() || !t.defined()) {
      throw Error(
          Errc::invalid_argument,
          "PoolOptions::shared: " + (name.empty() ? std::string("a tensor has an empty name")
                                                  : "'" + name + "' is an undefined tensor"));
    }
    if (t.is_cuda()) {
      for (const auto& w : workers) {
        if (w->device() == "cpu") {
          throw Error(Errc::invalid_argument,
                      "shared tensor '" + name + "' is on " + t.device().str() + " but worker " +
                          std::to_string(w->id()) +
                          " runs on the CPU, where it could only get a copy; share it from the "
                          "CPU (t.cpu()) or run every worker on CUDA");
        }
      }
      out.emplace(name, t.detach());
      continue;
    }
    try {
      share_(t);
    } catch (const Error& e) {
      throw Error(e.code(), "shared tensor '" + name + "': " + e.detail());
    }
    out.emplace(name, t.detach());
  }
  return out;
}

}  // namespace

Pool::Pool(PoolOptions options) : s_(std::make_shared<State>(checked(std::move(options)))) {
  State& s = *s_;
  const PoolOptions& o = s.opt;
  supervisor::FleetOptions& f = s.fleet.options();
  f.restart = o.restart;
  f.task_timeout = o.task_timeout;
  f.stop_timeout = o.stop_timeout;
  supervisor::LaunchSpec& spec = f.spec;
  spec.start = o.start;
  spec.executable = o.worker_executable;
  spec.args = o.worker_args;
  spec.threads = o.threads_per_worker;
  spec.shared_allocations = o.shared_allocations;
  spec.queue_capacity = static_cast<std::uint32_t>(task_records_per_worker(o));
  spec.start_timeout = o.start_timeout;
  spec.config = o.config;
  spec.require_tasks = o.require_tasks;
  spec.shared = shared_for(o.shared, s.fleet.workers());
  spec.queue_capacity += static_cast<std::uint32_t>(spec.shared.size());
  if (o.start == Start::Fork) resolve_start(Start::Fork);  // refuse now, before any thread

  std::promise<void> started;
  std::future<void> ready = started.get_future();
  s.monitor_thread = std::thread(
      [state = s_, p = std::move(started)]() mutable { state->fleet.run(std::move(p)); });
  try {
    ready.get();
  } catch (...) {
    s.monitor_thread.join();
    throw;
  }
  if (s.opt.remote) {
    s.remote.emplace(s.board, s.dispatcher, s.collector, *s.opt.remote);
    try {
      s.opt.remote->start(*s.remote);
    } catch (...) {
      s.close(Shutdown::Cancel);
      throw;
    }
  }
}

Pool::~Pool() {
  try {
    close(s_->opt.shutdown);
  } catch (const std::exception& e) {
    log().error("closing the pool: {}", e.what());
  }
}

std::future<Tensors> Pool::submit(const std::string& task, Tensors inputs,
                                  std::chrono::milliseconds timeout, PreludePtr prelude) {
  auto promise = std::make_shared<std::promise<Tensors>>();
  std::future<Tensors> f = promise->get_future();
  s_->submit(
      task, std::move(inputs), std::nullopt, timeout,
      [promise](Result&& r) {
        if (r.error) {
          promise->set_exception(r.error);
        } else {
          promise->set_value(std::move(r.outputs));
        }
      },
      std::move(prelude));
  return f;
}

void Pool::submit(const std::string& task, Tensors inputs, std::function<void(Result&&)> done,
                  std::chrono::milliseconds timeout, PreludePtr prelude) {
  s_->submit(task, std::move(inputs), std::nullopt, timeout, std::move(done), std::move(prelude));
}

std::vector<Tensors> Pool::map(const std::string& task, const std::vector<Tensors>& inputs) {
  std::vector<std::future<Tensors>> futures;
  futures.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto promise = std::make_shared<std::promise<Tensors>>();
    futures.push_back(promise->get_future());
    s_->submit(task, inputs[i], i, kForever, [promise](Result&& r) {
      if (r.error) {
        promise->set_exception(r.error);
      } else {
        promise->set_value(std::move(r.outputs));
      }
    });
  }
  std::vector<Tensors> out(inputs.size());
  std::exception_ptr first;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    try {
      out[i] = futures[i].get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return out;
}

// ---- Pool::Call ------------------------------------------------------------------------------

namespace {
// How long a caller waits on the worker's result queue at a time, before it looks again at
// where its task is (a retry may have moved it) and whether the collector is needed there.
constexpr std::chrono::milliseconds kCallSlice{20};
}  // namespace

struct Pool::Call::State {
  std::shared_ptr<Pool::State> pool;
  TaskPtr task;
  std::promise<Tensors> promise;
  std::shared_future<Tensors> outcome = promise.get_future().share();
  // Set once `outcome` is: a look at the future itself marks it as waited for, and its setter
  // then pays a futex wake-up for nobody (the caller that set it, most often).
  std::atomic<bool> finished{false};

  bool ended() const { return finished.load(std::memory_order_acquire); }

  // Takes one result from the worker that runs the task, waiting up to `slice`, where this
  // thread may: the task is handed to a worker here whose collector is not needed, and no one
  // else holds the turn. False where it may not, and then it never will: a task not yet handed
  // (the pool is full), a worker with results of other tasks (the collector's), another caller
  // on the same worker, or a process that has gone (its reap hands the task back).
  bool take_own_result(std::chrono::milliseconds slice) {
    supervisor::Board& b = pool->board;
    std::optional<TensorQueue> results;
    supervisor::CollectorGate* gate = nullptr;
    int w = -1;
    {
      std::lock_guard<std::mutex> lock(b.mu);
      w = task->worker;
      if (!task->awaited || w < 0 || static_cast<std::size_t>(w) >= b.here.size() ||
          b.book.needs_collector(w) || !b.here[w]->results) {
        return false;
      }
      results = b.here[w]->results;
      gate = &b.here[w]->gate;
    }
    std::unique_lock<std::mutex> turn(gate->turn, std::try_to_lock);
    if (!turn.owns_lock()) return false;
    try {
      if (std::optional<Tensors> m = results->try_recv(slice)) {
        {
          std::lock_guard<std::mutex> lock(b.mu);
          ++b.totals.results_taken_by_callers;
        }
        if (auto why = pool->collector.on_result(w, std::move(*m))) b.request_kill(w, *why);
      }
    } catch (const Error& e) {
      if (e.code() != Errc::closed && e.code() != Errc::peer_dead) {
        b.request_kill(w, "it sent a result the supervisor could not read (" + e.detail() + ")");
      }
      return false;
    }
    return true;
  }

  // The caller waits no more: the task's result, when it comes, is the collector's.
  void stop_awaiting() {
    supervisor::Board& b = pool->board;
    std::lock_guard<std::mutex> lock(b.mu);
    if (!task->awaited) return;
    b.rouse_collector(b.book.stop_awaiting(task->id));
  }
};

Pool::Call Pool::call(const std::string& task, Tensors inputs, std::chrono::milliseconds timeout,
                      PreludePtr prelude, std::shared_ptr<void> keep) {
  auto c = std::make_shared<Call::State>();
  c->pool = s_;
  c->task = s_->submit(
      task, std::move(inputs), std::nullopt, timeout,
      [caller = std::weak_ptr<Call::State>(c), keep = std::move(keep)](Result&& r) mutable {
        if (auto alive = caller.lock()) {  // a Call dropped unfinished takes nothing
          if (r.error) {
            alive->promise.set_exception(r.error);
          } else {
            alive->promise.set_value(std::move(r.outputs));
          }
          alive->finished.store(true, std::memory_order_release);
        }
        keep.reset();
      },
      std::move(prelude), true);
  return Call(std::move(c));
}

std::optional<Tensors> Pool::Call::wait(std::chrono::milliseconds timeout) {
  State& c = *s_;
  const bool forever = timeout.count() < 0;
  const Clock::time_point deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
  for (;;) {
    // An ended task has left the book, and its awaited count with it: nothing to stop.
    if (c.ended()) return c.outcome.get();  // or throws the task's error
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return std::nullopt;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (c.take_own_result(forever ? kCallSlice : std::min(left, kCallSlice))) continue;
    // Not this thread's to take: the pool's threads end the task, as they do a submit()'s.
    c.stop_awaiting();
    if (forever) {
      c.outcome.wait();
    } else {
      c.outcome.wait_until(deadline);
    }
  }
}

Pool::Call::~Call() {
  if (!s_ || s_->ended()) return;  // moved from, or nothing left to stop
  try {
    s_->stop_awaiting();
  } catch (...) {
  }
}

Tensors Pool::Result::get() const {
  if (error) std::rethrow_exception(error);
  return outputs;
}

struct Pool::Results::State {
  std::shared_ptr<Pool::State> pool;
  std::string task;
  PreludePtr prelude;     // every task's
  std::size_t count = 0;  // inputs; lowered to where the stream ended once make() says so
  std::function<std::optional<Tensors>(std::size_t)> make;
  std::size_t next_input = 0;
  std::optional<Tensors> held;  // made but not yet admitted (the pool was full)
  std::size_t outstanding = 0;  // submitted, not yet returned by next()
  std::size_t window = 0;       // the pool's capacity when inputs were last submitted
  AdaptiveMutex mu;  // the collectors' and the reader's: short sections, tried before sleeping
  std::condition_variable arrived;
  std::deque<Result> ready;
  // When the first of `ready` came in since it was last empty. A reader sleeps only on an empty
  // `ready`, so while it sleeps this is when its oldest result came in.
  std::optional<Clock::time_point> ready_since;
  supervisor::StreamWake wake;
  bool consumer_looks_again = false;  // next() sleeps for StreamWake::kHold, not until woken

  // What StreamWake decides on; under `mu`.
  supervisor::StreamState stream(Clock::time_point now) const {
    supervisor::StreamState s;
    s.in_flight = outstanding - ready.size();
    s.window = window;
    s.inputs_left = next_input < count;
    s.typical_gap = wake.typical_gap();
    if (ready_since) s.oldest_ready = now - *ready_since;
    s.consumer_looks_again = consumer_looks_again;
    return s;
  }
};

Pool::Results Pool::imap_unordered(const std::string& task, std::vector<Tensors> inputs) {
  auto shared = std::make_shared<std::vector<Tensors>>(std::move(inputs));
  const std::size_t n = shared->size();
  // Each input is handed over once, so it can be moved out rather than copied.
  return imap_unordered(task, n, [shared](std::size_t i) { return std::move((*shared)[i]); });
}

Pool::Results Pool::imap_unordered(const std::string& task, std::size_t count,
                                   std::function<Tensors(std::size_t)> make) {
  auto st = std::make_shared<Results::State>();
  st->pool = s_;
  st->task = task;
  st->count = count;
  st->make = [make = std::move(make)](std::size_t i) -> std::optional<Tensors> { return make(i); };
  return Results(std::move(st));
}

Pool::Results Pool::imap_unordered(const std::string& task,
                                   std::function<std::optional<Tensors>(std::size_t)> next_input,
                                   PreludePtr prelude) {
  auto st = std::make_shared<Results::State>();
  st->pool = s_;
  st->task = task;
  st->prelude = std::move(prelude);
  st->count = std::numeric_limits<std::size_t>::max();  // until next_input says the end
  st->make = std::move(next_input);
  return Results(std::move(st));
}

bool Pool::Results::submit_more(std::chrono::milliseconds first_wait) {
  State& st = *s_;
  const std::size_t window = st.pool->capacity();
  // An input that found no room is kept for the next round rather than made again.
  while (st.next_input < st.count && st.outstanding < window) {
    const std::size_t i = st.next_input;
    if (!st.held) {
      st.held = st.make(i);
      if (!st.held) {
        std::lock_guard<std::mutex> lock(st.mu);
        st.count = i;  // the stream ended: what is out is all
        break;
      }
    }
    std::weak_ptr<State> weak = s_;
    try {
      st.pool->submit(
          st.task, *st.held, i, st.outstanding > 0 ? std::chrono::milliseconds(0) : first_wait,
          [weak](Result&& r) {
            if (auto s = weak.lock()) {
              const Clock::time_point now = Clock::now();
              std::lock_guard<std::mutex> lock(s->mu);
              if (s->ready.empty()) s->ready_since = now;
              s->ready.push_back(std::move(r));
              s->wake.record_arrival(now);
              // Woken only when it has something to do at once (stream_wake.hpp).
              if (supervisor::StreamWake::wake_now(s->stream(now))) s->arrived.notify_all();
            }
          },
          st.prelude);
    } catch (const Error& e) {
      if (e.code() != Errc::timeout) throw;
      return st.outstanding > 0;
    }
    st.held.reset();
    std::lock_guard<std::mutex> lock(st.mu);
    ++st.next_input;
    ++st.outstanding;
    st.window = window;
  }
  return true;
}

std::size_t Pool::Results::top_up() {
  const std::size_t before = s_->next_input;
  submit_more(std::chrono::milliseconds(0));
  return s_->next_input - before;
}

std::vector<Pool::Result> Pool::Results::take_ready(std::size_t most) {
  State& st = *s_;
  std::vector<Result> out;
  std::lock_guard<std::mutex> lock(st.mu);
  while (out.size() < most && !st.ready.empty() && !st.ready.front().error) {
    out.push_back(std::move(st.ready.front()));
    st.ready.pop_front();
    --st.outstanding;
  }
  if (st.ready.empty()) st.ready_since.reset();
  return out;
}

std::optional<Pool::Result> Pool::Results::next(std::chrono::milliseconds timeout) {
  State& st = *s_;
  const auto deadline = Clock::now() + timeout;
  auto left = [&] {
    if (timeout < std::chrono::milliseconds(0)) return kForever;
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  auto timed_out = [&] {
    return Error(Errc::timeout,
                 "no result of the stream came within " + std::to_string(timeout.count()) + " ms");
  };
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(st.mu);
      if (!st.ready.empty()) {
        Result r = std::move(st.ready.front());
        st.ready.pop_front();
        if (st.ready.empty()) st.ready_since.reset();
        --st.outstanding;
        return r;
      }
      if (st.outstanding == 0 && st.next_input == st.count) return std::nullopt;
    }
    // Top up without blocking while results are on their way; block only when none are (a
    // first input that still finds no room is kept for the next call).
    if (!submit_more(left())) throw timed_out();
    std::unique_lock<std::mutex> lock(st.mu);
    if (st.outstanding == 0) continue;  // the stream ended with nothing out: no more results
    auto some = [&] { return !st.ready.empty(); };
    // Results may gather before the consumer is woken; it then looks again after a short while
    // (stream_wake.hpp), a wait that ends without one is no timeout of the caller's.
    const std::optional<Clock::duration> limit =
        supervisor::StreamWake::sleep_limit(st.stream(Clock::now()));
    const Clock::time_point until =
        timeout < std::chrono::milliseconds(0) ? Clock::time_point::max() : deadline;
    if (limit && Clock::now() + *limit < until) {
      st.consumer_looks_again = true;
      st.arrived.wait_until(lock, Clock::now() + *limit, some);
      st.consumer_looks_again = false;
    } else if (until == Clock::time_point::max()) {
      st.arrived.wait(lock, some);
    } else if (!st.arrived.wait_until(lock, deadline, some)) {
      throw timed_out();
    }
  }
}

void Pool::close() {
  s_->close(s_->opt.shutdown);
}
void Pool::close(Shutdown how) {
  s_->close(how);
}

std::vector<std::string> Pool::tasks() const {
  std::lock_guard<std::mutex> lock(s_->board.mu);
  return s_->board.task_names;
}
std::size_t Pool::size() const noexcept {
  return s_->fleet.size();
}
std::size_t Pool::capacity() const noexcept {
  return s_->capacity();
}

std::vector<pid_t> Pool::worker_pids() const {
  std::lock_guard<std::mutex> lock(s_->board.mu);
  std::vector<pid_t> pids;
  for (const supervisor::LocalSlot* x : s_->board.here) pids.push_back(x->stats.pid);
  return pids;
}

PoolStats Pool::stats() const {
  const supervisor::Board& b = s_->board;
  std::lock_guard<std::mutex> lock(b.mu);
  PoolStats out = b.totals;
  out.submitted = b.book.admitted();
  out.completed = b.book.completed();
  out.failed = b.book.failed();
  out.retried = b.book.retried();
  for (std::size_t w = 0; w < b.slots.size(); ++w) {
    WorkerStats s = b.slots[w]->stats;
    const supervisor::WorkerCounts& c = b.book.counts(static_cast<int>(w));
    s.tasks_done = c.done;
    s.tasks_failed = c.failed;
    s.tasks_lost = c.lost;
    s.limit = b.book.limit(static_cast<int>(w));
    out.workers.push_back(std::move(s));
  }
  return out;
}

}  // namespace ferry
