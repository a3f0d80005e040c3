#include "runtime/pool.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "ipc/arena.hpp"
#include "ipc/control_socket.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "runtime/cuda_ipc.hpp"
#include "runtime/cuda_transport.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/worker_protocol.hpp"

namespace ferry {
namespace {

using Completion = std::function<void(Pool::Result&&)>;
constexpr int kMaxStartFailures = 5;  // in a row, before a worker slot is given up
constexpr auto kSendTimeout = std::chrono::seconds(10);  // the queues are sized never to fill

struct Task {
  std::uint64_t id = 0;
  std::uint32_t task_index = 0;
  std::string name;
  std::size_t index = 0;
  Tensors inputs;  // kept until the task ends: a retry sends them again
  Completion done;
  std::uint32_t attempts = 0;  // hand-overs to a worker so far
  int worker = -1;             // slot holding it; -1 while pending
  int last_worker = -1;        // where the last attempt was lost, avoided for the retry
  Clock::time_point submitted;
  std::string lost_because;
};

// A worker slot's life (every transition under State::mu; only the monitor thread starts and
// reaps processes):
//   Down --respawn due--> Starting --handshake ok--> Ready --process exits--> Down
//   Starting --handshake fails--> Down, with back-off; kMaxStartFailures in a row --> Failed
//   any --close()--> Stopped
enum class SlotState { Down, Starting, Ready, Failed, Stopped };

struct Slot {
  int id = 0;
  std::string device;
  SlotState state = SlotState::Down;
  pid_t pid = -1;
  UniqueFd pidfd, control;
  std::optional<TensorQueue> tasks, results;
  std::thread collector;
  std::vector<std::uint64_t> inflight;  // hand-over order: a worker runs its queue in order
  Clock::time_point head_since;         // when inflight.front() could start running
  std::string kill_reason;              // set when the supervisor kills the process
  int start_failures = 0;
  Clock::time_point respawn_at;
  WorkerStats stats;                        // counters of earlier processes folded in
  protocol::ResultEnvelope process_counts;  // the current process's transport counters
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

}  // namespace

struct Pool::State {
  PoolOptions opt;
  std::string executable;  // for spawn, found on first need
  int threads = 1;

  mutable std::mutex mu;
  std::condition_variable changed;  // room for submitters, drain progress for close()
  std::vector<std::unique_ptr<Slot>> slots;
  std::unordered_map<std::uint64_t, std::shared_ptr<Task>> tasks;  // admitted, not ended
  std::deque<std::shared_ptr<Task>> pending;                       // admitted, not handed over
  std::vector<std::string> task_names;
  std::uint64_t next_id = 1, next_submission = 0;
  bool closing = false;   // submissions refused
  bool stopping = false;  // the monitor stops the workers and returns
  bool closed = false;    // close() finished
  std::string fatal;      // no worker can be started: why
  PoolStats totals;

  UniqueFd wake;  // eventfd: rouses the monitor
  std::thread monitor;
  std::mutex close_mu;  // one close() at a time

  std::size_t capacity() const {
    return slots.size() * static_cast<std::size_t>(opt.max_inflight_per_worker);
  }
  void rouse() const {
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake.get(), &one, sizeof one);
  }

