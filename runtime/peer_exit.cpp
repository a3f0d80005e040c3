#include "runtime/peer_exit.hpp"

#include "ipc/peer_segments.hpp"
#include "ipc/process.hpp"
#include "runtime/cuda_transport.hpp"
#include "runtime/received_storages.hpp"

namespace ferry {

void notify_peer_exit(pid_t pid) {
  if (process_alive(pid)) return;
  detail::relocate_from_dead(pid);
  // Mappings of segments this process only ever copied out of go too.
  drop_dead_peer_segments();
  detail::cuda_peer_exited(pid);
}

std::size_t release_dead_peers() {
  const std::size_t moved = detail::relocate_from_dead();
  drop_dead_peer_segments();
  return moved;
}

}  // namespace ferry
