// The tasks of `ferry run --input`: which tensors each task takes, from the shape of what the
// file of torch.save holds.
#pragma once

#include <string>
#include <vector>

#include "runtime/ferry.hpp"

namespace ferry::tools {

// The shapes --input takes, as --help, docs/supervisor.md and a refusal say them.
extern const char* const kInputShapes;

// Each task's input tensors, in the file's order. A tensor is one task; a list, tuple or dict
// holds one task per item (a dict's keys only name them), and an item is a tensor or a list,
// tuple or dict of tensors (a dict's in its order). Anything else is a BadInput that names the
// file, where in it ("[3]['y']", as Python indexes it), what is there, and the shapes taken.
std::vector<ferry::Tensors> load_inputs(const std::string& path);

}  // namespace ferry::tools