  // ---- submission -------------------------------------------------------------------------
  void submit(const std::string& name, Tensors inputs, std::optional<std::size_t> index,
              std::chrono::milliseconds timeout, Completion done) {
    if (inputs.size() > protocol::kMaxTensorsPerTask) {
      throw Error(Errc::invalid_argument,
                  "task '" + name + "' was given " + std::to_string(inputs.size()) +
                      " tensors; a task takes at most " +
                      std::to_string(protocol::kMaxTensorsPerTask) + " (stack or batch them)");
    }
    auto task = std::make_shared<Task>();
    task->name = name;
    task->inputs = std::move(inputs);
    task->done = std::move(done);
    {
      std::unique_lock<std::mutex> lock(mu);
      const auto it = std::find(task_names.begin(), task_names.end(), name);
      if (it == task_names.end()) {
        throw Error(Errc::invalid_argument,
                    "no task '" + name + "' in the workers (they have: " + join_names(task_names) +
                        "); register it with FERRY_TASK in the worker");
      }
      task->task_index = static_cast<std::uint32_t>(it - task_names.begin());
      auto admissible = [&] { return closing || !fatal.empty() || tasks.size() < capacity(); };
      if (timeout.count() < 0) {
        changed.wait(lock, admissible);
      } else if (!changed.wait_for(lock, timeout, admissible)) {
        throw Error(Errc::timeout, "the pool stayed full (" + std::to_string(capacity()) +
                                       " tasks in flight) for " + std::to_string(timeout.count()) +
                                       " ms");
      }
      if (closing) throw Error(Errc::closed, "the pool is closed; task '" + name + "' not run");
      if (!fatal.empty()) throw Error(Errc::worker_lost, fatal);
      task->id = next_id++;
      task->index = index ? *index : next_submission++;
      task->submitted = Clock::now();
      tasks.emplace(task->id, task);
      pending.push_back(task);
      ++totals.submitted;
    }
    dispatch();
  }

  // How a task's inputs travel to a worker on `device`, counted at their first hand-over: arena
  // tensors and CUDA tensors the worker can open by handle go zero-copy, the rest is copied.
  void tally_inputs(const Task& task, const std::string& device) {
    for (const auto& t : task.inputs) {
      const auto bytes = static_cast<std::uint64_t>(t.defined() ? t.nbytes() : 0);
      const bool in_place =
          is_shared(t) || (t.defined() && t.is_cuda() && device == t.device().str() &&
                           !detail::is_cuda_received(t));
      if (in_place) {
        ++totals.input_tensors_zero_copy;
        totals.input_bytes_zero_copy += bytes;
      } else {
        ++totals.input_tensors_copied;
        totals.input_bytes_copied += bytes;
      }
    }
  }

  // Hands pending tasks to workers with room. Any thread may call it; each hand-over is
  // decided under the lock and sent outside it.
  void dispatch() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      if (pending.empty()) return;
      const std::shared_ptr<Task> task = pending.front();
      Slot* best = nullptr;
      for (auto& sp : slots) {
        Slot& s = *sp;
        if (s.state != SlotState::Ready || !s.kill_reason.empty() ||
            s.inflight.size() >= static_cast<std::size_t>(opt.max_inflight_per_worker)) {
          continue;
        }
        // Least loaded first; a retry avoids the worker it was lost on when it can.
        auto rank = [&](const Slot& x) {
          return std::make_pair(x.id == task->last_worker, x.inflight.size());
        };
        if (!best || rank(s) < rank(*best)) best = &s;
      }
      if (!best) return;
      pending.pop_front();
      task->worker = best->id;
      ++task->attempts;
      if (best->inflight.empty()) best->head_since = Clock::now();
      best->inflight.push_back(task->id);
      if (task->attempts == 1) tally_inputs(*task, best->device);
      TensorQueue queue = *best->tasks;
      const protocol::TaskEnvelope env{task->id, task->attempts, task->task_index};
      Slot& slot = *best;
      lock.unlock();

