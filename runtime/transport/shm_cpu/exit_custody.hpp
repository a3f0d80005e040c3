// What a sender still waits for when it exits normally (internal): the CPU messages whose
// segments are not in their queue's custody. The others outlive it already: it entrusted their
// segments before it pushed them (ipc/channel.hpp).
#pragma once

#include "runtime/transport/transport.hpp"

namespace ferry::detail {

// The unclaimed CPU leases of this process that its exit would take with it: those on a queue
// whose custody does not hold their segment and the lease ledger (a queue attached without its
// custody fd, or one whose custody refused them), and those still being pushed by another
// thread. Returns how many of them are still unclaimed each time it is called.
ExitWait wait_for_uncovered();

}  // namespace ferry::detail
