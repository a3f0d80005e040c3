#include "workers/task_registry.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "ipc/error.hpp"

namespace ferry {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, TaskFn> tasks;
  StartFn start;
};

// Built on first use: registrations run during static initialisation, in any order.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

std::string TaskContext::config_value(const std::string& key, const std::string& fallback) const {
  if (!config) return fallback;
  const auto it = config->find(key);
  return it == config->end() ? fallback : it->second;
}

const at::Tensor& TaskContext::shared_tensor(const std::string& name) const {
  if (shared) {
    const auto it = shared->find(name);
    if (it != shared->end()) return it->second;
  }
  std::string have;
  std::size_t listed = 0;
  for (const auto& [n, t] : shared ? *shared : NamedTensors{}) {
    if (++listed > 8) {
      have += ", ...";
      break;
    }
    have += (have.empty() ? "" : ", ") + n;
  }
  throw Error(Errc::invalid_argument, "task '" + task + "' asked for shared tensor '" + name +
                                          "', which the pool does not "
                                          "share (" +
                                          std::to_string(shared ? shared->size() : 0) + " shared" +
                                          (have.empty() ? "" : ": " + have) +
                                          "); set it in PoolOptions::shared");
}

void register_task(const std::string& name, TaskFn fn) {
  if (name.empty() || !fn) {
    throw Error(Errc::invalid_argument, "a task needs a name and a function");
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.tasks.emplace(name, std::move(fn)).second) {
    throw Error(Errc::invalid_argument,
                "task '" + name + "' is registered twice; task names must be unique");
  }
}

void set_worker_start(StartFn fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.start = std::move(fn);
}

const StartFn* worker_start() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.start ? &r.start : nullptr;
}

const TaskFn* find_task(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto it = r.tasks.find(name);
  return it == r.tasks.end() ? nullptr : &it->second;
}

std::vector<std::string> task_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, fn] : r.tasks) names.push_back(name);
  return names;
}

namespace detail {
bool register_at_load(const char* name, TaskFn fn) noexcept {
  try {
    register_task(name, std::move(fn));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::abort();
  }
  return true;
}
}  // namespace detail

}  // namespace ferry
