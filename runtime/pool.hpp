// ferry::Pool: worker processes on a device list, fed tasks by name, results back in order.
//
//   ferry::PoolOptions o;
//   o.devices = {"cpu", "cpu"};
//   ferry::Pool pool(o);
//   std::vector<ferry::Tensors> out = pool.map("square", inputs);   // in input order
//   std::future<ferry::Tensors> f = pool.submit("mlp", {x});
//
// Workers are started by fork or spawn (see worker_launch.hpp) and run the tasks registered
// with FERRY_TASK in the worker program (workers/task_registry.hpp). Inputs travel zero-copy
// when they live in shared memory (ferry::empty_shared), else they are copied once. A worker
// that dies is noticed at once (pidfd), restarted, and its unfinished tasks are retried on
// another worker up to max_retries times; every submitted task ends exactly once, with its
// result or an error. A start that fails is retried with a back-off (PoolOptions::restart). Work in
// flight is bounded, so a fast producer blocks instead of piling up memory. The destructor closes
// the pool; no worker outlives its supervisor.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ipc/clock.hpp"
#include "runtime/prelude.hpp"
#include "runtime/remote_workers.hpp"
#include "runtime/supervisor/pool_stats.hpp"
#include "runtime/supervisor/restart_policy.hpp"
#include "runtime/task_error.hpp"
#include "runtime/tensor_queue.hpp"  // Tensors
#include "runtime/worker_launch.hpp"

namespace ferry {

// What close() does with tasks not yet finished.
enum class Shutdown {
  Drain,   // finish every submitted task (up to drain_timeout), then stop the workers
  Cancel,  // fail tasks not yet finished with Error(closed), then stop the workers
  // As Cancel, but the workers are killed at once (SIGKILL), busy or idle, with no stop_timeout
  // to finish what they are doing: multiprocessing's terminate().
  Kill,
};

// Tensors PoolOptions::shared may hold at most (a quarter of the arena's leases, per worker).
inline constexpr std::size_t kMaxSharedTensors = 16384;

struct PoolOptions {
  // One worker per entry: "cpu", "cuda", "cuda:N". Empty: `workers` CPU workers.
  std::vector<std::string> devices;
  int workers = 0;  // CPU workers when `devices` is empty; 0: one per core
  Start start = Start::Auto;
  // Tasks handed to one worker at most; submit() blocks when every worker has its fill. 0: the
  // pool chooses for each worker, 3 to 64, deeper the shorter its tasks and the fewer bytes they
  // move (queue_depth.hpp).
  int max_inflight_per_worker = 0;
  int max_retries = 2;  // times a task lost with its worker is tried again
  // Tasks one worker process runs before it is replaced by a fresh one (multiprocessing's
  // maxtasksperchild: what native code leaks goes with it); 0: it lives as long as the pool.
  // Its tasks' results all come back first, and none is retried for it.
  std::uint64_t max_tasks_per_worker = 0;
  // A task that runs longer kills its worker (handled like a crash). 0: no limit. Measured from
  // when the worker could start it (its earlier tasks done), not from submit().
  std::chrono::milliseconds task_timeout{0};
  std::chrono::milliseconds start_timeout{60000};  // a worker's start-up and handshake
  // When a failed start is tried again and when its slot is given up, for the first start and
  // every restart alike (restart_policy.hpp; docs/supervisor.md, "Restarts").
  RestartPolicy restart;
  std::chrono::milliseconds stop_timeout{5000};  // workers' exit after close, then SIGKILL
  std::chrono::milliseconds drain_timeout{std::chrono::minutes(10)};  // Drain's wait, then Cancel
  Shutdown shutdown = Shutdown::Drain;                                // the destructor's policy
  int threads_per_worker = 0;  // intra-op threads in each worker; 0: cores / workers, >= 1
  // Tensors a task makes (its results above all) are born in the worker's shared memory, so they
  // come back without a copy (runtime/shared_allocations.hpp). Off: results are copied when sent,
  // which a task that keeps writing a tensor after returning it needs (a buffer reused across
  // tasks), since the caller would see those writes.
  bool shared_allocations = true;
  std::string worker_executable;  // for spawn; empty: find_worker_executable("")
  // For spawn: arguments before --ferry-control-fd N, so an interpreter can be the executable
  // (the Python package starts `python -c ...` workers this way).
  std::vector<std::string> worker_args;
  // Handed to every task as TaskContext::config (e.g. "model" for the torchscript task).
  std::map<std::string, std::string> config;
  // Tasks the workers must have; start-up fails otherwise. Unknown names fail at submit().
  std::vector<std::string> require_tasks;
  // Tensors every worker, and every restarted one, holds for its whole life: the same memory as
  // here, not a copy, seen by tasks as TaskContext::shared (model weights for Hogwild training:
  // share_module(), share_optimizer()). CPU tensors move into shared memory in place when the
  // pool starts; CUDA tensors travel by IPC handle, so every worker must be a CUDA one.
  NamedTensors shared;
  // Workers beyond this machine's: hosts that join the job (ferry::hosts::HeadHub,
  // docs/multi-host.md). Each one is a slot of the pool while it lasts; its loss retries its
  // tasks like a worker's death. Null: this machine only.
  std::shared_ptr<RemoteWorkers> remote;
};

class Pool {
 public:
  // Starts every worker and waits for its handshake, retrying failed starts by the restart
  // policy. Throws Error: invalid_argument (bad option, fork after CUDA init, a shared tensor a
  // worker could not share), shm_exhausted (no room to share `shared`), handshake (a
  // worker refused, could not be launched, or kept failing: the message is its last failure).
  explicit Pool(PoolOptions options);
  Pool() : Pool(PoolOptions{}) {}
  ~Pool();  // close() with options.shutdown

