// The pool: the public API over the supervisor's parts (runtime/supervisor/): the task book
// (which task is where), one WorkerProcess per slot (launch, handshake, death, restart), the
// restart policy, and the monitor thread that waits and wakes this glue. Any thread submits and
// dispatches; collector threads complete; only the monitor thread starts, kills and reaps.
#include "runtime/pool.hpp"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "ipc/arena.hpp"
#include "ipc/log.hpp"
#include "runtime/cuda_ipc.hpp"
#include "runtime/cuda_transport.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/supervisor/monitor.hpp"
#include "runtime/supervisor/task_book.hpp"
#include "runtime/supervisor/worker_process.hpp"
#include "runtime/worker_protocol.hpp"

namespace ferry {
namespace {

using supervisor::HandOver;
using supervisor::StartFailure;
using supervisor::TaskBook;
using supervisor::TaskPtr;
using supervisor::WorkerProcess;
using Completion = std::function<void(Pool::Result&&)>;
constexpr auto kSendTimeout = std::chrono::seconds(10);  // the queues are sized never to fill

// What threads other than the monitor may know of a slot (under State::mu; the monitor writes).
struct Published {
  std::optional<TensorQueue> tasks;  // while the worker takes tasks
  std::string kill_request;          // a collector or dispatcher asks the monitor to kill it
  bool started_once = false;         // later starts are restarts
  WorkerStats stats;                 // counters of earlier processes folded in
};

std::string join_names(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

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

std::string describe(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace

struct Pool::State : RemoteEvents {
  PoolOptions opt;
  supervisor::LaunchSpec spec;
  std::vector<std::unique_ptr<WorkerProcess>> workers;  // the monitor thread's alone

  mutable std::mutex mu;
  std::condition_variable changed;  // room for submitters, drain progress for close()
  std::unique_ptr<TaskBook> book;
  std::vector<Published> pub;
  std::vector<std::string> task_names;
  std::uint64_t next_submission = 0;
  bool started = false;   // every worker handshook once: the constructor returned
  bool closing = false;   // submissions refused
  bool stopping = false;  // the monitor stops the workers and returns
  bool closed = false;    // close() finished
  std::string fatal;      // no worker can run: why
  PoolStats totals;       // input tallies

  supervisor::Monitor monitor;
  std::thread monitor_thread;
  std::optional<Error> startup_error;  // monitor thread only
  std::mutex close_mu;                 // one close() at a time

  std::size_t capacity() const {
    std::lock_guard<std::mutex> lock(mu);
    return book->capacity();
  }
  // Slots from workers.size() on are remote (PoolOptions::remote), one per host that joined.
  bool is_remote(int w) const { return w >= static_cast<int>(workers.size()); }
  bool is_stopping() const {
    std::lock_guard<std::mutex> lock(mu);
    return stopping;
  }

  // ---- submission and dispatch (any thread) ------------------------------------------------
  void submit(const std::string& name, Tensors inputs, std::optional<std::size_t> index,
              std::chrono::milliseconds timeout, Completion done) {
    if (inputs.size() > protocol::kMaxTensorsPerTask) {
      throw Error(Errc::invalid_argument,
                  "task '" + name + "' was given " + std::to_string(inputs.size()) +
                      " tensors; a task takes at most " +
                      std::to_string(protocol::kMaxTensorsPerTask) + " (stack or batch them)");
    }
    auto task = std::make_shared<supervisor::Task>();
    task->name = name;
    task->inputs = std::move(inputs);
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
    {
      std::unique_lock<std::mutex> lock(mu);
      const auto it = std::find(task_names.begin(), task_names.end(), name);
      if (it == task_names.end()) {
        throw Error(Errc::invalid_argument,
                    "no task '" + name + "' in the workers (they have: " + join_names(task_names) +
                        "); register it with FERRY_TASK in the worker");
      }
      task->task_index = static_cast<std::uint32_t>(it - task_names.begin());
      auto admissible = [&] { return closing || !fatal.empty() || !book->full(); };
      if (timeout.count() < 0) {
        changed.wait(lock, admissible);
      } else if (!changed.wait_for(lock, timeout, admissible)) {
        throw Error(Errc::timeout, "the pool stayed full (" + std::to_string(book->capacity()) +
                                       " tasks in flight) for " + std::to_string(timeout.count()) +
                                       " ms");
      }
      if (closing) throw Error(Errc::closed, "the pool is closed; task '" + name + "' not run");
      if (!fatal.empty()) throw Error(Errc::worker_lost, fatal);
      task->index = index ? *index : next_submission++;
      book->admit(task, Clock::now());
    }
    dispatch();
  }

  // Sends what the book hands over; each hand-over is decided under the lock, sent outside it.
  void dispatch() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      const std::optional<HandOver> h = book->next_hand_over(Clock::now());
      if (!h) return;
      if (is_remote(h->worker)) {
        const std::string device = pub[h->worker].stats.device;
        lock.unlock();
        send_remote(*h, device);
        continue;
      }
      TensorQueue queue = *pub[h->worker].tasks;  // open workers have one
      const std::string device = workers[h->worker]->device();
      const protocol::TaskEnvelope env{h->task->id, h->attempt, h->task->task_index};
      const bool tally = !h->task->inputs_tallied;  // one hand-over of a task at a time
      lock.unlock();
      try {
        Tensors message;
        message.reserve(h->task->inputs.size() + 1);
        message.push_back(protocol::pack(env));
        message.insert(message.end(), h->task->inputs.begin(), h->task->inputs.end());
        const SendReport sent = queue.send(message, kSendTimeout);
        // Inputs as submitted: counted once, at the first send that went through.
        if (tally) {
          std::lock_guard<std::mutex> relock(mu);
          h->task->inputs_tallied = true;
          const TransferCounts c = sent.counts(1);  // after the envelope
          totals.input_tensors_zero_copy += c.tensors_zero_copy;
          totals.input_bytes_zero_copy += c.bytes_zero_copy;
          totals.input_tensors_copied += c.tensors_copied;
          totals.input_bytes_copied += c.bytes_copied;
        }
      } catch (const Error& e) {
        if (e.code() == Errc::closed || e.code() == Errc::peer_dead) {
          continue;  // the worker is going; its exit hands the task back for a retry
        }
        if (e.code() == Errc::timeout) {
          request_kill(h->worker, "its task queue stayed full for 10 s");
          continue;
        }
        // The inputs cannot travel (bad tensor, no shared memory left): fail this task only.
        hand_over_failed(*h, e, device);
      }
    }
  }

  void hand_over_failed(const HandOver& h, const Error& e, const std::string& device) {
    TaskPtr t;
    {
      std::lock_guard<std::mutex> lock(mu);
      t = book->hand_over_failed(h);
      changed.notify_all();
    }
    if (t) {
      end_task(*t, std::make_exception_ptr(
                       TaskError(e.code(), t->name, t->index, -1, device, -1,
                                 "its inputs could not be handed to a worker: " + e.detail())));
    }
  }

  // A hand-over to a host. A link that fails loses the host (the remote side reports lost(),
  // which hands the task back); inputs the link cannot carry fail this task only.
  void send_remote(const HandOver& h, const std::string& device) {
    try {
      opt.remote->send(h.worker, h.task->id, h.attempt, h.task->name, h.task->inputs);
    } catch (const Error& e) {
      if (e.code() == Errc::invalid_argument) hand_over_failed(h, e, device);
    }
  }

  static void end_task(supervisor::Task& t, std::exception_ptr error, Tensors outputs = {},
                       int worker = -1) {
    t.inputs.clear();
    t.done(t, std::move(error), std::move(outputs), worker);
  }

  // Asks the monitor to kill worker `w` (from a collector or a dispatcher); no more hand-overs.
  void request_kill(int w, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!pub[w].tasks || !pub[w].kill_request.empty()) return;
      pub[w].kill_request = why;
      book->set_open(w, false);
    }
    monitor.rouse();
  }

