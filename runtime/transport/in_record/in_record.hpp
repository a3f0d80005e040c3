// The in-record transport (internal): a small CPU tensor travels inside its wire record.
//
// A tensor that the sender would copy anyway (not a block of its arena) and that fits the
// record's spare bytes (contiguous, at most wire::kInlineBytes) is copied into the record
// (wire::kFlagInline) instead of into a fresh arena block. The receiver copies it out into
// memory of its own. No block, lease, mapping or custody is involved, so nothing outlives the
// record and a dead sender leaves nothing behind: the envelopes of a pool's tasks and results and
// a Python message's small payload go this way, and each saves the arena's allocation, the
// ledger's lease and claim and the receiver's segment lookup.
#pragma once

#include "runtime/transport/transport.hpp"

namespace ferry::detail {

// The transport itself (Carrier::in_record).
const Transport& in_record_transport();

}  // namespace ferry::detail
