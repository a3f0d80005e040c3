// A list of names as a message shows it: "a, b, c", or "none" for an empty list.
#pragma once

#include <string>
#include <vector>

namespace ferry {

// {"mlp", "square"} -> "mlp, square"; {} -> "none".
std::string join_names(const std::vector<std::string>& names);

}  // namespace ferry
