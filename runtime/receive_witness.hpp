// A test's view of a receive from inside the pop (internal; the chaos soak's). A consumer killed
// between the pop's commit and recv()'s return takes the message with it, and nothing outside it
// can tell that message from a lost one. The witness runs inside the pop, before its commit, with
// the records of the message being taken: a consumer that notes them there, somewhere that
// outlives it, leaves a record of everything it could have taken with it. Killed before the
// commit, it leaves the message in the queue for the next consumer instead.
#pragma once

#include <cstdint>

#include "ipc/wire.hpp"

namespace ferry::detail {

using ReceiveWitness = void (*)(const wire::Record* records, std::uint32_t count) noexcept;
// Sets this process's witness (nullptr: none). One relaxed load per receive when unset.
void set_receive_witness(ReceiveWitness witness) noexcept;

}  // namespace ferry::detail
