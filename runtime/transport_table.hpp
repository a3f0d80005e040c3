// Which object implements each transport (internal): the one place that knows them all, so that
// TensorQueue, flush() and notify_peer_exit() know only the interface.
#pragma once

#include <array>

#include "runtime/transport/transport.hpp"

namespace ferry::detail {

// The transport that carries what choose() picked.
const Transport& transport(Carrier c);

// Every transport, for what concerns them all (in-flight counts, a peer's exit).
std::array<const Transport*, 3> all_transports();

// What choose() needs to know of tensor `t`, sent with `detached` (SendOptions).
Sending sending(const at::Tensor& t, bool detached);

}  // namespace ferry::detail