  // ---- results (a collector thread per worker process) --------------------------------------
  void on_result(int w, Tensors message) {
    protocol::ResultEnvelope env;
    try {
      if (message.empty()) throw Error(Errc::bad_record, "an empty result message");
      env = protocol::unpack_result(message[0]);
    } catch (const Error& e) {
      request_kill(w, "it sent a malformed result (" + e.detail() + ")");
      return;
    }
    TaskPtr t;
    pid_t pid = -1;
    {
      std::lock_guard<std::mutex> lock(mu);
      WorkerStats& ws = pub[w].stats;  // even a stale result was sent
      ws.tensors_zero_copy += env.tensors_zero_copy;
      ws.bytes_zero_copy += env.bytes_zero_copy;
      ws.tensors_copied += env.tensors_copied;
      ws.bytes_copied += env.bytes_copied;
      t = book->complete(w, env.task_id, env.attempt, env.ok, Clock::now());
      pid = pub[w].stats.pid;
      if (t) changed.notify_all();
    }
    if (!t) return;  // stale: that attempt had ended (cancelled, or timed out and retried)
    const std::string& device = workers[w]->device();
    if (env.ok) {
      message.erase(message.begin());
      end_task(*t, nullptr, std::move(message), w);
    } else {
      std::string text = "(no message)";
      try {
        if (message.size() > 1) text = protocol::tensor_text(message[1]);
      } catch (const Error& e) {
        text = e.detail();
      }
      end_task(*t,
               std::make_exception_ptr(
                   TaskError(Errc::task_failed, t->name, t->index, w, device, pid, text)),
               {}, w);
    }
    dispatch();
  }

