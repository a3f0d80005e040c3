// ferry::TaskError: a task that did not produce a result, and where it was running.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "ipc/error.hpp"

namespace ferry {

// Thrown from a pool's futures and map(). code() is Errc::task_failed when the task threw in its
// worker (what() carries the worker's message), Errc::worker_lost when its worker died or timed
// out with it on every attempt (what() names the signal or the timeout).
class TaskError : public Error {
 public:
  TaskError(Errc code, std::string task, std::size_t index, int worker, std::string device,
            pid_t pid, std::string message, std::string detail = {});

  const std::string& task() const noexcept { return task_; }
  std::size_t index() const noexcept {
    return index_;
  }                                                // position in map()'s inputs, or the
                                                   // submission number for submit()
  int worker() const noexcept { return worker_; }  // worker slot; -1 if it never ran
  const std::string& device() const noexcept { return device_; }
  pid_t pid() const noexcept { return pid_; }
  const std::string& message() const noexcept { return message_; }  // the task's own words
  // What the task's own runtime made of its error for the caller's (TaskFailure::detail(); the
  // Python package's pickled exception), or empty.
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::string task_;
  std::size_t index_;
  int worker_;
  std::string device_;
  pid_t pid_;
  std::string message_;
  std::string detail_;
};

// The text of a TaskError of these fields, as what() says it.
std::string describe_task_error(Errc code, const std::string& task, std::size_t index, int worker,
                                const std::string& device, pid_t pid, const std::string& message);

}  // namespace ferry
