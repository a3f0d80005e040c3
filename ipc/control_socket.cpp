#include "ipc/control_socket.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "ipc/error.hpp"

namespace ferry {
namespace {

constexpr std::size_t kMaxBytes = 64 * 1024;
// A CUDA span's chunks travel in one message (ipc/cuda/vmm_span.hpp: kMaxSpanChunks).
constexpr std::size_t kMaxFds = 128;

}  // namespace

std::pair<UniqueFd, UniqueFd> control_socket_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    throw_errno(Errc::system, "control socketpair", errno);
  }
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

void send_control(int sock, const std::string& bytes, const std::vector<int>& fds) {
  if (bytes.size() > kMaxBytes || fds.size() > kMaxFds) {
    throw Error(Errc::invalid_argument, "control message of " + std::to_string(bytes.size()) +
                                            " bytes and " + std::to_string(fds.size()) +
                                            " fds is over the limit (64 KiB, 128 fds)");
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EPIPE || errno == ECONNRESET) {
      throw Error(Errc::peer_dead, "the other end of the control socket has closed");
    }
    throw_errno(Errc::system, "control socket sendmsg", errno);
  }
}

ControlMessage recv_control(int sock, std::chrono::milliseconds timeout) {
  pollfd p{sock, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, timeout.count() < 0 ? -1 : static_cast<int>(timeout.count()));
  } while (r < 0 && errno == EINTR);
  if (r < 0) throw_errno(Errc::system, "control socket poll", errno);
  if (r == 0) {
    throw Error(Errc::timeout,
                "no control message within " + std::to_string(timeout.count()) + " ms");
  }
  ControlMessage out;
  out.bytes.resize(kMaxBytes);
  iovec iov{out.bytes.data(), out.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno != ECONNRESET) throw_errno(Errc::system, "control socket recvmsg", errno);
  if (n <= 0) throw Error(Errc::peer_dead, "the other end of the control socket has closed");
  out.bytes.resize(static_cast<std::size_t>(n));
  take_passed_fds(msg, out.fds);
  if (msg.msg_flags & MSG_CTRUNC) {
    throw Error(Errc::fd_transfer,
                "file descriptors sent to this process were dropped on arrival: it is out of "
                "file descriptors (raise ulimit -n)");
  }
  return out;
}

void take_passed_fds(msghdr& msg, std::vector<UniqueFd>& out) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      out.emplace_back(fd);
    }
  }
}

}  // namespace ferry
