#include "tools/input_sharing.hpp"

namespace ferry::tools {

InputSharing choose_input_sharing(std::uint64_t bytes, bool staged_on_device) {
  const std::string figures = std::to_string(bytes) + " bytes of input storages to send";
  if (staged_on_device) {
    return {false, figures + ", staged on the workers' CUDA device: the CPU copy is never sent"};
  }
  if (bytes == 0) return {false, "no input storage travels outside a wire record"};
  if (bytes > kSharedInputBytes) {
    // A run's inputs may be the size of a dataset; copied on send, only what is in flight takes
    // shared memory, which a container may have little of.
    return {false, figures + ", more than the " + std::to_string(kSharedInputBytes) +
                       " bytes they may take in shared memory: copied into it on each send"};
  }
  return {true, figures + ": moved into shared memory once, sent zero-copy"};
}

}  // namespace ferry::tools
