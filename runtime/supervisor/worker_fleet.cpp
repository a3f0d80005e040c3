#include "runtime/supervisor/worker_fleet.hpp"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "ipc/arena.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "runtime/peer_exit.hpp"
#include "runtime/task_error.hpp"

namespace ferry::supervisor {
namespace {

using Phase = WorkerProcess::Phase;

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

WorkerFleet::WorkerFleet(Board& board, Dispatcher& dispatcher, ResultCollector& collector,
                         const std::vector<std::string>& devices)
    : board_(board), dispatcher_(dispatcher), collector_(collector) {
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const int id = static_cast<int>(i);
    workers_.push_back(std::make_unique<WorkerProcess>(id, devices[i]));
    WorkerStats ws;
    ws.id = id;
    ws.device = workers_.back()->device();
    auto slot = std::make_unique<LocalSlot>(std::move(ws));
    board_.here.push_back(slot.get());
    board_.slots.push_back(std::move(slot));
  }
}

void WorkerFleet::launch(int w) {
  std::vector<int> others{board_.monitor.fd()};  // a forked child keeps none of our links
  for (const auto& x : workers_) {
    if (x->pidfd() >= 0) others.push_back(x->pidfd());
    if (x->control_fd() >= 0) others.push_back(x->control_fd());
  }
  if (auto failure = workers_[w]->launch(opt_.spec, std::move(others), ::getpid())) {
    start_failed(w, *failure);
  }
}

void WorkerFleet::finish_start(int w) {
  WorkerProcess& p = *workers_[w];
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    names = board_.task_names;
  }
  CollectorGate& gate = board_.here[w]->gate;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    gate.closing = false;  // the last process's collector has been joined
  }
  Collecting c;
  c.on_result = [this, w](Tensors m) {
    if (auto why = collector_.on_result(w, std::move(m))) board_.request_kill(w, *why);
  };
  c.on_unreadable = [this, w](const Error& e) {
    // A result lost because its worker died goes with the death: the task is retried.
    if (e.code() == Errc::peer_dead) return;
    board_.request_kill(w, "it sent a result the supervisor could not read (" + e.detail() + ")");
  };
  c.until_needed = [this, w, &gate] {
    std::unique_lock<std::mutex> lock(board_.mu);
    // A closing pool drains whatever it holds, also the results of callers that stopped
    // waiting without saying so (a Python frame kept by a traceback holds its Call).
    const auto needed = [&] {
      return gate.closing || board_.life.closing() || board_.book.needs_collector(w);
    };
    if (needed()) return;
    gate.parked = true;
    gate.wake.wait(lock, needed);
    gate.parked = false;
  };
  c.closing = [this, &gate] {
    std::lock_guard<std::mutex> lock(board_.mu);
    gate.closing = true;
    gate.wake.notify_one();
  };
  c.turn = &gate.turn;
  auto failure = p.finish_start(opt_.spec, names, std::move(c));
  if (failure) return start_failed(w, *failure);
  if (p.phase() != Phase::Ready) return;  // woken early
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    if (board_.task_names.empty()) board_.task_names = names;
    LocalSlot& x = *board_.here[w];
    x.open(*p.tasks(), *p.results());
    x.kill_request.clear();
    x.stats.pid = p.pid();
    x.stats.start = start_name(p.started_by());
    if (x.started_once && !x.retired) ++x.stats.restarts;  // a replacement is no restart
    x.started_once = true;
    x.retired = false;
    board_.book.begin_life(w);
    board_.book.set_open(w, true);
  }
  dispatcher_.dispatch();
}

// The restart policy's answer to a failed start, carried out.
void WorkerFleet::start_failed(int w, const StartFailure& f) {
  WorkerProcess& p = *workers_[w];
  const RestartDecision d = p.after_failed_start(opt_.restart, f.fault);
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    WorkerStats& ws = board_.here[w]->stats;
    ws.last_exit = f.message;
    ws.given_up = d.give_up;
    if (!d.give_up) {
      // Before the pool has started, a retry is held: should the slot be given up, the error
      // the constructor throws says it, and the retries' lines would say it again.
      if (board_.life.started()) {
        log().warn("{}; {}", f.message, d.why);
      } else {
        held_retries_.push_back(f.message + "; " + d.why);
      }
      return;
    }
    if (!board_.life.started()) {
      // The pool does not start with a slot it cannot fill: the user's setup is wrong. The
      // constructor throws this; a log line would only say it a second time.
      log().debug("{}; giving up on worker {}: {}", f.message, w, d.why);
      startup_error_ = Error(Errc::handshake, f.message + " (gave up: " + d.why + ")");
      return;
    }
    const bool any_left = std::any_of(workers_.begin(), workers_.end(),
                                      [](const auto& x) { return x->phase() != Phase::Failed; });
    if (any_left) {  // the others carry on
      log().error("{}; giving up on worker {}: {}", f.message, w, d.why);
      return;
    }
    // The last one: every task fails with this, and the pool's error is it.
    log().debug("{}; giving up on worker {}: {}", f.message, w, d.why);
  }
  board_.fail_every_task("no worker can be started: " + f.message + " (gave up: " + d.why + ")",
                         p.device());
}

