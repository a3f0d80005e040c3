// The task registry and the worker executable's own command line.
#include "workers/task_registry.hpp"

#include <cstdio>
#include <string>

#include "../test_util.hpp"
#include "workers/worker_loop.hpp"

namespace ferry {
namespace {

std::string run(const std::string& cmd, int* code) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = ::pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST_CASE("the registry holds the built-in and the program's own tasks, sorted") {
  const auto names = task_names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  for (const char* n : {"echo", "square", "mlp", "torchscript", "sleep_echo"}) {
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
    CHECK(find_task(n) != nullptr);
  }
  CHECK(find_task("no_such_task") == nullptr);
}

TEST_CASE("registering a task name twice is an error naming it") {
  register_task("registered_once_in_this_test", [](TaskContext&, Tensors in) { return in; });
  CHECK_THROWS_WITH(
      register_task("registered_once_in_this_test", [](TaskContext&, Tensors in) { return in; }),
      Catch::Contains("'registered_once_in_this_test'") && Catch::Contains("twice"));
  CHECK_THROWS_AS(register_task("", [](TaskContext&, Tensors in) { return in; }), Error);
}

TEST_CASE("a worker executable lists its tasks, and refuses to be run by hand") {
  int code = 0;
  const std::string tasks = run(std::string(FERRY_TEST_WORKER) + " --list-tasks", &code);
  CHECK(code == 0);
  CHECK_THAT(tasks, Catch::Contains("sleep_echo\n") && Catch::Contains("mlp\n"));
  const std::string usage = run(FERRY_TEST_WORKER, &code);
  CHECK(code == kWorkerUsage);
  CHECK_THAT(usage, Catch::Contains("not run by hand"));
  // A control fd that is not a socket from a supervisor: a clear failure, not a hang.
  run(std::string(FERRY_TEST_WORKER) + " --ferry-control-fd 0 < /dev/null", &code);
  CHECK(code != 0);
}

}  // namespace
}  // namespace ferry
