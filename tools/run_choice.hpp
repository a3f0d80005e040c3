// What `ferry run` and `ferry host` make of --task, --model, --worker and --start together, so
// that no flag given is silently ignored: a worker program of the user's own is spawned (a
// forked worker would be this program, without the user's tasks), and a model alone means the
// TorchScript task. Pure, with a test per case (test/tools/run_choice_test.cpp).
#pragma once

#include <string>

namespace ferry::tools {

struct RunFlags {
  std::string task;         // --task, or its default
  bool task_given = false;  // whether --task was on the command line
  std::string model;        // --model, "" when not given
  std::string worker;       // --worker, "" when not given
  std::string start;        // --start: auto, fork or spawn
};

struct RunChoice {
  std::string task, start;
  std::string error;  // not empty: the flags contradict each other; the message names the remedy
};

RunChoice choose_run(const RunFlags& f);

}  // namespace ferry::tools
