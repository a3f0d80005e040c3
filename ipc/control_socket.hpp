// Messages on SOCK_SEQPACKET sockets, which keep their boundaries and may carry file descriptors
// (SCM_RIGHTS). The control socket between a supervisor and one worker is a socketpair of them:
// it carries the start-up handshake and the queues' fds, and its closing end tells either side
// the other is gone. A segment fetch (segment_server.hpp) receives its answer the same way.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "ipc/fd.hpp"

namespace ferry {

// A connected pair, both ends close-on-exec.
std::pair<UniqueFd, UniqueFd> control_socket_pair();

struct ControlMessage {
  std::string bytes;
  std::vector<UniqueFd> fds;
};

// Sends one message of at most 64 KiB with up to 128 fds. Throws Error(peer_dead) when the other
// end is closed, Error(system) for any other failure.
void send_control(int sock, const std::string& bytes, const std::vector<int>& fds = {});

// Receives one message, waiting up to `timeout` (negative: forever). Throws Error(timeout),
// Error(peer_dead) when the other end closed, Error(fd_transfer) when fds were dropped because
// this process is out of descriptors.
ControlMessage recv_control(int sock, std::chrono::milliseconds timeout);

// Takes ownership of every fd that the SCM_RIGHTS data of a received `msg` carries, in order.
void take_passed_fds(msghdr& msg, std::vector<UniqueFd>& out);

}  // namespace ferry
