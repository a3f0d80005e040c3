// A channel's custody as bytes on a socket (internal): the segment fds senders entrusted, in
// flight as SCM_RIGHTS datagrams (ipc/channel.hpp says what custody is for). The callers hold
// the ring lock, which orders every reader and writer of the socket.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <string>

#include "ipc/fd.hpp"
#include "ipc/peer_roles.hpp"

namespace ferry::custody {

// SCM_MAX_FD is 253: a sender with more segments than this leaves several deposits.
inline constexpr std::size_t kMaxFdsPerDeposit = 250;

// One datagram in the custody socket: this, then `count` segment numbers, with `count` fds.
struct DepositHead {
  std::uint64_t magic;
  std::uint64_t owner_token;
  std::int32_t owner_pid;
  std::uint32_t count;
};
inline constexpr std::uint64_t kDepositMagic = 0x3253554359525246ull;  // "FRRYCUS2"

struct Deposit {
  DepositHead head{};
  std::vector<std::uint32_t> segments;
  std::vector<UniqueFd> fds;
};

// A Unix datagram socket connected to itself; empty (errno set) when one cannot be made.
UniqueFd make_socket();
// Whether `fd` is such a socket (what a channel attached with a custody fd checks it is given).
bool is_socket(int fd);
// The socket's abstract name (its bytes after the leading NUL); empty when it has none.
std::string name_of(int sock);
// Whether a socket of that name still exists, asked by connecting to it: some process holds it
// while the kernel refuses the connection (EPERM: it is connected to itself), none once no such
// name is left (ECONNREFUSED). Nothing is sent.
SocketHolders probe(const std::string& name);

// Sends one deposit of `head.count` segments and their fds; never blocks. 0, or the errno of a
// refusal: EAGAIN (full), ETOOMANYREFS (this user has more fds in flight than its fd limit).
int send_deposit(int sock, const DepositHead& head, const std::uint32_t* segments, const int* fds);
int send_deposit(int sock, const Deposit& d);

// Every deposit in the socket, taken out of it: the caller sends back what is still needed. A
// malformed datagram, or one whose fds this process had no room for, is dropped (logged).
// `*drained`: nothing is left unread. A process killed before it has sent them back takes them
// with it: peek_deposits() is the way that cannot lose one; this, where the kernel has no peek
// offset for the socket.
std::vector<Deposit> take_deposits(int sock, bool* drained);
// Every deposit in the socket, copied (its fds duplicated into this process) and left there, as
// are malformed datagrams (logged, not returned); `*datagrams` counts what was read, both kinds.
// nullopt where the socket takes no peek offset (SO_PEEK_OFF).
std::optional<std::vector<Deposit>> peek_deposits(int sock, bool* drained, std::size_t* datagrams);
// Takes the first `datagrams` datagrams out of the socket and closes their fds; how many it took.
// A caller that rewrites the custody sends what it keeps first, then drops what it read: killed
// in between, it leaves a deposit twice, never none.
std::size_t drop_deposits(int sock, std::size_t datagrams);

}  // namespace ferry::custody