  // ---- remote slots (RemoteEvents, called from the remote side's threads) --------------------
  int joined(const std::string& name, const std::vector<std::string>& devices,
             std::size_t room) override {
    std::lock_guard<std::mutex> lock(mu);
    if (closing) return -1;
    const int w = book->add_worker(room);
    pub.emplace_back();
    WorkerStats& ws = pub.back().stats;
    ws.id = w;
    ws.device = "host " + name + " (" + join_names(devices) + ")";
    ws.remote = true;
    ws.start = "join";
    log().info("pool: {} joined as slot {}, room for {} tasks", ws.device, w, room);
    return w;
  }

  void ready(int slot) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (closing) return;
      book->set_open(slot, true);
      changed.notify_all();  // the capacity grew: submitters may go on
    }
    dispatch();
  }

  void finished(int slot, std::uint64_t task, std::uint32_t attempt, bool ok, Tensors outputs,
                const std::string& error) override {
    TaskPtr t;
    std::string device;
    {
      std::lock_guard<std::mutex> lock(mu);
      t = book->complete(slot, task, attempt, ok, Clock::now());
      device = pub[slot].stats.device;
      if (t) changed.notify_all();
    }
    if (!t) return;  // stale: that attempt had ended
    if (ok) {
      end_task(*t, nullptr, std::move(outputs), slot);
    } else {
      end_task(*t,
               std::make_exception_ptr(
                   TaskError(Errc::task_failed, t->name, t->index, slot, device, -1, error)),
               {}, slot);
    }
    dispatch();
  }

  void lost(int slot, const std::string& why) override {
    std::vector<TaskPtr> ended;
    std::string device;
    {
      std::lock_guard<std::mutex> lock(mu);
      device = pub[slot].stats.device;
      book->set_open(slot, false);
      ended = book->worker_lost(slot, device + " was lost: " + why);
      book->retire(slot);
      pub[slot].stats.last_exit = why;
      pub[slot].stats.given_up = true;
      if (!stopping) log().warn("pool: {} was lost ({}); its tasks go to the others", device, why);
      changed.notify_all();
    }
    for (auto& t : ended) {
      end_task(*t, std::make_exception_ptr(
                       TaskError(Errc::worker_lost, t->name, t->index, -1, device, -1,
                                 "lost with its worker on all " + std::to_string(t->attempts) +
                                     " attempt(s); the last: " + t->lost_because)));
    }
    dispatch();
  }

  // ---- worker processes (the monitor thread) ------------------------------------------------
  void launch(int w) {
    std::vector<int> others{monitor.fd()};  // a forked child keeps none of the supervisor's links
    for (const auto& x : workers) {
      if (x->pidfd() >= 0) others.push_back(x->pidfd());
      if (x->control_fd() >= 0) others.push_back(x->control_fd());
    }
    if (auto failure = workers[w]->launch(spec, std::move(others), ::getpid())) {
      start_failed(w, *failure);
    }
  }

  void finish_start(int w) {
    WorkerProcess& p = *workers[w];
    std::vector<std::string> names;
    {
      std::lock_guard<std::mutex> lock(mu);
      names = task_names;
    }
    auto failure = p.finish_start(
        spec, names, [this, w](Tensors m) { on_result(w, std::move(m)); },
        [this, w](const Error& e) {
          // A result lost because its worker died goes with the death: the task is retried.
          if (e.code() == Errc::peer_dead) return;
          request_kill(w, "it sent a result the supervisor could not read (" + e.detail() + ")");
        });
    if (failure) return start_failed(w, *failure);
    if (p.phase() != WorkerProcess::Phase::Ready) return;  // woken early
    {
      std::lock_guard<std::mutex> lock(mu);
      if (task_names.empty()) task_names = names;
      Published& x = pub[w];
      x.tasks = p.tasks();
      x.kill_request.clear();
      x.stats.pid = p.pid();
      x.stats.start = start_name(p.started_by());
      if (x.started_once) ++x.stats.restarts;
      x.started_once = true;
      book->set_open(w, true);
    }
    dispatch();
  }

  // The restart policy's answer to a failed start, carried out.
  void start_failed(int w, const StartFailure& f) {
    WorkerProcess& p = *workers[w];
    const supervisor::RestartDecision d = p.after_failed_start(opt.restart, f.fault);
    std::vector<TaskPtr> doomed;
    {
      std::lock_guard<std::mutex> lock(mu);
      pub[w].stats.last_exit = f.message;
      pub[w].stats.given_up = d.give_up;
      if (!d.give_up) {
        log().warn("{}; {}", f.message, d.why);
        return;
      }
      log().error("{}; giving up on worker {}: {}", f.message, w, d.why);
      if (!started) {
        // The pool does not start with a slot it cannot fill: the user's setup is wrong.
        startup_error = Error(Errc::handshake, f.message + " (gave up: " + d.why + ")");
        return;
      }
      const bool any_left = std::any_of(workers.begin(), workers.end(), [](const auto& x) {
        return x->phase() != WorkerProcess::Phase::Failed;
      });
      if (any_left) return;  // the others carry on
      fatal = "no worker can be started: " + f.message + " (gave up: " + d.why + ")";
      doomed = book->take_all();
      changed.notify_all();
    }
    for (auto& t : doomed) {
      end_task(*t, std::make_exception_ptr(
                       TaskError(Errc::worker_lost, t->name, t->index, -1, p.device(), -1, fatal)));
    }
  }

  // A ready worker's process ended: its results are delivered, its tasks retried or failed.
  void exited(int w) {
    WorkerProcess& p = *workers[w];
    const pid_t pid = p.pid();
    {
      std::lock_guard<std::mutex> lock(mu);
      book->set_open(w, false);
      pub[w].tasks.reset();
    }
    const std::string how = p.reap();  // joins the collector: every earlier result is in
    // Views on the worker's memory are moved or marked now rather than at the next check.
    notify_peer_exit(pid);
    std::vector<TaskPtr> lost;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!stopping) log().warn("worker {} ({}, pid {}) {}", w, p.device(), pid, how);
      lost = book->worker_lost(w, "worker " + std::to_string(w) + " (" + p.device() + ", pid " +
                                      std::to_string(pid) + ") " + how);
      Published& x = pub[w];
      x.kill_request.clear();
      x.stats.last_exit = how;
      x.stats.pid = -1;
      changed.notify_all();
    }
    for (auto& t : lost) {
      end_task(*t, std::make_exception_ptr(
                       TaskError(Errc::worker_lost, t->name, t->index, -1, p.device(), -1,
                                 "lost with its worker on all " + std::to_string(t->attempts) +
                                     " attempt(s); the last: " + t->lost_because)));
    }
    // The dead worker's leases on the supervisor's memory come back now, not on the next send.
    if (Ledger* ledger = Arena::local().existing_ledger()) ledger->reclaim(true);
    p.after_exit();
  }

  // Kills asked for by other threads, and workers whose task ran past task_timeout.
  void kill_due() {
    std::vector<std::pair<int, std::string>> kills;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (std::size_t w = 0; w < pub.size(); ++w) {
        if (!pub[w].kill_request.empty())
          kills.emplace_back(static_cast<int>(w), pub[w].kill_request);
      }
      for (const auto& [w, t] : book->overdue(Clock::now(), opt.task_timeout)) {
        if (!pub[w].tasks || !workers[w]->kill_reason().empty()) continue;
        ++pub[w].stats.timeouts;
        book->set_open(w, false);
        kills.emplace_back(w, "task '" + t->name + "' (input " + std::to_string(t->index) +
                                  ") ran past its timeout of " +
                                  std::to_string(opt.task_timeout.count()) + " ms");
      }
    }
    for (const auto& [w, why] : kills) workers[w]->kill(why);
  }

  // One round of the monitor: wait for something to happen, then act on all of it.
  void round() {
    using Phase = WorkerProcess::Phase;
    std::vector<pollfd> watch;
    std::vector<int> owner;  // worker of each watched fd
    auto until = Clock::now() + std::chrono::milliseconds(250);
    for (std::size_t w = 0; w < workers.size(); ++w) {
      const WorkerProcess& p = *workers[w];
      if (p.phase() == Phase::Ready || p.phase() == Phase::Starting) {
        watch.push_back({p.pidfd(), POLLIN, 0});
        owner.push_back(static_cast<int>(w));
      }
      if (p.phase() == Phase::Starting) {
        watch.push_back({p.control_fd(), POLLIN, 0});
        owner.push_back(static_cast<int>(w));
        until = std::min(until, p.start_deadline());
      }
      if (p.phase() == Phase::Down) until = std::min(until, p.restart_at());
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto t = book->next_deadline(opt.task_timeout)) until = std::min(until, *t);
    }
    monitor.wait(watch, until);

    std::vector<bool> ended(workers.size()), answered(workers.size());
    for (std::size_t i = 0; i < watch.size(); ++i) {
      if (!watch[i].revents) continue;
      const int w = owner[i];
      (watch[i].fd == workers[w]->pidfd() ? ended : answered)[w] = true;
    }
    for (std::size_t i = 0; i < workers.size(); ++i) {
      const int w = static_cast<int>(i);
      WorkerProcess& p = *workers[i];
      // An answer already sent is read before a death is looked at: the worker did start.
      if (p.phase() == Phase::Starting && answered[i]) finish_start(w);
      if (p.phase() == Phase::Starting && (ended[i] || Clock::now() >= p.start_deadline())) {
        start_failed(w, p.start_failed(!ended[i], spec));
      } else if (p.phase() == Phase::Ready && ended[i]) {
        exited(w);
      }
    }
    kill_due();
    const bool restarting = !is_stopping();
    for (std::size_t i = 0; i < workers.size() && restarting; ++i) {
      const WorkerProcess& p = *workers[i];
      if (p.phase() == Phase::Down && p.restart_at() <= Clock::now()) launch(static_cast<int>(i));
    }
    dispatch();
  }

  // Stop token (a closed task queue), a grace period, then SIGKILL; every process reaped.
  void stop_workers() {
    for (auto& p : workers) p->request_stop();
    const auto deadline = Clock::now() + opt.stop_timeout;
    for (auto& p : workers) {
      if (p->pid() <= 0) continue;
      pollfd fd{p->pidfd(), POLLIN, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (::poll(&fd, 1, static_cast<int>(std::max<long long>(left.count(), 0))) != 1) {
        log().warn("worker {} (pid {}) did not stop within {} ms; killing it", p->id(), p->pid(),
                   opt.stop_timeout.count());
        ::kill(p->pid(), SIGKILL);
      }
    }
    for (auto& p : workers) {
      const pid_t pid = p->pid();
      p->mark_stopped();
      if (pid > 0) notify_peer_exit(pid);
    }
    std::lock_guard<std::mutex> lock(mu);
    for (auto& x : pub) {
      x.tasks.reset();
      x.stats.pid = -1;
    }
  }

  // Ends every task with `why` and refuses new ones: the pool cannot go on.
  void break_pool(const std::string& why) {
    std::vector<TaskPtr> doomed;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (fatal.empty()) fatal = why;
      doomed = book->take_all();
      changed.notify_all();
    }
    for (auto& t : doomed) {
      end_task(*t, std::make_exception_ptr(
                       TaskError(Errc::worker_lost, t->name, t->index, -1, "", -1, why)));
    }
  }

  void run_monitor(std::promise<void> started_promise) {
    using Phase = WorkerProcess::Phase;
    bool told = false;
    try {
      for (std::size_t w = 0; w < workers.size(); ++w) launch(static_cast<int>(w));
      // The first start follows the restart policy too: until every worker is ready, or one is
      // given up (then the pool does not start, and says why).
      auto settled = [&] {
        return std::all_of(workers.begin(), workers.end(),
                           [](const auto& p) { return p->phase() == Phase::Ready; });
      };
      while (!startup_error && !settled()) round();
      if (startup_error) {
        stop_workers();
        told = true;
        started_promise.set_exception(std::make_exception_ptr(*startup_error));
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        started = true;
      }
      told = true;
      started_promise.set_value();
      while (!is_stopping()) round();
      stop_workers();
    } catch (...) {
      // Nothing escapes this thread: an exception here becomes the pool's error.
      const std::string what = describe(std::current_exception());
      log().error("the pool's monitor failed: {}", what);
      try {
        if (told) break_pool("the pool's monitor failed: " + what);
        stop_workers();
      } catch (...) {
        log().error("stopping the workers after that failed too");
      }
      if (!told) started_promise.set_exception(std::current_exception());
    }
  }

  void close(Shutdown how) {
    std::lock_guard<std::mutex> once(close_mu);
    std::vector<TaskPtr> cancelled;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (closed) return;
      closing = true;
      changed.notify_all();
      if (how == Shutdown::Drain) {
        changed.wait_for(lock, opt.drain_timeout, [&] { return book->empty(); });
      }
      cancelled = book->take_all();
      stopping = true;
    }
    const std::string why = how == Shutdown::Drain
                                ? "the pool closed and its drain_timeout passed first"
                                : "the pool was closed (Shutdown::Cancel) first";
    for (auto& t : cancelled) {
      end_task(*t, std::make_exception_ptr(TaskError(Errc::closed, t->name, t->index, t->worker, "",
                                                     -1, "not finished: " + why)));
    }
    // No remote event comes after this: the hosts are told, their threads joined.
    if (opt.remote) opt.remote->stop();
    monitor.rouse();
    if (monitor_thread.joinable()) monitor_thread.join();
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
  }
};

