// A file that Python's torch.save wrote, read without Python: the zip archive of PyTorch 1.6 and
// later, its pickle made readable to this LibTorch first (tools/pickle_compat.hpp).
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace ferry::tools {

// What --input `path` holds, its tensors on the CPU wherever they were saved (so that this
// process never touches CUDA for them). A BadInput naming the file and saying what it is
// instead, where it is not torch.save's; LibTorch's own account of it goes to FERRY_LOG=debug.
c10::IValue read_torch_save(const std::string& path);

}  // namespace ferry::tools
