// The task of docs/embedding.md's "Your own tasks, your own worker", as a user writes it.
#include "workers/task_registry.hpp"

FERRY_TASK("normalise", [](ferry::TaskContext& ctx, ferry::Tensors in) {
  at::Tensor x = in.at(0).to(ctx.device);
  return ferry::Tensors{(x - x.mean()) / x.std()};
});
