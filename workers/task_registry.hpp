// Tasks a worker can run, registered by name at load time:
//
//   FERRY_TASK("double", [](ferry::TaskContext& ctx, ferry::Tensors in) {
//     return ferry::Tensors{in.at(0).to(ctx.device) * 2};
//   });
//
// Link such files into a worker program (see docs/embedding.md): every program that links
// ferry::worker has the built-in tasks too. A task gets the tensors of one submission and
// returns the tensors of its result; an exception it throws comes back to the caller as a
// ferry::TaskError with its message, and the worker carries on. A TaskFailure adds a detail.
#pragma once

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/tensor_queue.hpp"  // Tensors

namespace ferry {

struct TaskContext {
  int worker_id = 0;                                           // the pool's slot number
  at::Device device = at::kCPU;                                // where this worker computes
  std::string task;                                            // the name the task was called by
  const std::map<std::string, std::string>* config = nullptr;  // PoolOptions::config
  spdlog::logger* logger = nullptr;                            // ferry's logger (FERRY_LOG)
  // PoolOptions::shared: the pool's memory itself, for the worker's whole life (never null).
  const NamedTensors* shared = nullptr;
  // The task's prelude (runtime/prelude.hpp): its id and tensors, kept by this worker across
  // tasks; 0 and null for a task without one.
  std::uint64_t prelude_id = 0;
  const Tensors* prelude = nullptr;

  // config[key], or `fallback` when it is not set.
  std::string config_value(const std::string& key, const std::string& fallback = "") const;
  // shared[name]. Throws Error(invalid_argument) naming what is shared when it is not there.
  const at::Tensor& shared_tensor(const std::string& name) const;
  spdlog::logger& log() const { return *logger; }
};

using TaskFn = std::function<Tensors(TaskContext&, Tensors)>;

// What a task throws to fail with, besides its message, a detail its caller's runtime reads
// (TaskError::detail()): the Python package sends the pickled exception, so its caller re-raises
// the task's own. A detail over protocol::kMaxDetailPieces pieces (5.5 KiB) travels in shared
// memory, and is left behind only where there is none.
class TaskFailure : public std::runtime_error {
 public:
  TaskFailure(const std::string& message, std::string detail)
      : std::runtime_error(message), detail_(std::move(detail)) {}
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::string detail_;
};

// What a worker runs once, right after its handshake and before its first task: a program's
// set-up per worker process (the Python package runs the pool's initializer there, when the
// worker starts, as multiprocessing.Pool does). `ctx.task` is empty. What it throws fails every
// task the worker is then given, with its message; the worker lives on.
using StartFn = std::function<void(TaskContext&)>;
void set_worker_start(StartFn fn);
// The start set by set_worker_start(), or null.
const StartFn* worker_start();

// Adds a task. Throws Error(invalid_argument) if the name is empty or already taken.
void register_task(const std::string& name, TaskFn fn);
// The task called `name`, or null.
const TaskFn* find_task(const std::string& name);
// Every registered name, sorted (the order the handshake reports them in).
std::vector<std::string> task_names();

namespace detail {
// FERRY_TASK's registration: a clash at load time is a programming error, reported on stderr
// before the program aborts.
bool register_at_load(const char* name, TaskFn fn) noexcept;
}  // namespace detail

}  // namespace ferry

#define FERRY_TASK_CONCAT2(a, b) a##b
#define FERRY_TASK_CONCAT(a, b) FERRY_TASK_CONCAT2(a, b)
// Registers `fn` (callable as Tensors(TaskContext&, Tensors)) under `name` when the program or
// library that holds this line is loaded.
#define FERRY_TASK(name, fn)                                                    \
  [[maybe_unused]] static const bool FERRY_TASK_CONCAT(ferry_task_, __LINE__) = \
      ::ferry::detail::register_at_load(name, fn)
