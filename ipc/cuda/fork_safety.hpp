// Whether fork is safe for CUDA: a child forked after the parent initialised the CUDA driver
// cannot use CUDA at all (every call fails, or hangs), so ferry forks only before that point.
// Plain C++: the driver is looked at through dlopen, so this works in any build and never
// initialises CUDA itself.
#pragma once

namespace ferry::cuda {

// True when the CUDA driver has been initialised in this process (by LibTorch, by ferry or by
// user code). A process that never loaded libcuda answers false without loading it.
bool initialised() noexcept;

// True in a process that was forked (by anyone) while its parent had CUDA initialised: CUDA
// must not be used here. Recorded by a pthread_atfork handler.
bool forked_after_init() noexcept;

namespace detail {
// Test hook for the *state* only: makes initialised() answer `on`, as if CUDA had been
// initialised, so the refusal path can be tested on machines without a GPU.
void simulate_initialised(bool on) noexcept;
}  // namespace detail

}  // namespace ferry::cuda
