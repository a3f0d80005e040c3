// What a process can ask and tell ferry about CUDA tensors it received from peers.
#pragma once

#include <ATen/ATen.h>

namespace ferry {

// False when `t` is a view on a peer's CUDA memory and that peer has exited: the memory may be
// gone, and ferry refuses to send it on (Error peer_dead). True for every other tensor.
// Exits are noticed within about 100 ms, or at once after notify_peer_exit() (peer_exit.hpp).
bool source_alive(const at::Tensor& t);

}  // namespace ferry
