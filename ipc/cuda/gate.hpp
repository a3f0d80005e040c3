// The one door by which ferry's own code enters CUDA: the runtime, the driver, or LibTorch's CUDA
// queries (torch::cuda::is_available(), at::hasCUDA(), device counts), any of which initialises
// the driver in this process. After that a forked child cannot use CUDA (fork_safety.hpp), so
// ferry enters only on a path that holds a CUDA tensor or was asked for a CUDA device, and says
// which: a process that used ferry on the CPU alone can check, without a GPU, that ferry never
// entered (docs/cuda.md, "Fork and CUDA").
#pragma once

namespace ferry::cuda {

// Records that ferry is about to call into CUDA for `why`, a string literal naming the path
// ("a worker on a CUDA device", "cudaIpcOpenMemHandle"). Cheap: one atomic load once recorded.
void enter(const char* why) noexcept;

// Why ferry first entered CUDA in this process, or nullptr while it never has. A forked child
// starts at nullptr: what its parent did is fork_safety.hpp's business.
const char* first_entry() noexcept;

}  // namespace ferry::cuda
