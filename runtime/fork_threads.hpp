// The intra-op threads of a forked child. GNU libgomp, LibTorch's OpenMP on Linux, is not
// fork-safe: a thread that has run a parallel region with two or more threads keeps that team
// for the next one, and a child forked by that thread inherits the team without its threads, so
// its first parallel region waits for them for ever. PyTorch registers no fork handler for this
// (its DataLoader workers call torch.set_num_threads(1) first thing).
//
// So every child forked from a process that loaded libferry (ferry's own forks, and anyone
// else's: multiprocessing's fork context, os.fork(), a test's helper) starts with one OpenMP
// thread: a fork handler sets it in the child, through the libgomp that LibTorch itself uses.
// FERRY_FORK_THREADS=N gives it N instead, and 0 leaves what it inherited, for a program that
// knows its forking thread never ran a parallel region. The handler can do no more than that:
// at::set_num_threads() also resizes LibTorch's other pools, whose own fork handlers may not have
// run yet, and would wait there for threads the child does not have. after_fork_in_child() does
// all of it once fork() has returned; the Python package calls it in every forked child.
//
// A pool's forked workers then set their own count (PoolOptions::threads_per_worker), which is
// safe: the pool forks them from its monitor thread, which never runs a parallel region, so their
// OpenMP starts clean (docs/supervisor.md).
#pragma once

namespace ferry {

// The intra-op threads a child forked now starts with: FERRY_FORK_THREADS (0 to 4096), 1 when
// unset. Throws Error(invalid_argument) naming a bad value; the fork handler logs it and uses 1.
int fork_child_threads();

// In a child, after fork() has returned: sets LibTorch's intra-op threads (OpenMP, and MKL where
// LibTorch has it) to the count the fork handler chose; nothing when that is 0.
void after_fork_in_child();

}  // namespace ferry