      try {
        Tensors message;
        message.reserve(task->inputs.size() + 1);
        message.push_back(protocol::pack(env));
        message.insert(message.end(), task->inputs.begin(), task->inputs.end());
        queue.send(message, kSendTimeout);
      } catch (const Error& e) {
        if (e.code() == Errc::closed || e.code() == Errc::peer_dead) {
          continue;  // the worker is going; its exit hands the task back for a retry
        }
        if (e.code() == Errc::timeout) {
          kill_worker(slot, "its task queue stayed full for 10 s");
          continue;
        }
        // The inputs cannot travel (bad tensor, no shared memory left): fail this task only.
        std::unique_lock<std::mutex> relock(mu);
        if (task->worker != slot.id || task->attempts != env.attempt) continue;
        auto& in = slot.inflight;
        in.erase(std::remove(in.begin(), in.end(), task->id), in.end());
        tasks.erase(task->id);
        ++totals.failed;
        changed.notify_all();
        relock.unlock();
        finish(*task, std::make_exception_ptr(
                          TaskError(e.code(), task->name, task->index, -1, slot.device, -1,
                                    "its inputs could not be handed to a worker: " + e.detail())));
      }
    }
  }

  void finish(Task& task, std::exception_ptr error, Tensors outputs = {}, int worker = -1) {
    Result r;
    r.index = task.index;
    r.outputs = std::move(outputs);
    r.error = std::move(error);
    r.latency = Clock::now() - task.submitted;
    r.worker = worker;
    task.inputs.clear();
    task.done(std::move(r));
  }

  // Kills a live worker on the supervisor's decision; its exit is then handled like a crash.
  void kill_worker(Slot& s, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (s.state != SlotState::Ready || !s.kill_reason.empty()) return;
    s.kill_reason = "killed by the supervisor: " + why;
    log().warn("worker {} ({}, pid {}) {}", s.id, s.device, s.pid, s.kill_reason);
    ::kill(s.pid, SIGKILL);
  }

  // ---- results (one collector thread per worker process) ----------------------------------
  void collect(Slot& s, TensorQueue results) {
    for (;;) {
      Tensors message;
      try {
        message = results.recv(kForever);  // ends on close() or when the worker has exited
      } catch (const Error& e) {
        if (e.code() == Errc::closed) return;
        if (e.code() == Errc::peer_dead && results.size() == 0) return;
        // The message is gone, and its task with it unless the worker is killed and the task
        // retried; a dead worker's unreadable leftovers end the same way.
        kill_worker(s, "it sent a result the supervisor could not read (" + e.detail() + ")");
        continue;
      }
      protocol::ResultEnvelope env;
      try {
        if (message.empty()) throw Error(Errc::bad_record, "an empty result message");
        env = protocol::unpack_result(message[0]);
      } catch (const Error& e) {
        kill_worker(s, "it sent a malformed result (" + e.detail() + ")");
        continue;
      }
      complete(s, env, std::move(message));
    }
  }

  void complete(Slot& s, const protocol::ResultEnvelope& env, Tensors message) {
    std::unique_lock<std::mutex> lock(mu);
    s.process_counts = env;
    const auto it = tasks.find(env.task_id);
    if (it == tasks.end() || it->second->worker != s.id || it->second->attempts != env.attempt) {
      return;  // ended already (cancelled, or timed out and retried): the result is stale
    }
    const std::shared_ptr<Task> task = it->second;
    tasks.erase(it);
    auto& in = s.inflight;
    const bool was_head = !in.empty() && in.front() == task->id;
    in.erase(std::remove(in.begin(), in.end(), task->id), in.end());
    if (was_head) s.head_since = Clock::now();
    const pid_t pid = s.pid;
    if (env.ok) {
      ++s.stats.tasks_done;
      ++totals.completed;
    } else {
      ++s.stats.tasks_failed;
      ++totals.failed;
    }
    changed.notify_all();
    lock.unlock();

    if (env.ok) {
      message.erase(message.begin());
      finish(*task, nullptr, std::move(message), s.id);
    } else {
      std::string text = "(no message)";
      try {
        if (message.size() > 1) text = protocol::tensor_text(message[1]);
      } catch (const Error& e) {
        text = e.detail();
      }
      finish(*task,
             std::make_exception_ptr(
                 TaskError(Errc::task_failed, task->name, task->index, s.id, s.device, pid, text)),
             {}, s.id);
    }
    dispatch();
  }

  // ---- worker processes (monitor thread only) ---------------------------------------------
  void start(Slot& s) {
    const Start how = resolve_start(opt.start);
    if (how == Start::Spawn && executable.empty()) {
      executable = find_worker_executable(opt.worker_executable);
    }
    const std::uint32_t cap = static_cast<std::uint32_t>(opt.max_inflight_per_worker) *
                              static_cast<std::uint32_t>(protocol::kMaxTensorsPerTask + 1);
    TensorQueue tasks_q = TensorQueue::create({cap});
    TensorQueue results_q = TensorQueue::create({cap});
    auto [mine, theirs] = control_socket_pair();
    // A forked child holds none of the supervisor's other links, so no worker keeps another's
    // control socket open after the supervisor has gone.
    std::vector<int> close_in_child{wake.get(), mine.get()};
    for (auto& other : slots) {
      if (other->control) close_in_child.push_back(other->control.get());
      if (other->pidfd) close_in_child.push_back(other->pidfd.get());
    }
    const std::string who = "worker " + std::to_string(s.id) + " (" + s.device + ")";
    LaunchedWorker w = launch_worker(how, theirs.get(), executable, close_in_child);
    theirs.reset();

    auto fail = [&](const std::string& why) {
      ::kill(w.pid, SIGKILL);
      int status = 0;
      ::waitpid(w.pid, &status, 0);
      throw Error(Errc::handshake, who + " " + why);
    };
    protocol::Welcome welcome;
    try {
      protocol::Hello hello;
      hello.supervisor_pid = ::getpid();
      hello.worker_id = s.id;
      hello.device = s.device;
      hello.threads = threads;
      hello.config = opt.config;
      send_control(mine.get(), protocol::encode(hello), {tasks_q.fd(), results_q.fd()});
      welcome = protocol::decode_welcome(recv_control(mine.get(), opt.start_timeout).bytes);
    } catch (const Error& e) {
      if (e.code() == Errc::peer_dead) {
        int status = 0;
        ::waitpid(w.pid, &status, 0);
        throw Error(Errc::handshake,
                    who + " ended during its start-up, " + describe_wait_status(status) +
                        (how == Start::Spawn ? " (worker executable '" + executable + "')" : "") +
                        "; its own message, if any, is on stderr above");
      }
      if (e.code() == Errc::timeout) {
        fail("did not answer its handshake within " + std::to_string(opt.start_timeout.count()) +
             " ms (raise PoolOptions::start_timeout if the machine is very slow)");
      }
      fail("failed its handshake: " + e.detail());
    }
    if (welcome.version != protocol::kVersion) {
      fail("speaks protocol version " + std::to_string(welcome.version) +
           ", this supervisor version " + std::to_string(protocol::kVersion) +
           ": the worker program is from another ferry build; rebuild it against this libferry");
    }
    if (!welcome.error.empty()) fail("refused to start: " + welcome.error);
    if (welcome.pid != w.pid) {
      fail("answered as pid " + std::to_string(welcome.pid) + ", not " + std::to_string(w.pid));
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (task_names.empty()) {
        task_names = welcome.tasks;
      } else if (task_names != welcome.tasks) {
        fail("has tasks [" + join_names(welcome.tasks) + "] but the pool's others have [" +
             join_names(task_names) + "]; every worker must run the same program");
      }
    }
    for (const auto& need : opt.require_tasks) {
      if (std::find(welcome.tasks.begin(), welcome.tasks.end(), need) == welcome.tasks.end()) {
        fail("has no task '" + need + "' (it has: " + join_names(welcome.tasks) +
             "); register it with FERRY_TASK in the worker program");
      }
    }

    // CUDA inputs go to this worker by IPC when it can open them, else through shared memory.
    tasks_q.set_receiver(w.pid, s.device == "cpu" ? -1 : std::stoi(s.device.substr(5)));
    std::lock_guard<std::mutex> lock(mu);
    s.pid = w.pid;
    s.pidfd = std::move(w.pidfd);
    s.control = std::move(mine);
    s.tasks = tasks_q;
    s.results = results_q;
    s.kill_reason.clear();
    s.start_failures = 0;
    s.process_counts = {};
    s.stats.pid = w.pid;
    s.stats.start = start_name(how);
    s.state = SlotState::Ready;
    s.collector = std::thread([this, &s, results_q] { collect(s, results_q); });
    log().debug("{} ready as pid {}", who, s.pid);
  }

  // Reaps a worker whose pidfd turned readable and hands its unfinished tasks back.
  void reap(Slot& s) {
    int status = 0;
    const bool got = ::waitpid(s.pid, &status, 0) == s.pid;
    const std::string how =
        got ? describe_wait_status(status) : "ended (its status was reaped elsewhere)";
    std::optional<TensorQueue> tasks_q, results_q;
    {
      std::lock_guard<std::mutex> lock(mu);
      s.state = SlotState::Down;
      tasks_q = std::move(s.tasks);
      results_q = std::move(s.results);
      s.tasks.reset();
      s.results.reset();
    }
    if (!stopping) log().warn("worker {} ({}, pid {}) {}", s.id, s.device, s.pid, how);
    // Results that arrived before the death are real: deliver them before retrying anything.
    if (results_q) results_q->close();
    if (s.collector.joinable()) s.collector.join();
    // Views on the worker's CUDA results are marked now rather than at the next liveness check.
    notify_peer_exit(s.pid);

    std::vector<std::shared_ptr<Task>> lost, retry;
    {
      std::lock_guard<std::mutex> lock(mu);
      const std::string reason = s.kill_reason.empty() ? how : s.kill_reason + ", " + how;
      for (std::uint64_t id : s.inflight) {
        const auto it = tasks.find(id);
        if (it == tasks.end()) continue;
        const std::shared_ptr<Task>& t = it->second;
        t->worker = -1;
        t->last_worker = s.id;
        t->lost_because = "worker " + std::to_string(s.id) + " (" + s.device + ", pid " +
                          std::to_string(s.pid) + ") " + reason;
        ++s.stats.tasks_lost;
        if (t->attempts > static_cast<std::uint32_t>(opt.max_retries)) {
          lost.push_back(t);
          tasks.erase(it);
          ++totals.failed;
        } else {
          retry.push_back(t);
        }
      }
      s.inflight.clear();
      pending.insert(pending.begin(), retry.begin(), retry.end());
      totals.retried += retry.size();
      s.stats.last_exit = how;
      s.stats.pid = -1;
      s.stats.tensors_zero_copy += s.process_counts.tensors_zero_copy;
      s.stats.bytes_zero_copy += s.process_counts.bytes_zero_copy;
      s.stats.tensors_copied += s.process_counts.tensors_copied;
      s.stats.bytes_copied += s.process_counts.bytes_copied;
      s.process_counts = {};
      s.pid = -1;
      s.pidfd.reset();
      s.control.reset();
      s.respawn_at = Clock::now();
      changed.notify_all();
    }
    for (auto& t : lost) {
      finish(*t, std::make_exception_ptr(
                     TaskError(Errc::worker_lost, t->name, t->index, -1, s.device, -1,
                               "lost with its worker on all " + std::to_string(t->attempts) +
                                   " attempt(s); the last: " + t->lost_because)));
    }
    if (tasks_q) discard_queued(*tasks_q);
    // The dead worker's leases on the supervisor's memory come back now, not on the next send.
    if (Ledger* ledger = Arena::local().existing_ledger()) ledger->reclaim(true);
  }

  // Closes a task queue and takes back what no worker will read, so the leases those messages
  // hold on the supervisor's memory end.
  static void discard_queued(TensorQueue& q) {
    q.close();
    for (;;) {
      try {
        q.recv(std::chrono::milliseconds(0));
      } catch (const Error&) {
        if (q.size() == 0) return;
      }
    }
  }

  void respawn_due() {
    const auto now = Clock::now();
    for (auto& sp : slots) {
      Slot& s = *sp;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping || s.state != SlotState::Down || s.respawn_at > now) continue;
        s.state = SlotState::Starting;
      }
      try {
        start(s);
        std::lock_guard<std::mutex> lock(mu);
        ++s.stats.restarts;
      } catch (const Error& e) {
        give_up_or_retry(s, e);
      }
    }
  }

  void give_up_or_retry(Slot& s, const Error& e) {
    std::vector<std::shared_ptr<Task>> doomed;
    {
      std::lock_guard<std::mutex> lock(mu);
      ++s.start_failures;
      s.stats.last_exit = e.detail();
      if (s.start_failures < kMaxStartFailures) {
        s.state = SlotState::Down;
        s.respawn_at = Clock::now() + std::chrono::milliseconds(100 << s.start_failures);
        log().error("{}; retrying", e.detail());
        return;
      }
      s.state = SlotState::Failed;
      log().error("{}; giving up on worker {} after {} failed starts", e.detail(), s.id,
                  s.start_failures);
      if (std::any_of(slots.begin(), slots.end(),
                      [](const auto& x) { return x->state != SlotState::Failed; })) {
        return;
      }
      fatal = "no worker can be started: " + e.detail();
      for (auto& [id, t] : tasks) doomed.push_back(t);
      tasks.clear();
      pending.clear();
      totals.failed += doomed.size();
      changed.notify_all();
    }
    for (auto& t : doomed) {
      finish(*t, std::make_exception_ptr(
                     TaskError(Errc::worker_lost, t->name, t->index, -1, s.device, -1, fatal)));
    }
  }

  void check_timeouts() {
    if (opt.task_timeout.count() <= 0) return;
    const auto now = Clock::now();
    std::vector<std::pair<Slot*, std::string>> due;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& sp : slots) {
        Slot& s = *sp;
        if (s.state != SlotState::Ready || s.inflight.empty() || !s.kill_reason.empty() ||
            now - s.head_since < opt.task_timeout) {
          continue;
        }
        const auto it = tasks.find(s.inflight.front());
        const std::string what = it == tasks.end() ? "a task"
                                                   : "task '" + it->second->name + "' (input " +
                                                         std::to_string(it->second->index) + ")";
        ++s.stats.timeouts;
        due.emplace_back(&s, what + " ran past its timeout of " +
                                 std::to_string(opt.task_timeout.count()) + " ms");
      }
    }
    for (auto& [s, why] : due) kill_worker(*s, why);
  }

  // How long the monitor may sleep before a timeout or a respawn falls due.
  int poll_timeout_ms() const {
    auto next = Clock::now() + std::chrono::milliseconds(250);
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& sp : slots) {
      if (sp->state == SlotState::Down) next = std::min(next, sp->respawn_at);
      if (sp->state == SlotState::Ready && !sp->inflight.empty() && opt.task_timeout.count() > 0) {
        next = std::min(next, sp->head_since + opt.task_timeout);
      }
    }
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    return static_cast<int>(std::max<long long>(ms, 0)) + 1;
  }

  void run_monitor(std::promise<void> started) {
    for (auto& sp : slots) {
      {
        std::lock_guard<std::mutex> lock(mu);
        sp->state = SlotState::Starting;
      }
      try {
        start(*sp);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu);
          stopping = true;
        }
        stop_workers();
        started.set_exception(std::current_exception());
        return;
      }
    }
    started.set_value();
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) break;
      }
      std::vector<pollfd> fds{{wake.get(), POLLIN, 0}};
      std::vector<Slot*> watched;
      for (auto& sp : slots) {
        if (sp->state == SlotState::Ready) {
          fds.push_back({sp->pidfd.get(), POLLIN, 0});
          watched.push_back(sp.get());
        }
      }
      const int n = ::poll(fds.data(), fds.size(), poll_timeout_ms());
      if (n < 0 && errno != EINTR) {
        log().error("pool monitor: poll: {}", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (fds[0].revents & POLLIN) {
        std::uint64_t drained;
        [[maybe_unused]] ssize_t r = ::read(wake.get(), &drained, sizeof drained);
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents) reap(*watched[i - 1]);
      }
      check_timeouts();
      respawn_due();
      dispatch();
    }
    stop_workers();
  }

  // Stop token (a closed task queue), a grace period, then SIGKILL; every process reaped.
  void stop_workers() {
    std::vector<Slot*> live;
    for (auto& sp : slots) {
      std::optional<TensorQueue> q;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (sp->pid > 0) live.push_back(sp.get());
        q = sp->tasks;
      }
      if (q) discard_queued(*q);
    }
    const auto deadline = Clock::now() + opt.stop_timeout;
    for (Slot* s : live) {
      for (;;) {
        pollfd p{s->pidfd.get(), POLLIN, 0};
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        if (::poll(&p, 1, static_cast<int>(std::max<long long>(left.count(), 0))) == 1) break;
        if (Clock::now() >= deadline) {
          log().warn("worker {} (pid {}) did not stop within {} ms; killing it", s->id, s->pid,
                     opt.stop_timeout.count());
          ::kill(s->pid, SIGKILL);
          break;
        }
      }
    }
    for (Slot* s : live) reap(*s);
    std::lock_guard<std::mutex> lock(mu);
    for (auto& sp : slots) sp->state = SlotState::Stopped;
  }

  void close(Shutdown how) {
    std::lock_guard<std::mutex> once(close_mu);
    std::vector<std::shared_ptr<Task>> cancelled;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (closed) return;
      closing = true;
      changed.notify_all();
      if (how == Shutdown::Drain) {
        changed.wait_for(lock, opt.drain_timeout, [&] { return tasks.empty(); });
      }
      for (auto& [id, t] : tasks) cancelled.push_back(t);
      tasks.clear();
      pending.clear();
      for (auto& sp : slots) sp->inflight.clear();
      totals.failed += cancelled.size();
      stopping = true;
    }
    std::sort(cancelled.begin(), cancelled.end(),
              [](const auto& a, const auto& b) { return a->id < b->id; });
    const std::string why = how == Shutdown::Drain
                                ? "the pool closed and its drain_timeout passed first"
                                : "the pool was closed (Shutdown::Cancel) first";
    for (auto& t : cancelled) {
      finish(*t, std::make_exception_ptr(TaskError(Errc::closed, t->name, t->index, t->worker, "",
                                                   -1, "not finished: " + why)));
    }
    rouse();
    if (monitor.joinable()) monitor.join();
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
  }
};