// A ready worker's process ended: its results are delivered, its tasks retried or failed.
void WorkerFleet::exited(int w) {
  WorkerProcess& p = *workers_[w];
  const pid_t pid = p.pid();
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    board_.book.set_open(w, false);
    board_.here[w]->tasks.reset();
    board_.here[w]->results.reset();
  }
  // A process that retired after its tasks per life and then exited by itself is replaced, not
  // restarted: no warning, and its (answered) tasks are none to retry.
  const bool retiring = p.retiring() && p.kill_reason().empty();
  const std::string how = p.reap();  // joins the collector: every earlier result is in
  // Views on the worker's memory are moved or marked now rather than at the next check.
  notify_peer_exit(pid);
  std::vector<TaskPtr> lost;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    const bool retired = retiring && how == describe_wait_status(0);  // exit(kWorkerStopped)
    if (retired) {
      log().debug("worker {} ({}, pid {}) ran its tasks per life and was replaced", w, p.device(),
                  pid);
    } else if (!board_.life.stopping()) {
      log().warn("worker {} ({}, pid {}) {}", w, p.device(), pid, how);
    }
    lost = board_.book.worker_lost(w, "worker " + std::to_string(w) + " (" + p.device() + ", pid " +
                                          std::to_string(pid) + ") " + how);
    LocalSlot& x = *board_.here[w];
    x.kill_request.clear();
    x.stats.last_exit = how;
    x.stats.pid = -1;
    x.retired = retired;
    if (retired) ++x.stats.replaced;
    board_.changed.notify_all();
  }
  end_lost(lost, p.device());
  // The dead worker's leases on the supervisor's memory come back now, not on the next send.
  if (Ledger* ledger = Arena::local().existing_ledger()) ledger->reclaim(true);
  p.after_exit();
}

// Kills asked for by other threads, and workers whose task ran past task_timeout.
void WorkerFleet::kill_due() {
  std::vector<std::pair<int, std::string>> kills;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    for (std::size_t w = 0; w < board_.here.size(); ++w) {
      const LocalSlot& x = *board_.here[w];
      if (!x.kill_request.empty()) kills.emplace_back(static_cast<int>(w), x.kill_request);
    }
    for (const auto& [w, t] : board_.book.overdue(Clock::now(), opt_.task_timeout)) {
      LocalSlot& x = *board_.here[w];
      if (!x.tasks || !workers_[w]->kill_reason().empty()) continue;
      ++x.stats.timeouts;
      board_.book.set_open(w, false);
      kills.emplace_back(w, "task '" + t->name + "' (input " + std::to_string(t->index) +
                                ") ran past its timeout of " +
                                std::to_string(opt_.task_timeout.count()) + " ms");
    }
  }
  for (const auto& [w, why] : kills) workers_[w]->kill(why);
}

// Workers whose process has run its tasks per life (PoolOptions::max_tasks_per_worker), every
// result in: each gets its stop token, and one that does not exit in time is killed.
void WorkerFleet::retire_due() {
  std::vector<int> spent;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    for (std::size_t i = 0; i < board_.here.size(); ++i) {
      const int w = static_cast<int>(i);
      const WorkerProcess& p = *workers_[i];
      if (p.phase() != Phase::Ready || p.retiring() || !board_.book.life_spent(w)) continue;
      board_.book.set_open(w, false);
      spent.push_back(w);
    }
  }
  for (int w : spent) workers_[w]->retire(opt_.stop_timeout);
  for (auto& p : workers_) {
    if (p->phase() == Phase::Ready && p->retiring() && Clock::now() >= p->retire_deadline()) {
      p->kill("it did not exit within " + std::to_string(opt_.stop_timeout.count()) +
              " ms of its stop token, after its tasks per life");
    }
  }
}

