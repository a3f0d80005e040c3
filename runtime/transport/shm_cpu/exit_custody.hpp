// What a sender leaves behind when it exits normally (internal): the segments its queued CPU
// messages need, deposited in each queue's custody, so that it need not outlive their receivers.
#pragma once

#include "runtime/transport/transport.hpp"

namespace ferry::detail {

// Deposits, in the custody of each queue that holds one of this process's unclaimed CPU
// messages, the segments those messages name (waiting at most a second for each queue's ring
// lock). Returns what is left to wait for: leases still being pushed by another thread, and
// those of a queue that could not take its deposit.
ExitWait leave_in_custody();

}  // namespace ferry::detail