// ---- Pool ------------------------------------------------------------------------------------

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
  for (std::size_t i = 0; i < o.devices.size(); ++i) {
    auto slot = std::make_unique<Slot>();
    slot->id = static_cast<int>(i);
    slot->device = normalise_device(o.devices[i]);
    slot->stats.id = slot->id;
    slot->stats.device = slot->device;
    s.slots.push_back(std::move(slot));
  }
  s.threads = o.threads_per_worker > 0 ? o.threads_per_worker
                                       : std::max(1, cores / static_cast<int>(o.devices.size()));
  if (o.start == Start::Fork) resolve_start(Start::Fork);  // refuse now, before any thread
  s.wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s.wake) throw_errno(Errc::system, "eventfd for the pool", errno);

  // Every worker is started from the monitor thread, which lives as long as they do
  // (PR_SET_PDEATHSIG follows the thread that started a child).
  std::promise<void> started;
  std::future<void> ready = started.get_future();
  s.monitor = std::thread(
      [state = s_, p = std::move(started)]() mutable { state->run_monitor(std::move(p)); });
  try {
    ready.get();
  } catch (...) {
    s.monitor.join();
    throw;
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
  return s_->slots.size();
}
std::size_t Pool::capacity() const noexcept {
  return s_->capacity();
}

std::vector<pid_t> Pool::worker_pids() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  std::vector<pid_t> pids;
  for (const auto& sp : s_->slots) pids.push_back(sp->pid);
  return pids;
}

PoolStats Pool::stats() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  PoolStats out = s_->totals;
  for (const auto& sp : s_->slots) {
    WorkerStats w = sp->stats;
    w.tensors_zero_copy += sp->process_counts.tensors_zero_copy;
    w.bytes_zero_copy += sp->process_counts.bytes_zero_copy;
    w.tensors_copied += sp->process_counts.tensors_copied;
    w.bytes_copied += sp->process_counts.bytes_copied;
    out.workers.push_back(std::move(w));
  }
  return out;
}

}  // namespace ferry
