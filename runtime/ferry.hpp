// ferry: zero-copy PyTorch tensors between processes. Include this one header.
#pragma once

#include "ipc/error.hpp"                   // ferry::Error, ferry::Errc
#include "ipc/stats.hpp"                   // ferry::transport_stats()
#include "runtime/cuda_ipc.hpp"            // ferry::source_alive()
#include "runtime/peer_exit.hpp"           // ferry::notify_peer_exit(), ferry::release_dead_peers()
#include "runtime/pool.hpp"                // ferry::Pool, ferry::TaskError
#include "runtime/prelude.hpp"             // ferry::make_prelude()
#include "runtime/shared_allocations.hpp"  // ferry::SharedAllocations
#include "runtime/shared_module.hpp"       // ferry::share_module(), ferry::share_optimizer()
#include "runtime/shared_tensor.hpp"       // ferry::empty_shared(), ferry::arena_stats()
#include "runtime/tensor_queue.hpp"        // ferry::TensorQueue
