// The outcome of a CUDA call as ferry's CUDA layer reports it (ipc_api.hpp, vmm_api.hpp), with
// no CUDA type in it. Its own header, so the files beside those layers use it without them.
#pragma once

#include <string>

namespace ferry::cuda {

// The outcome of a call: ok, or the CUDA error's name and text.
struct Status {
  int code = 0;       // cudaError_t; 0 is success
  std::string error;  // "cudaIpcOpenMemHandle: cudaErrorAlreadyMapped (...)"; empty when ok
  bool ok() const noexcept { return code == 0; }
  bool already_mapped() const noexcept;  // cudaErrorAlreadyMapped
};

}  // namespace ferry::cuda