// One round of the monitor: wait for something to happen, then act on all of it.
void WorkerFleet::round() {
  std::vector<pollfd> watch;
  std::vector<int> owner;  // worker of each watched fd
  auto until = Clock::now() + std::chrono::milliseconds(250);
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    const WorkerProcess& p = *workers_[w];
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
    if (p.phase() == Phase::Ready && p.retiring()) until = std::min(until, p.retire_deadline());
  }
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    if (auto t = board_.book.next_deadline(opt_.task_timeout)) until = std::min(until, *t);
  }
  board_.monitor.wait(watch, until);

  std::vector<bool> ended(workers_.size()), answered(workers_.size());
  for (std::size_t i = 0; i < watch.size(); ++i) {
    if (!watch[i].revents) continue;
    const int w = owner[i];
    (watch[i].fd == workers_[w]->pidfd() ? ended : answered)[w] = true;
  }
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    const int w = static_cast<int>(i);
    WorkerProcess& p = *workers_[i];
    // An answer already sent is read before a death is looked at: the worker did start.
    if (p.phase() == Phase::Starting && answered[i]) finish_start(w);
    if (p.phase() == Phase::Starting && (ended[i] || Clock::now() >= p.start_deadline())) {
      start_failed(w, p.start_failed(!ended[i], opt_.spec));
    } else if (p.phase() == Phase::Ready && ended[i]) {
      exited(w);
    }
  }
  kill_due();
  retire_due();
  const bool restarting = !board_.is_stopping();
  for (std::size_t i = 0; i < workers_.size() && restarting; ++i) {
    const WorkerProcess& p = *workers_[i];
    if (p.phase() == Phase::Down && p.restart_at() <= Clock::now()) launch(static_cast<int>(i));
  }
  dispatcher_.dispatch();
}

// Stop token (a closed task queue), a grace period, then SIGKILL; or SIGKILL at once
// (Shutdown::Kill). Every process reaped.
void WorkerFleet::stop_workers() {
  bool kill_now = false;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    kill_now = board_.life.kill_asked();
  }
  if (kill_now) {
    for (auto& p : workers_) {
      if (p->pid() > 0) ::kill(p->pid(), SIGKILL);
    }
  }
  for (auto& p : workers_) p->request_stop();
  const auto deadline = Clock::now() + opt_.stop_timeout;
  for (auto& p : workers_) {
    if (p->pid() <= 0 || kill_now) continue;
    pollfd fd{p->pidfd(), POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (::poll(&fd, 1, static_cast<int>(std::max<long long>(left.count(), 0))) != 1) {
      log().warn("worker {} (pid {}) did not stop within {} ms; killing it", p->id(), p->pid(),
                 opt_.stop_timeout.count());
      ::kill(p->pid(), SIGKILL);
    }
  }
  for (auto& p : workers_) {
    const pid_t pid = p->pid();
    p->mark_stopped();
    if (pid > 0) notify_peer_exit(pid);
  }
  std::lock_guard<std::mutex> lock(board_.mu);
  for (LocalSlot* x : board_.here) {
    x->tasks.reset();
    x->results.reset();
    x->stats.pid = -1;
  }
}

void WorkerFleet::run(std::promise<void> started) {
  bool told = false;
  try {
    for (std::size_t w = 0; w < workers_.size(); ++w) launch(static_cast<int>(w));
    // The first start follows the restart policy too: until every worker is ready, or one is
    // given up (then the pool does not start, and says why).
    auto settled = [&] {
      return std::all_of(workers_.begin(), workers_.end(),
                         [](const auto& p) { return p->phase() == Phase::Ready; });
    };
    while (!startup_error_ && !settled()) round();
    // Retries held while starting: news if the pool started anyway, else its error says them.
    for (const std::string& retry : held_retries_) {
      if (startup_error_) {
        log().debug("{}", retry);
      } else {
        log().warn("{}", retry);
      }
    }
    held_retries_.clear();
    if (startup_error_) {
      stop_workers();
      told = true;
      started.set_exception(std::make_exception_ptr(*startup_error_));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(board_.mu);
      board_.life.started_running();
    }
    told = true;
    started.set_value();
    while (!board_.is_stopping()) round();
    stop_workers();
  } catch (...) {
    // Nothing escapes this thread: an exception here becomes the pool's error.
    const std::string what = describe(std::current_exception());
    log().error("the pool's monitor failed: {}", what);
    try {
      if (told) board_.fail_every_task("the pool's monitor failed: " + what, "");
      stop_workers();
    } catch (...) {
      log().error("stopping the workers after that failed too");
    }
    if (!told) started.set_exception(std::current_exception());
  }
}

}  // namespace ferry::supervisor
