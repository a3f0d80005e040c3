// What becomes of tensors received from a process that exits.
//
// A received tensor is, unless it was small enough to be copied on receipt, a view of its
// sender's shared memory. When the sender exits, ferry moves each such CPU tensor still alive
// into this process's own memory (its values and every view of it stay as they were) so the
// sender's segments can be unmapped: what a process keeps costs what it holds, not the sender's
// whole segments. This happens on its own in TensorQueue::recv() (at most every 100 ms) and in a
// Pool when it reaps a worker; the calls below are for a process that knows of an exit first, or
// that holds tensors and receives nothing more.
//
// A write to such a tensor by another thread while it is being moved can be lost (it lands in
// the old memory after the copy); reads see the same values before and after.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace ferry {

// Tells ferry that process `pid` exited (a supervisor knows first): CPU tensors received from it
// move into this process's memory and its segments are let go, and views on its CUDA memory are
// marked (see source_alive()). Nothing happens while `pid` is still alive.
void notify_peer_exit(pid_t pid);

// Does the same for every sender that has exited; returns how many storages were moved. For a
// process that keeps received tensors but calls recv() no more.
std::size_t release_dead_peers();

}  // namespace ferry
