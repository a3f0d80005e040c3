// The job's store: the TCPStore of c10d's that the head serves and every host connects to, where
// each link's two sides meet (host_link.hpp; docs/multi-host.md, "The link"), and the addresses
// around it. What differs between LibTorch 1.13 and 2.x's TCPStoreOptions stays in its .cpp.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

namespace ferry::hosts {

struct Endpoint {
  std::string address;
  std::uint16_t port = 0;
};
// "ADDRESS:PORT" (an IPv4 address or a name; PORT 0 only where `allow_any_port`): Error(
// invalid_argument) naming the text and the form expected.
Endpoint parse_endpoint(const std::string& text, bool allow_any_port);

// This machine's address on the route to `peer` (what the peer reaches it at), found the way a
// UDP socket would send there; Error(system) naming the peer when there is no route.
std::string address_towards(const std::string& peer);

// The head's store: a TCPStore server listening on `address`:`port` (port 0: any free one, see
// store_port), and on no other address where store_listens_only_where_asked(). Error(system)
// naming the address when it cannot listen.
c10::intrusive_ptr<c10d::Store> listen_store(const std::string& address, std::uint16_t port,
                                             std::chrono::milliseconds timeout);
// Whether this build's c10d lets the store listen on one address (2.x's masterListenFd): with
// LibTorch 1.13 its server listens on every address of the machine, whatever address is given.
bool store_listens_only_where_asked() noexcept;
// A host's connection to the head's store; Error(timeout) naming the address when it cannot
// reach it within `timeout`.
c10::intrusive_ptr<c10d::Store> connect_store(const std::string& address, std::uint16_t port,
                                              std::chrono::milliseconds timeout);
// The port a store from listen_store listens on.
std::uint16_t store_port(const c10::intrusive_ptr<c10d::Store>& store);

// The first line of what c10d, Gloo or LibTorch threw: a c10::Error appends its backtrace.
std::string failure_text(const std::exception& e);

}  // namespace ferry::hosts
