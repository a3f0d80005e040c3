#include "runtime/task_error.hpp"

#include <utility>

namespace ferry {

std::string describe_task_error(Errc code, const std::string& task, std::size_t index, int worker,
                                const std::string& device, pid_t pid, const std::string& message) {
  std::string s = "task '" + task + "' (input " + std::to_string(index) + ")";
  s += code == Errc::task_failed ? " failed" : " was lost";
  if (worker >= 0) {
    s += " in worker " + std::to_string(worker) + " (" + device + ", pid " + std::to_string(pid) +
         ")";
  }
  return s + ": " + message;
}

TaskError::TaskError(Errc code, std::string task, std::size_t index, int worker, std::string device,
                     pid_t pid, std::string message, std::string detail)
    : Error(code, describe_task_error(code, task, index, worker, device, pid, message)),
      task_(std::move(task)),
      index_(index),
      worker_(worker),
      device_(std::move(device)),
      pid_(pid),
      message_(std::move(message)),
      detail_(std::move(detail)) {}

}  // namespace ferry
