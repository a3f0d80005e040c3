// The CPU transport (internal): a tensor travels as a block of its sender's shared-memory arena.
//
// A tensor whose storage is a block of this process's arena is described in place (zero-copy);
// any other tensor is first copied into a fresh block (copy-on-send). Either way the block is
// kept alive by a lease until the receiver drops its view. On the receiving side a record
// becomes an at::Tensor over the owner's mapped segment, whose deleter ends the lease, or, for a
// small copied block, a copy in the receiver's own memory. What a receiver keeps never pins a
// dead sender's segments (received_storages.hpp).
#pragma once

#include <ATen/ATen.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "runtime/transport/shm_cpu/storages.hpp"
#include "runtime/transport/transport.hpp"

namespace ferry::detail {

// The transport itself (Carrier::shm_cpu).
const Transport& shm_cpu_transport();

// Describes CPU tensor `index` of a message for sending (copying it first when it cannot be
// shared in place) and takes a lease on its block in the arena's ledger.
Outgoing encode_cpu(const at::Tensor& t, std::size_t index, Arena& arena, bool detached);

// The record of arena tensor `shared`, whose storage is `block`, with a lease on the block.
Outgoing describe_in_arena(const at::Tensor& shared, std::shared_ptr<BlockHandle> block,
                           Arena& arena);

// Copied blocks smaller than this are copied on receipt (FERRY_COPY_ON_RECEIPT_BELOW, read
// once per process). Throws Error(invalid_argument) for a bad value.
std::uint64_t copy_on_receipt_below();

// Receiver, inside the pop: claims the lease of CPU record c.record and maps its segment
// (from the queue's custody when its sender has exited).
void claim_cpu(Claim& c, pid_t me, const CustodyLookup& custody);

// Builds the received tensor for a claimed record. A small copied block, or any block of a
// sender that has exited, is copied into this process's memory and its lease released at once
// (decide_receipt); otherwise the tensor is a view of the block whose deleter releases the
// lease, and its storage is noted under its sender (track_received). Throws Error(bad_record)
// when the record's block does not lie in its segment.
at::Tensor decode_cpu(Claim& c, pid_t me);

}  // namespace ferry::detail
