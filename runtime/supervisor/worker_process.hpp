// One worker slot's process life: launch, handshake, death, and the next start.
//
// Driven by the pool's monitor thread alone, so nothing here locks; what other threads need
// (the task queue, the pid) the pool copies out under its own lock. Start-up does not block the
// monitor: launch() forks or spawns and sends the hello, then the monitor watches control_fd()
// and pidfd() with every other worker's, and calls finish_start() when the answer is there, so a
// slow start never delays noticing another worker's death.
//
//   Down --launch--> Starting --finish_start ok--> Ready --exited--> Down (restarted at once)
//   Ready --retire (its tasks per life done)--> Ready, retiring --exited--> Down (at once)
//   Starting --launch error | refusal | exit | deadline--> Down (after a back-off) | Failed
//   any --stop--> Stopped
// The restart policy (restart_policy.hpp) decides between Down and Failed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ipc/clock.hpp"
#include "ipc/fd.hpp"
#include "runtime/supervisor/restart_policy.hpp"
#include "runtime/tensor_queue.hpp"
#include "runtime/worker_launch.hpp"
#include "runtime/worker_protocol.hpp"

namespace ferry::supervisor {

// A start that did not end in a ready worker: how, and the worker's (or launcher's) own words.
struct StartFailure {
  StartFault fault = StartFault::crashed;
  std::string message;
};

// What every start of a pool's workers shares.
struct LaunchSpec {
  Start start = Start::Auto;
  std::string executable;         // for spawn
  std::vector<std::string> args;  // for spawn, before --ferry-control-fd N
  int threads = 1;
  bool shared_allocations = true;
  std::uint32_t queue_capacity = 0;  // tensors in each of a worker's two queues
  std::chrono::milliseconds start_timeout{30000};
  std::map<std::string, std::string> config;
  std::vector<std::string> require_tasks;
  NamedTensors shared;  // sent ahead of the hello, to every start (PoolOptions::shared)
};

// The pool's side of a worker's results, run by its collector thread (finish_start). None of
// these may throw.
struct Collecting {
  std::function<void(Tensors)> on_result;           // a message from the result queue
  std::function<void(const Error&)> on_unreadable;  // one that could not be read
  // Returns once the collector is needed: a task handed to the worker is not awaited by a caller
  // that takes its own result (local_slot.hpp, CollectorGate), or the process is being reaped.
  std::function<void()> until_needed;
  std::function<void()> closing;  // makes until_needed() return from now on: a reap
  std::mutex* turn = nullptr;     // held while a result is received and ended
};

class WorkerProcess {
 public:
  enum class Phase { Down, Starting, Ready, Failed, Stopped };

  WorkerProcess(int id, std::string device);
  ~WorkerProcess();  // kills and reaps a process still there; joins the collector

  int id() const noexcept { return id_; }
  const std::string& device() const noexcept { return device_; }
  Phase phase() const noexcept { return phase_; }
  pid_t pid() const noexcept { return pid_; }
  int pidfd() const noexcept { return pidfd_.get(); }         // readable once the process ended
  int control_fd() const noexcept { return control_.get(); }  // readable: the answer is in
  Clock::time_point start_deadline() const noexcept { return start_deadline_; }
  Clock::time_point restart_at() const noexcept { return restart_at_; }
  Start started_by() const noexcept { return how_; }
  const std::optional<TensorQueue>& tasks() const noexcept { return tasks_; }

  // Down -> Starting: makes the worker's queues, launches it and sends the hello. `others` are
  // the supervisor's fds a forked child must not keep. Returns a failure instead of throwing.
  std::optional<StartFailure> launch(const LaunchSpec& spec, std::vector<int> others,
                                     pid_t supervisor);

  // Starting -> Ready, once control_fd() is readable: reads and checks the answer. `tasks` is the
  // pool's task list, set from the first worker that answers; every other must match it. On
  // failure the process is killed and reaped, and the failure returned. On success the collector
  // thread starts and, whenever it is needed, runs `c.on_result` for every message on the result
  // queue until reap() (`c.on_unreadable` for one it could not read).
  std::optional<StartFailure> finish_start(const LaunchSpec& spec, std::vector<std::string>& tasks,
                                           Collecting c);
  // The result queue, for a caller that takes its own result while it holds the turn.
  const std::optional<TensorQueue>& results() const noexcept { return results_; }

  // Starting, its process ended or its deadline passed: kills, reaps, and says what happened.
  StartFailure start_failed(bool deadline_passed, const LaunchSpec& spec);

  // Ready, its pidfd readable (or killed on purpose): reaps it, lets the collector deliver every
  // result that arrived before the death, and returns how it ended, e.g. "killed by SIGKILL".
  // Its task queue is closed and drained (the leases its messages held come back).
  std::string reap();

  // After a failed start: Down with a restart time, or Failed. Returns the decision.
  RestartDecision after_failed_start(const RestartPolicy& policy, StartFault fault);
  // After a ready worker ended: Down, to be started again at once.
  void after_exit();

  // Kills a ready process (the supervisor's decision); its exit is then handled as a crash, and
  // reap() names `why`.
  void kill(const std::string& why);
  const std::string& kill_reason() const noexcept { return kill_reason_; }

  // Closes the task queue: the worker's stop token.
  void request_stop();

  // Ready, every task of its life answered (TaskBook::life_spent): the stop token, so it exits
  // as at a pool's close, and its exit is no crash. One that has not exited by `grace` from now
  // is killed (retire_due()).
  void retire(std::chrono::milliseconds grace);
  bool retiring() const noexcept { return retiring_; }
  // When a retiring process that has not exited is to be killed.
  Clock::time_point retire_deadline() const noexcept { return retire_deadline_; }
  // Stopped, once the process (if any) has been reaped.
  void mark_stopped();

  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

 private:
  void forget_process();  // pid, fds and queues dropped after a reap
  // Closes the result queue, lets the collector drain it and joins it.
  void stop_collector();
  // Queues `shared` ahead of the hello. Throws Error(invalid_argument) when a tensor would
  // reach the worker as a copy.
  void send_shared(const NamedTensors& shared);

  const int id_;
  const std::string device_;
  Phase phase_ = Phase::Down;
  pid_t pid_ = -1;
  UniqueFd pidfd_, control_;
  Start how_ = Start::Fork;
  std::string executable_;  // the spawned program, for messages
  std::optional<TensorQueue> tasks_, results_;
  std::thread collector_;
  Collecting collecting_;  // the running collector's
  Clock::time_point start_deadline_{}, restart_at_{}, retire_deadline_{};
  bool retiring_ = false;
  StartHistory history_;
  std::string kill_reason_;
};

// Closes a task queue and takes back what no worker will read, so the leases those messages hold
// on the supervisor's memory end.
void discard_queued(TensorQueue& q);

}  // namespace ferry::supervisor
