// Where the tensors of `ferry run --input` live while the run sends them: moved into the
// supervisor's shared-memory arena once, at load, so that every task's send is zero-copy (as the
// synthetic batches are made there), or left in this process's memory and copied into the arena
// on every send. Pure, with a test per case (test/tools/input_sharing_test.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace ferry::tools {

// The shared memory the inputs may take: what the synthetic batches take at most (64 MiB), which
// the shared-memory checks before a run already count on (each process's first arena segment).
inline constexpr std::uint64_t kSharedInputBytes = std::uint64_t{64} << 20;

struct InputSharing {
  bool share = false;
  std::string why;  // for FERRY_LOG=debug: the figures the choice was made on
};

// `bytes`: the input storages a send would copy into shared memory, each counted once however
// many tasks or views name it (a storage whose views all travel inside their wire records is left
// out: a record carries them cheaper than a lease). `staged_on_device`: the run moves each batch to
// its workers' CUDA device before sending it, so the CPU copy is never sent.
InputSharing choose_input_sharing(std::uint64_t bytes, bool staged_on_device);

}  // namespace ferry::tools
