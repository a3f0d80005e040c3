// A prelude: what many tasks share and a worker keeps once it has it (a Python pool's pickled
// function). The pool hands it to each worker with the first task that names it; later tasks
// name only its id, so it crosses once per worker, not once per task. A worker that restarts
// gets it again with its next such task.
//
//   ferry::PreludePtr weights = ferry::make_prelude({table});
//   pool.submit("lookup", {keys}, done, ferry::kForever, weights);  // ctx.prelude is {table}
//
// Its tensors are copied into the worker's own memory when they arrive (they stay there for as
// long as the worker keeps them), so keep it small: a few KiB of code or settings, not data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/tensor_queue.hpp"  // Tensors

namespace ferry {

struct Prelude {
  std::uint64_t id = 0;  // never 0; unique in the process that made it
  Tensors tensors;
};
using PreludePtr = std::shared_ptr<const Prelude>;

// Preludes one worker keeps at most: the least recently used one goes when another comes.
inline constexpr std::size_t kPreludesPerWorker = 64;

// A prelude of `tensors` (CPU tensors, at most 8) under a new id. Throws Error(invalid_argument)
// for more tensors, an undefined or a CUDA one. The tensors are not copied: do not write them
// afterwards.
PreludePtr make_prelude(Tensors tensors);

// Tensors a prelude may hold; it and the task's inputs share protocol::kMaxTensorsPerTask.
inline constexpr std::size_t kMaxPreludeTensors = 8;

}  // namespace ferry
