// Built with USE_C10D_GLOO and only where Gloo's headers are found (hosts/CMakeLists.txt), as the
// link is. The shims for what differs between LibTorch 1.13 and 2.x's TCPStoreOptions live here,
// the only place that makes a store.
#include "hosts/host_store.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "ipc/error.hpp"
#include "ipc/fd.hpp"

namespace ferry::hosts {
namespace {

template <class O, class = void>
struct HasUseLibUV : std::false_type {};
template <class O>
struct HasUseLibUV<O, std::void_t<decltype(std::declval<O&>().useLibUV)>> : std::true_type {};

// A template, so that 1.13, which lacks the field, compiles it.
template <class O>
void without_libuv(O& options) {
  if constexpr (HasUseLibUV<O>::value) options.useLibUV = false;
  (void)options;
}

c10d::TCPStoreOptions store_options(std::uint16_t port, bool server,
                                    std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  // 2.4 and later default useLibUV to true, and a PyTorch built without libuv (Debian's) then
  // refuses the store on either side: "use_libuv was requested but PyTorch was built without
  // libuv support". libuv's server pays off with thousands of clients; a job has a few hosts,
  // and the classic server (1.13's only one) also adopts a listening socket in every 2.x.
  without_libuv(o);
  o.port = port;
  o.isServer = server;
  o.waitWorkers = false;  // hosts come and go; no count is known
  // c10d's socket connect counts whole seconds: under one it gave up at once ("timed out after
  // 0s"), even for the head's store connecting to itself. Explicit waits keep their own timeouts.
  o.timeout = std::max<std::chrono::milliseconds>(std::chrono::ceil<std::chrono::seconds>(timeout),
                                                  std::chrono::seconds(1));
  return o;
}

// 2.x's TCPStoreOptions has masterListenFd, a listening socket its server adopts (with the
// classic server, store_options); 1.13 has none, and its server listens on every address of the
// machine.
template <class O, class = void>
struct HasListenFd : std::false_type {};
template <class O>
struct HasListenFd<O, std::void_t<decltype(std::declval<O&>().masterListenFd)>> : std::true_type {};

// Hands `fd` to the store's server; called only where HasListenFd (a template, so that 1.13,
// which lacks the fields, compiles it).
template <class O>
void adopt_listener(O& options, int fd) {
  if constexpr (HasListenFd<O>::value) {
    options.masterListenFd = fd;
  } else {
    (void)options;
    (void)fd;
  }
}

// A TCP socket listening on `address`:`port` (0: any free port) and on nothing else.
UniqueFd listener_on(const std::string& address, std::uint16_t port) {
  const std::string where = address + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    throw Error(Errc::system, "cannot start the job's store on " + where + ": " +
                                  ::gai_strerror(rc) + "; give an IPv4 address of this machine");
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(found, &::freeaddrinfo);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int on = 1;
  if (!fd || ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
      ::bind(fd.get(), found->ai_addr, found->ai_addrlen) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0) {
    throw Error(Errc::system, "cannot start the job's store on " + where + ": " +
                                  std::strerror(errno) +
                                  "; pick another port (0 for any free one) or an address of "
                                  "this machine");
  }
  return fd;
}

}  // namespace

std::string failure_text(const std::exception& e) {
  std::string what = e.what();
  const auto nl = what.find('\n');
  if (nl != std::string::npos) what.resize(nl);
  return what;
}

Endpoint parse_endpoint(const std::string& text, bool allow_any_port) {
  const auto colon = text.rfind(':');
  const std::string form = "'" + text + "' is not ADDRESS:PORT (e.g. 10.0.0.1:29400)";
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw Error(Errc::invalid_argument, form);
  }
  const std::string digits = text.substr(colon + 1);
  if (digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) {
    throw Error(Errc::invalid_argument, form + ": the port is not a number");
  }
  const unsigned long port = std::stoul(digits);
  if (port > 65535 || (port == 0 && !allow_any_port)) {
    throw Error(Errc::invalid_argument,
                form + ": the port is outside " + (allow_any_port ? "0" : "1") + "..65535");
  }
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

std::string address_towards(const std::string& peer) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(peer.c_str(), "9", &hints, &found); rc != 0) {
    throw Error(Errc::system,
                "cannot resolve '" + peer + "': " + ::gai_strerror(rc) + "; pass --address");
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(found, &::freeaddrinfo);
  // A UDP connect sends nothing; it only picks the route, and with it this side's address.
  const UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in self{};
  socklen_t len = sizeof self;
  if (!fd || ::connect(fd.get(), found->ai_addr, found->ai_addrlen) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &len) != 0) {
    throw Error(Errc::system,
                "no route to '" + peer + "': " + std::strerror(errno) + "; pass --address");
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &self.sin_addr, text, sizeof text);
  return text;
}

bool store_listens_only_where_asked() noexcept {
  return HasListenFd<c10d::TCPStoreOptions>::value;
}

c10::intrusive_ptr<c10d::Store> listen_store(const std::string& address, std::uint16_t port,
                                             std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options = store_options(port, true, timeout);
  if (store_listens_only_where_asked()) {
    UniqueFd listener = listener_on(address, port);
    sockaddr_in bound{};
    socklen_t len = sizeof bound;
    if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      throw Error(Errc::system,
                  std::string("getsockname on the store's socket: ") + std::strerror(errno));
    }
    options.port = ntohs(bound.sin_port);  // c10d checks the socket against it
    // The store's server owns the socket from here, and closes it, even when it then throws.
    adopt_listener(options, listener.release());
  }
  try {
    return c10::make_intrusive<c10d::TCPStore>(address, options);
  } catch (const std::exception& e) {
    throw Error(Errc::system, "cannot start the job's store on " + address + ":" +
                                  std::to_string(port) + ": " + failure_text(e) +
                                  "; pick another port, or 0 for any free one");
  }
}

c10::intrusive_ptr<c10d::Store> connect_store(const std::string& address, std::uint16_t port,
                                              std::chrono::milliseconds timeout) {
  try {
    return c10::make_intrusive<c10d::TCPStore>(address, store_options(port, false, timeout));
  } catch (const std::exception& e) {
    throw Error(Errc::timeout, "cannot reach the head's store at " + address + ":" +
                                   std::to_string(port) + " within " +
                                   std::to_string(timeout.count()) + " ms: " + failure_text(e) +
                                   "; check the address, the port and that the head is running");
  }
}

std::uint16_t store_port(const c10::intrusive_ptr<c10d::Store>& store) {
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(store.get());
  if (tcp == nullptr) throw Error(Errc::invalid_argument, "store_port: not a TCPStore");
  return tcp->getPort();
}

}  // namespace ferry::hosts
