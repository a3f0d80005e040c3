#include "runtime/peer_exit.hpp"

#include "ipc/peer_segments.hpp"
#include "ipc/process.hpp"
#include "runtime/transport/shm_cpu/received_storages.hpp"
#include "runtime/transport_table.hpp"

namespace ferry {

void notify_peer_exit(pid_t pid) {
  if (process_alive(pid)) return;
  // What was received from it stops depending on it, in every transport; mappings of segments
  // this process only ever copied out of go too.
  for (const detail::Transport* t : detail::all_transports()) t->peer_exited(pid);
  drop_dead_peer_segments();
}

std::size_t release_dead_peers() {
  const std::size_t moved = detail::relocate_from_dead();
  drop_dead_peer_segments();
  return moved;
}

}  // namespace ferry
