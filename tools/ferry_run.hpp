// `ferry run`: starts this machine's pool (and, with --listen, the hosts that join it), streams
// the batches through the task, and reports (tools/ferry_report.hpp).
#pragma once

#include <optional>

#include "runtime/ferry.hpp"
#include "tools/ferry_inputs.hpp"

namespace ferry::tools {

// The exit code: kOk, kTasksFailed, kBroken, or 128+N after stop signal N.
int run(const RunArgs& a);

}  // namespace ferry::tools
