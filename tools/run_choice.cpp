#include "tools/run_choice.hpp"

namespace ferry::tools {

RunChoice choose_run(const RunFlags& f) {
  RunChoice c{f.task, f.start, ""};
  if (!f.worker.empty()) {
    if (f.start == "fork") {
      c.error = "--worker '" + f.worker +
                "' is a program of its own, and a forked worker is a "
                "copy of this one, without its tasks: drop --start fork (with --worker, workers "
                "are spawned)";
      return c;
    }
    c.start = "spawn";
  }
  if (!f.model.empty()) {
    if (!f.task_given) {
      c.task = "torchscript";
    } else if (f.task != "torchscript" && f.worker.empty()) {
      // A custom worker's task may read the model from its config; a built-in one other than
      // torchscript never does.
      c.error = "--model '" + f.model + "' is the file --task torchscript runs, but --task is '" +
                f.task + "', which takes no model: drop --model, or use --task torchscript";
      return c;
    }
  }
  if (c.task == "torchscript" && f.model.empty()) {
    c.error = "--task torchscript needs --model FILE.pt (a model saved by torch.jit.save)";
  }
  return c;
}

}  // namespace ferry::tools
