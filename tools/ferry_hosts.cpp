#include "tools/ferry_hosts.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include "tools/local_pool.hpp"
#include "tools/stop_signals.hpp"
#if FERRY_HAVE_HOSTS
#include "hosts/head_hub.hpp"
#include "hosts/host_serve.hpp"
#endif

namespace ferry::tools {

#if FERRY_HAVE_HOSTS
namespace {

ferry::hosts::Secret load_secret(const std::string& path) {
  try {
    return ferry::hosts::Secret::load(path);
  } catch (const ferry::Error& e) {
    throw BadInput(e.detail());
  }
}

ferry::hosts::Endpoint endpoint(const std::string& text, const char* option, bool any_port) {
  try {
    return ferry::hosts::parse_endpoint(text, any_port);
  } catch (const ferry::Error& e) {
    throw BadInput(std::string(option) + ": " + e.detail());
  }
}

// The head's side of a job on several hosts: listening from here on, hosts admitted any time.
std::shared_ptr<ferry::hosts::HeadHub> listen_for_hosts(const RunArgs& a) {
  ferry::hosts::HubOptions h;
  const ferry::hosts::Endpoint at = endpoint(a.listen, "--listen", true);
  h.address = at.address;
  h.port = at.port;
  h.secret = load_secret(a.secret_file);
  h.join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  h.heartbeat = std::chrono::milliseconds(a.heartbeat_ms);
  h.lost_after = std::chrono::milliseconds(a.lost_after_ms);
  auto hub = std::make_shared<ferry::hosts::HeadHub>(std::move(h));
  std::fprintf(stderr, "ferry: listening for hosts on %s:%u (ferry host --join %s:%u)\n",
               at.address.c_str(), hub->port(), at.address.c_str(), hub->port());
  return hub;
}
}  // namespace

HostsHead::HostsHead(const RunArgs& a) {
  if (!a.listen.empty()) hub_ = listen_for_hosts(a);
}

std::shared_ptr<ferry::RemoteWorkers> HostsHead::remote() const {
  return hub_;
}

bool HostsHead::joined_in_time(const RunArgs& a) const {
  if (!hub_ || a.wait_hosts <= 0 ||
      hub_->wait_for_hosts(static_cast<std::size_t>(a.wait_hosts),
                           std::chrono::milliseconds(a.join_timeout_ms))) {
    return true;
  }
  if (!stop_signal()) {
    std::fprintf(stderr,
                 "ferry: %zu of the %d hosts asked for (--wait-hosts) joined within %d ms\n",
                 hub_->stats().live, a.wait_hosts, a.join_timeout_ms);
  }
  return false;
}

std::optional<HostCounts> HostsHead::counts() const {
  if (!hub_) return std::nullopt;
  const ferry::hosts::HubStats h = hub_->stats();
  return HostCounts{h.joined, h.lost, h.refused};
}

int host(const RunArgs& a) {
  ferry::PoolOptions o = pool_options(a);
  const ferry::hosts::Endpoint head = endpoint(a.join, "--join", false);
  const ferry::hosts::Secret secret = load_secret(a.secret_file);
  check_shared_memory(static_cast<unsigned>(o.devices.size()));
  std::optional<ferry::Pool> pool;
  start_pool(pool, o);
  std::atomic<bool> stop{false};
  const StopSignalThread signals([&] { stop = true; });

  ferry::hosts::HostInfo self;
  char hostname[256] = {};
  ::gethostname(hostname, sizeof hostname - 1);
  self.name = a.name.empty() ? hostname : a.name;
  self.address = a.address.empty() ? ferry::hosts::address_towards(head.address) : a.address;
  self.devices = o.devices;
  self.capacity = pool->capacity();
  ferry::hosts::LinkOptions link;
  link.address = self.address;
  link.timeout = std::chrono::milliseconds(a.lost_after_ms);
  link.join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  // Inputs land in shared memory (the link's receive_buffer), so this host's workers get them
  // without another copy.
  const auto join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  ferry::hosts::Joined joined = ferry::hosts::join_head(
      ferry::hosts::connect_store(head.address, head.port, join_timeout), secret, self, link,
      join_timeout,
      [](const std::string& setup) { ferry::hosts::require_workers(setup, "ferry"); });
  std::fprintf(stderr,
               "ferry host: joined the head at %s:%u as host %llu (%s, %zu tasks at once)\n",
               head.address.c_str(), head.port, static_cast<unsigned long long>(joined.number),
               self.address.c_str(), self.capacity);
  ferry::hosts::ServeOptions serve;
  serve.heartbeat = std::chrono::milliseconds(a.heartbeat_ms);
  serve.lost_after = std::chrono::milliseconds(a.lost_after_ms);
  int code = kOk;
  try {
    const ferry::hosts::ServeEnd end = ferry::hosts::serve_head(*pool, *joined.link, serve, stop);
    if (end == ferry::hosts::ServeEnd::stopped) code = 128 + stop_signal();
    std::fprintf(stderr, "ferry host: %s\n",
                 end == ferry::hosts::ServeEnd::stopped ? "stopped; the head was told"
                                                        : "the head's job ended");
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry host: lost the head: %s\n", e.what());
    code = stop_signal() ? 128 + stop_signal() : kBroken;
  }
  pool->close(ferry::Shutdown::Cancel);  // what is left runs again elsewhere: the head retries it
  return code;
}
#else
// A ferry for one machine only: FERRY_HOSTS_MISSING (tools/CMakeLists.txt) says why.

HostsHead::HostsHead(const RunArgs& a) {
  if (!a.listen.empty()) {
    throw BadInput(std::string("--listen: this ferry was built for one machine only") +
                   FERRY_HOSTS_MISSING);
  }
}

std::shared_ptr<ferry::RemoteWorkers> HostsHead::remote() const {
  return nullptr;
}
bool HostsHead::joined_in_time(const RunArgs&) const {
  return true;
}
std::optional<HostCounts> HostsHead::counts() const {
  return std::nullopt;
}

int host(const RunArgs&) {
  throw BadInput(std::string("ferry host: this ferry was built for one machine only") +
                 FERRY_HOSTS_MISSING);
}
#endif

HostsHead::~HostsHead() = default;

}  // namespace ferry::tools
