// `ferry run`: starts this machine's pool (and, with --listen, the hosts that join it), streams
// the batches through the task, and reports (tools/ferry_report.hpp).
#pragma once

#include <optional>

#include "runtime/ferry.hpp"
#include "tools/ferry_inputs.hpp"

namespace ferry::tools {

// The exit code: kOk, kTasksFailed, kBroken, or 128+N after stop signal N.
int run(const RunArgs& a);

// The checks of `ferry-shm check` (the CUDA probe aside: it would stop this process forking),
// so a job that cannot work stops here, with the number that is wrong and the remedy, instead of
// failing later inside a worker. Error with the first failed check's code.
void check_shared_memory(unsigned workers);

// Starts this machine's pool into `pool`; options the pool refuses are the user's (BadInput).
void start_pool(std::optional<ferry::Pool>& pool, const ferry::PoolOptions& o);

}  // namespace ferry::tools