// ---- Pool ------------------------------------------------------------------------------------

namespace {

// PoolOptions::shared as the workers will get it: CPU tensors moved into shared memory in place
// (the caller's own tensors with them), CUDA ones checked against every worker's device.
NamedTensors shared_for(const NamedTensors& shared,
                        const std::vector<std::unique_ptr<WorkerProcess>>& workers) {
  constexpr std::size_t kMaxShared = 16384;  // a quarter of the arena's leases, per worker
  if (shared.size() > kMaxShared) {
    throw Error(Errc::invalid_argument, "PoolOptions::shared holds " +
                                            std::to_string(shared.size()) + " tensors, more than " +
                                            std::to_string(kMaxShared) +
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

Pool::Pool(PoolOptions options) : s_(std::make_shared<State>()) {
  State& s = *s_;
  s.opt = std::move(options);
  PoolOptions& o = s.opt;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.workers < 0) {
    throw Error(Errc::invalid_argument,
                "workers = " + std::to_string(o.workers) + " is negative; use 0 for one per core");
  }
  if (o.devices.empty()) o.devices.assign(o.workers == 0 ? cores : o.workers, "cpu");
  if (o.max_inflight_per_worker < 1 || o.max_inflight_per_worker > 1000) {
    throw Error(Errc::invalid_argument,
                "max_inflight_per_worker = " + std::to_string(o.max_inflight_per_worker) +
                    " is outside 1..1000");
  }
  if (o.max_retries < 0) {
    throw Error(Errc::invalid_argument,
                "max_retries = " + std::to_string(o.max_retries) + " is negative");
  }
  supervisor::validate(o.restart);
  const int n = static_cast<int>(o.devices.size());
  s.pub.resize(o.devices.size());
  for (int i = 0; i < n; ++i) {
    s.workers.push_back(std::make_unique<WorkerProcess>(i, normalise_device(o.devices[i])));
    s.pub[i].stats.id = i;
    s.pub[i].stats.device = s.workers.back()->device();
  }
  s.book = std::make_unique<TaskBook>(n, o.max_inflight_per_worker, o.max_retries);
  s.spec.start = o.start;
  s.spec.executable = o.worker_executable;
  s.spec.args = o.worker_args;
  s.spec.threads = o.threads_per_worker > 0 ? o.threads_per_worker : std::max(1, cores / n);
  s.spec.queue_capacity = static_cast<std::uint32_t>(o.max_inflight_per_worker) *
                          static_cast<std::uint32_t>(protocol::kMaxTensorsPerTask + 1);
  s.spec.start_timeout = o.start_timeout;
  s.spec.config = o.config;
  s.spec.require_tasks = o.require_tasks;
  s.spec.shared = shared_for(o.shared, s.workers);
  s.spec.queue_capacity += static_cast<std::uint32_t>(s.spec.shared.size());
  if (o.start == Start::Fork) resolve_start(Start::Fork);  // refuse now, before any thread

  std::promise<void> started;
  std::future<void> ready = started.get_future();
  s.monitor_thread = std::thread(
      [state = s_, p = std::move(started)]() mutable { state->run_monitor(std::move(p)); });
  try {
    ready.get();
  } catch (...) {
    s.monitor_thread.join();
    throw;
  }
  if (s.opt.remote) {
    try {
      s.opt.remote->start(s);
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
                                  std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<Tensors>>();
  std::future<Tensors> f = promise->get_future();
  s_->submit(task, std::move(inputs), std::nullopt, timeout, [promise](Result&& r) {
    if (r.error) {
      promise->set_exception(r.error);
    } else {
      promise->set_value(std::move(r.outputs));
    }
  });
  return f;
}

void Pool::submit(const std::string& task, Tensors inputs, std::function<void(Result&&)> done,
                  std::chrono::milliseconds timeout) {
  s_->submit(task, std::move(inputs), std::nullopt, timeout, std::move(done));
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

Tensors Pool::Result::get() const {
  if (error) std::rethrow_exception(error);
  return outputs;
}

struct Pool::Results::State {
  std::shared_ptr<Pool::State> pool;
  std::string task;
  std::size_t count = 0;
  std::function<Tensors(std::size_t)> make;
  std::size_t next_input = 0;
  std::optional<Tensors> held;  // made but not yet admitted (the pool was full)
  std::size_t outstanding = 0;  // submitted, not yet returned by next()
  std::mutex mu;
  std::condition_variable arrived;
  std::deque<Result> ready;
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
  st->make = std::move(make);
  return Results(std::move(st));
}

std::optional<Pool::Result> Pool::Results::next() {
  State& st = *s_;
  const std::size_t window = st.pool->capacity();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(st.mu);
      if (!st.ready.empty()) {
        Result r = std::move(st.ready.front());
        st.ready.pop_front();
        --st.outstanding;
        return r;
      }
      if (st.outstanding == 0 && st.next_input == st.count) return std::nullopt;
    }
    // Top up without blocking while results are on their way; block only when none are. An
    // input that found no room is kept for the next round rather than made again.
    while (st.next_input < st.count && st.outstanding < window) {
      const std::size_t i = st.next_input;
      if (!st.held) st.held = st.make(i);
      std::weak_ptr<State> weak = s_;
      try {
        st.pool->submit(st.task, *st.held, i,
                        st.outstanding > 0 ? std::chrono::milliseconds(0) : kForever,
                        [weak](Result&& r) {
                          if (auto s = weak.lock()) {
                            std::lock_guard<std::mutex> lock(s->mu);
                            s->ready.push_back(std::move(r));
                            s->arrived.notify_all();
                          }
                        });
      } catch (const Error& e) {
        if (e.code() != Errc::timeout || st.outstanding == 0) throw;
        break;
      }
      st.held.reset();
      std::lock_guard<std::mutex> lock(st.mu);
      ++st.next_input;
      ++st.outstanding;
    }
    std::unique_lock<std::mutex> lock(st.mu);
    st.arrived.wait(lock, [&] { return !st.ready.empty(); });
  }
}

void Pool::close() {
  s_->close(s_->opt.shutdown);
}
void Pool::close(Shutdown how) {
  s_->close(how);
}

std::vector<std::string> Pool::tasks() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->task_names;
}
std::size_t Pool::size() const noexcept {
  return s_->workers.size();
}
std::size_t Pool::capacity() const noexcept {
  return s_->capacity();
}

std::vector<pid_t> Pool::worker_pids() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  std::vector<pid_t> pids;
  for (std::size_t w = 0; w < s_->workers.size(); ++w) pids.push_back(s_->pub[w].stats.pid);
  return pids;
}

PoolStats Pool::stats() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  PoolStats out = s_->totals;
  const supervisor::TaskBook& book = *s_->book;
  out.submitted = book.admitted();
  out.completed = book.completed();
  out.failed = book.failed();
  out.retried = book.retried();
  for (std::size_t w = 0; w < s_->pub.size(); ++w) {
    const Published& x = s_->pub[w];
    WorkerStats s = x.stats;
    const supervisor::WorkerCounts& c = book.counts(static_cast<int>(w));
    s.tasks_done = c.done;
    s.tasks_failed = c.failed;
    s.tasks_lost = c.lost;
    out.workers.push_back(std::move(s));
  }
  return out;
}

}  // namespace ferry