  // Runs `task` on `inputs` in some worker. Blocks while the pool is full (back-pressure), up to
  // `timeout` (then Error(timeout)). Throws Error(invalid_argument) for an unknown task or more
  // than 64 tensors, Error(closed) once closing. The future yields the task's outputs or throws
  // TaskError. A `prelude` goes to each worker once and is seen by the task as
  // TaskContext::prelude (runtime/prelude.hpp); it and the inputs hold 64 tensors at most.
  std::future<Tensors> submit(const std::string& task, Tensors inputs,
                              std::chrono::milliseconds timeout = kForever,
                              PreludePtr prelude = nullptr);

  // Runs `task` on every input and returns the outputs in input order. Every task ends before it
  // returns; then the first failure (in input order) is thrown as TaskError.
  std::vector<Tensors> map(const std::string& task, const std::vector<Tensors>& inputs);

  // One finished task of imap_unordered().
  struct Result {
    std::size_t index = 0;  // position in the inputs
    Tensors outputs;        // empty when `error` is set
    std::exception_ptr error;
    std::chrono::nanoseconds latency{0};  // from hand-over to the pool until the result came
    int worker = -1;
    Tensors get() const;  // the outputs, or rethrows the error
  };
  // Runs `task` like submit() and calls `done` once, from a pool thread, when it ends (with its
  // outputs or its error); `done` must not block for long. Not called when this throws.
  void submit(const std::string& task, Tensors inputs, std::function<void(Result&&)> done,
              std::chrono::milliseconds timeout = kForever, PreludePtr prelude = nullptr);

  // A task whose caller waits for it (call()).
  class Call {
   public:
    // Waits up to `timeout` for the task's outputs (kForever: until it ends); nullopt when the
    // time passed first, and wait() may be called again. While no pool thread is needed for the
    // worker's other results, this thread takes the result from the worker itself, so a call at
    // a time is one hand-off each way with no thread between. Throws the task's TaskError.
    std::optional<Tensors> wait(std::chrono::milliseconds timeout = kForever);
    // A call no one waits for any more leaves its result to the pool's threads.
    ~Call();
    Call(Call&&) noexcept = default;
    Call& operator=(Call&&) noexcept = default;
    struct State;
    explicit Call(std::shared_ptr<State> s) : s_(std::move(s)) {}

   private:
    std::shared_ptr<State> s_;
  };
  // Runs `task` like submit(), for a caller that then waits for it (Call::wait): what apply()
  // of Python's pool does. `keep` is held until the task has ended (what its inputs need
  // besides themselves). Throws what submit() throws.
  Call call(const std::string& task, Tensors inputs, std::chrono::milliseconds timeout = kForever,
            PreludePtr prelude = nullptr, std::shared_ptr<void> keep = nullptr);

  class Results {
   public:
    // The next finished task, whichever it is; nullopt once all have been returned. Submits
    // more inputs as room frees up, so at most the pool's capacity is in flight or buffered.
    // Results of fast tasks may gather up to about 2 ms before a waiting caller is woken to take
    // them together (supervisor/stream_wake.hpp). Throws Error(timeout) when `timeout` passes
    // first; next() may then be called again.
    std::optional<Result> next(std::chrono::milliseconds timeout = kForever);
    // The results already in, `most` at most, in the order they came, without waiting or
    // submitting. It stops before a failed one, which the next call of next() returns: a caller
    // that takes results in batches meets each failure in its place.
    std::vector<Result> take_ready(std::size_t most);
    // Submits the inputs the pool has room for now, without waiting; how many. A caller whose
    // inputs are made under a lock it would rather not take per input (the Python extension's
    // GIL) makes them here, then waits in next() without it.
    std::size_t top_up();
    struct State;
    explicit Results(std::shared_ptr<State> s) : s_(std::move(s)) {}

   private:
    // Submits inputs while there is room, the first waiting up to `first_wait` when nothing is
    // out; false when that one found no room.
    bool submit_more(std::chrono::milliseconds first_wait);
    std::shared_ptr<State> s_;
  };
  // Streams `task` over `inputs`, results in completion order.
  Results imap_unordered(const std::string& task, std::vector<Tensors> inputs);
  // The same over `count` inputs made on demand by `make(index)`, so a long stream never holds
  // more than the pool's capacity of inputs at once.
  Results imap_unordered(const std::string& task, std::size_t count,
                         std::function<Tensors(std::size_t)> make);
  // The same over inputs of a stream whose length is not known: `next_input(index)` makes input
  // `index` (0, 1, 2... in order, each once), or returns nullopt where the stream ends. It is
  // asked only as room frees up, so an endless stream is read as fast as results are taken.
  // Every task of the stream shares `prelude` (submit()).
  Results imap_unordered(const std::string& task,
                         std::function<std::optional<Tensors>(std::size_t)> next_input,
                         PreludePtr prelude = nullptr);

  // Stops taking work, finishes or cancels what is left (per `how`), stops the workers (stop
  // token, then SIGKILL after stop_timeout; at once for Shutdown::Kill) and reaps them.
  // Idempotent.
  void close();
  void close(Shutdown how);

  std::vector<std::string> tasks() const;  // what the workers can run
  std::size_t size() const noexcept;       // workers on this machine
  // Tasks in flight at most now: grows as hosts join, and where the pool chooses the depth, as
  // tasks prove short.
  std::size_t capacity() const noexcept;
  std::vector<pid_t> worker_pids() const;  // current processes here (-1 while restarting)
  PoolStats stats() const;

  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace ferry
