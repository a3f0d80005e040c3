// Where a launched job's ranks meet (docs/multi-host.md, "Launched as clusters launch"): rank 0
// is the head, listening where the launcher points every rank (hosts/launch_env.hpp), and the
// others find it there. Under torchrun's own store (TORCHELASTIC_USE_AGENT_STORE, PyTorch 2.4 and
// later) that address is taken by torchrun, so rank 0 listens on a free port of the same address
// and says which in torchrun's store, where the other ranks read it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "hosts/host_store.hpp"
#include "hosts/launch_env.hpp"

namespace ferry::hosts {

// The key of torchrun's store under which rank 0 says where it listens ("ADDRESS:PORT").
inline constexpr const char* kLaunchHeadKey = "ferry/launch/head";

// Rank 0's address to listen on: the launch's head (MASTER_ADDR, SLURM's first node) resolved to
// IPv4, which must be one of this machine's. Error(invalid_argument) naming the variable, what it
// resolved to, and the likely cause (rank 0 started elsewhere, or two ranks given rank 0) when it
// is not; Error(system) when it cannot be resolved.
std::string launch_head_address(const Launch& l);

// Where rank 0 listens: the launch's own port, or (under torchrun's store) 0, any free one.
std::uint16_t launch_listen_port(const Launch& l) noexcept;

// Rank 0, once listening on `address`:`port`: under torchrun's store, says so there; Error(
// invalid_argument) when another rank said so first (two ranks given rank 0). Elsewhere nothing.
void announce_launch_head(const Launch& l, const std::string& address, std::uint16_t port,
                          std::chrono::milliseconds timeout);

// Every other rank: where the head listens, waiting for rank 0's word in torchrun's store up to
// `timeout` (Error(timeout) naming what it waited for).
Endpoint find_launch_head(const Launch& l, std::chrono::milliseconds timeout);

}  // namespace ferry::hosts
