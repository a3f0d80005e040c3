#include "hosts/launch_meeting.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "ipc/error.hpp"

namespace ferry::hosts {
namespace {

// The launch's head variable, for messages: which variable gave rank 0's address.
std::string head_variable(const Launch& l) {
  return l.by == Launcher::slurm ? "the first node of SLURM's list (or MASTER_ADDR)"
                                 : "MASTER_ADDR";
}

std::string to_text(const std::vector<std::uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

}  // namespace

std::string launch_head_address(const Launch& l) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(l.head.c_str(), nullptr, &hints, &found); rc != 0) {
    throw Error(Errc::system, "rank 0 cannot resolve its own address '" + l.head + "' (" +
                                  head_variable(l) + "): " + ::gai_strerror(rc) +
                                  "; give an IPv4 address or a name every node resolves");
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(found, &::freeaddrinfo);
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr, text,
              sizeof text);
  // An address is this machine's when a socket can be bound to it.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(Errc::system, std::string("socket: ") + std::strerror(errno));
  sockaddr_in at = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  at.sin_port = 0;
  const bool here = ::bind(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) == 0;
  const int err = errno;
  ::close(fd);
  if (!here) {
    throw Error(Errc::invalid_argument,
                "this rank is the head, but " + head_variable(l) + " '" + l.head + "' (" + text +
                    ") is not an address of this machine (" + std::strerror(err) +
                    "): start rank 0 on the machine it names, and no other rank with rank 0");
  }
  return text;
}

std::uint16_t launch_listen_port(const Launch& l) noexcept {
  return l.agent_store ? 0 : l.port;
}

void announce_launch_head(const Launch& l, const std::string& address, std::uint16_t port,
                          std::chrono::milliseconds timeout) {
  if (!l.agent_store) return;
  const auto store = connect_store(l.head, l.port, timeout);
  if (store->add("ferry/launch/heads", 1) > 1) {
    throw Error(Errc::invalid_argument,
                "another process of this torchrun job (run " + l.run_id +
                    ") already claimed rank 0: give each rank its own RANK");
  }
  const std::string where = address + ":" + std::to_string(port);
  store->set(kLaunchHeadKey, std::vector<std::uint8_t>(where.begin(), where.end()));
}

Endpoint find_launch_head(const Launch& l, std::chrono::milliseconds timeout) {
  if (!l.agent_store) return {l.head, l.port};
  const auto store = connect_store(l.head, l.port, timeout);
  try {
    store->wait({kLaunchHeadKey}, timeout);
  } catch (const std::exception& e) {
    throw Error(Errc::timeout, "rank 0 did not say where it listens (" +
                                   std::string(kLaunchHeadKey) + " in torchrun's store at " +
                                   l.head + ":" + std::to_string(l.port) + ") within " +
                                   std::to_string(timeout.count()) + " ms: " + failure_text(e) +
                                   "; is rank 0 running ferry?");
  }
  return parse_endpoint(to_text(store->get(kLaunchHeadKey)), false);
}

}  // namespace ferry::hosts
