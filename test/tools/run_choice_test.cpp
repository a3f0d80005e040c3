// choose_run(): what --task, --model, --worker and --start mean together, one case each.
#include "tools/run_choice.hpp"

#include "../catch.hpp"

using ferry::tools::choose_run;
using ferry::tools::RunFlags;

namespace {
RunFlags defaults() {
  return RunFlags{"mlp", false, "", "", "auto"};
}
}  // namespace

TEST_CASE("run choice: no flags keep the defaults", "[tools]") {
  const auto c = choose_run(defaults());
  CHECK(c.error.empty());
  CHECK(c.task == "mlp");
  CHECK(c.start == "auto");
}

TEST_CASE("run choice: --worker spawns its workers under --start auto and spawn", "[tools]") {
  for (const char* start : {"auto", "spawn"}) {
    RunFlags f = defaults();
    f.worker = "./my-worker";
    f.start = start;
    const auto c = choose_run(f);
    CHECK(c.error.empty());
    CHECK(c.start == "spawn");
  }
}

TEST_CASE("run choice: --worker with --start fork is refused, naming both", "[tools]") {
  RunFlags f = defaults();
  f.worker = "./my-worker";
  f.start = "fork";
  const auto c = choose_run(f);
  CHECK(c.error.find("--worker './my-worker'") != std::string::npos);
  CHECK(c.error.find("drop --start fork") != std::string::npos);
}

TEST_CASE("run choice: --model alone means --task torchscript", "[tools]") {
  RunFlags f = defaults();
  f.model = "net.pt";
  const auto c = choose_run(f);
  CHECK(c.error.empty());
  CHECK(c.task == "torchscript");
  CHECK(c.start == "auto");
}

TEST_CASE("run choice: --model with --task torchscript", "[tools]") {
  RunFlags f = defaults();
  f.model = "net.pt";
  f.task = "torchscript";
  f.task_given = true;
  const auto c = choose_run(f);
  CHECK(c.error.empty());
  CHECK(c.task == "torchscript");
}

TEST_CASE("run choice: --model with another built-in task is refused", "[tools]") {
  RunFlags f = defaults();
  f.model = "net.pt";
  f.task = "mlp";
  f.task_given = true;
  const auto c = choose_run(f);
  CHECK(c.error.find("--model 'net.pt'") != std::string::npos);
  CHECK(c.error.find("'mlp', which takes no model") != std::string::npos);
}

TEST_CASE("run choice: --model with a custom worker's task goes to that task", "[tools]") {
  RunFlags f = defaults();
  f.model = "net.pt";
  f.task = "normalise";
  f.task_given = true;
  f.worker = "./my-worker";
  const auto c = choose_run(f);
  CHECK(c.error.empty());
  CHECK(c.task == "normalise");
  CHECK(c.start == "spawn");
}

TEST_CASE("run choice: --task torchscript without --model is refused", "[tools]") {
  RunFlags f = defaults();
  f.task = "torchscript";
  f.task_given = true;
  const auto c = choose_run(f);
  CHECK(c.error.find("needs --model") != std::string::npos);
}
