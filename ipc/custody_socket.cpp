#include "ipc/custody_socket.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>

#include "ipc/control_socket.hpp"
#include "ipc/log.hpp"

namespace ferry::custody {

// Whoever holds the socket sends to its own queue and reads from it; a datagram from any other
// socket is refused (EPERM), so only the channel's holders can deposit. Its autobound abstract
// name exists only to connect to; it goes with the socket.
UniqueFd make_socket() {
  UniqueFd s(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  socklen_t len = sizeof(sa_family_t);  // autobind
  if (!s || ::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return UniqueFd();
  len = sizeof addr;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return UniqueFd();
  }
  // Every sender of the channel leaves a datagram or two here for its life: room for many (the
  // kernel caps the ask at net.core.wmem_max, which is enough for hundreds). Best effort.
  const int room = 4 << 20;
  ::setsockopt(s.get(), SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
  return s;
}

std::string name_of(int sock) {
  sockaddr_un addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  const auto path = static_cast<std::size_t>(offsetof(sockaddr_un, sun_path));
  if (len <= path + 1 || addr.sun_path[0] != '\0') return {};
  return std::string(addr.sun_path + 1, len - path - 1);
}

SocketHolders probe(const std::string& name) {
  if (name.empty() || name.size() > sizeof(sockaddr_un::sun_path) - 1) {
    return SocketHolders::unknown;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  UniqueFd s(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return SocketHolders::unknown;
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
    // The name was taken again by a socket that takes datagrams from anyone: not ours, gone.
    return SocketHolders::none;
  }
  if (errno == ECONNREFUSED || errno == ENOENT) return SocketHolders::none;
  return SocketHolders::some;  // EPERM, or anything else: keep
}

bool is_socket(int fd) {
  int type = 0;
  socklen_t type_len = sizeof type;
  sockaddr_un self{}, peer{};
  socklen_t self_len = sizeof self, peer_len = sizeof peer;
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_DGRAM &&
         ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
         ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
         self.sun_family == AF_UNIX && self_len == peer_len &&
         std::memcmp(&self, &peer, self_len) == 0;
}

// Never blocks: a full custody is a refused deposit, not a wait.
int send_deposit(int sock, const DepositHead& head, const std::uint32_t* segments, const int* fds) {
  iovec iov[2] = {{const_cast<DepositHead*>(&head), sizeof head},
                  {const_cast<std::uint32_t*>(segments), head.count * sizeof(std::uint32_t)}};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFdsPerDeposit * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(head.count * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(head.count * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds, head.count * sizeof(int));
  const std::size_t bytes = sizeof head + head.count * sizeof(std::uint32_t);
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(bytes)) return 0;
  return n < 0 ? errno : EMSGSIZE;
}

int send_deposit(int sock, const Deposit& d) {
  std::vector<int> fds;
  for (const UniqueFd& fd : d.fds) fds.push_back(fd.get());
  return send_deposit(sock, d.head, d.segments.data(), fds.data());
}

namespace {

// Reads the next datagram into `d`: taken out, or with MSG_PEEK in `flags` a copy of it (its fds
// duplicated here) that stays in the socket. 1: a whole deposit; 0: a datagram that is none
// (malformed, or its fds did not fit: logged; a dropped deposit's messages then fail as their
// sender's death would have them fail); -1: nothing more to read (`*failed` when that was an
// error).
int read_deposit(int sock, int flags, Deposit& d, bool* failed) {
  for (;;) {
    d = Deposit{};
    d.segments.resize(kMaxFdsPerDeposit);
    iovec iov[2] = {{&d.head, sizeof d.head},
                    {d.segments.data(), d.segments.size() * sizeof(std::uint32_t)}};
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxFdsPerDeposit * sizeof(int))];
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sock, &msg, flags | MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ferry::log().warn("channel custody: reading it failed: {}", std::strerror(errno));
        *failed = true;
      }
      return -1;
    }
    take_passed_fds(msg, d.fds);
    const bool whole =
        static_cast<std::size_t>(n) >= sizeof d.head && d.head.magic == kDepositMagic &&
        d.head.count <= kMaxFdsPerDeposit &&
        static_cast<std::size_t>(n) == sizeof d.head + d.head.count * sizeof(std::uint32_t) &&
        d.fds.size() == d.head.count && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0;
    if (!whole) {
      ferry::log().warn("channel custody: dropped a deposit{} (out of file descriptors?)",
                        static_cast<std::size_t>(n) >= sizeof d.head
                            ? " of pid " + std::to_string(d.head.owner_pid)
                            : std::string());
      return 0;
    }
    d.segments.resize(d.head.count);
    return 1;
  }
}

}  // namespace

std::vector<Deposit> take_deposits(int sock, bool* drained) {
  std::vector<Deposit> out;
  bool failed = false;
  for (;;) {
    Deposit d;
    const int got = read_deposit(sock, 0, d, &failed);
    if (got < 0) break;
    if (got > 0) out.push_back(std::move(d));
  }
  *drained = !failed;
  return out;
}

std::optional<std::vector<Deposit>> peek_deposits(int sock, bool* drained, std::size_t* datagrams) {
  // The peek offset is the socket's, shared by every process that holds it: set here each time,
  // as one that was killed while peeking leaves it anywhere.
  int zero = 0;
  if (::setsockopt(sock, SOL_SOCKET, SO_PEEK_OFF, &zero, sizeof zero) != 0) return std::nullopt;
  std::vector<Deposit> out;
  bool failed = false;
  *datagrams = 0;
  for (;;) {
    Deposit d;
    const int got = read_deposit(sock, MSG_PEEK, d, &failed);
    if (got < 0) break;
    ++*datagrams;
    if (got > 0) out.push_back(std::move(d));
  }
  int off = -1;
  ::setsockopt(sock, SOL_SOCKET, SO_PEEK_OFF, &off, sizeof off);
  *drained = !failed;
  return out;
}

std::size_t drop_deposits(int sock, std::size_t datagrams) {
  std::size_t dropped = 0;
  bool failed = false;
  for (; dropped < datagrams; ++dropped) {
    Deposit d;  // its fds close here
    if (read_deposit(sock, 0, d, &failed) < 0) break;
  }
  return dropped;
}

}  // namespace ferry::custody
