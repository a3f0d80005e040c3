// This machine's pool, as `ferry run` and `ferry host` both start it: the shared-memory checks
// first, so a job that cannot work stops before any worker starts, then the pool.
#pragma once

#include <optional>

#include "runtime/ferry.hpp"

namespace ferry::tools {

// The checks of `ferry-shm check` (the CUDA probe aside: it would stop this process forking),
// so a job that cannot work stops here, with the number that is wrong and the remedy, instead of
// failing later inside a worker. Error with the first failed check's code.
void check_shared_memory(unsigned workers);

// Starts this machine's pool into `pool`; options the pool refuses are the user's (BadInput).
void start_pool(std::optional<ferry::Pool>& pool, const ferry::PoolOptions& o);

}  // namespace ferry::tools
