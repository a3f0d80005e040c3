#include "tools/ferry_hosts.hpp"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "tools/local_pool.hpp"
#include "tools/stop_signals.hpp"
#if FERRY_HAVE_HOSTS
#include "hosts/head_hub.hpp"
#include "hosts/host_serve.hpp"
#include "hosts/launch_meeting.hpp"
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

ferry::hosts::HubOptions hub_options(const RunArgs& a) {
  ferry::hosts::HubOptions h;
  h.secret = load_secret(a.secret_file);
  h.join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  h.heartbeat = std::chrono::milliseconds(a.heartbeat_ms);
  h.lost_after = std::chrono::milliseconds(a.lost_after_ms);
  return h;
}

// The head's side of a job on several hosts: listening from here on, hosts admitted any time.
std::shared_ptr<ferry::hosts::HeadHub> listen_for_hosts(const RunArgs& a) {
  ferry::hosts::HubOptions h = hub_options(a);
  const ferry::hosts::Endpoint at = endpoint(a.listen, "--listen", true);
  h.address = at.address;
  h.port = at.port;
  auto hub = std::make_shared<ferry::hosts::HeadHub>(std::move(h));
  std::fprintf(stderr, "ferry: listening for hosts on %s:%u (ferry host --join %s:%u)\n",
               at.address.c_str(), hub->port(), at.address.c_str(), hub->port());
  return hub;
}

// Rank 0 of a launched job: listens where the launcher points every rank. The setup names the
// task, so that a rank given another one declines rather than runs it.
std::shared_ptr<ferry::hosts::HeadHub> listen_as_rank0(const RunArgs& a) {
  const ferry::hosts::Launch& l = *a.launch;
  ferry::hosts::HubOptions h = hub_options(a);
  const std::string here = ferry::hosts::launch_head_address(l);
  h.address = here;
  h.port = ferry::hosts::launch_listen_port(l);
  h.setup = ferry::hosts::workers_setup("ferry", nlohmann::json{{"task", a.task}}.dump());
  std::shared_ptr<ferry::hosts::HeadHub> hub;
  try {
    hub = std::make_shared<ferry::hosts::HeadHub>(std::move(h));
  } catch (const ferry::Error& e) {
    throw LaunchFailure(l.describe() + ", the head: " + e.detail() +
                        " (another process holds that port: a second rank given rank 0, or "
                        "another job; choose another " +
                        l.port_from + ")");
  }
  const auto timeout = std::chrono::milliseconds(a.join_timeout_ms);
  ferry::hosts::announce_launch_head(l, here, hub->port(), timeout);
  std::fprintf(stderr, "ferry: %s: the head, on %s:%u; waiting for the other %d rank(s)\n",
               l.describe().c_str(), here.c_str(), hub->port(), l.world_size - 1);
  return hub;
}

// A launched rank's check of the head's setup: the task it was given is the head's.
void require_same_task(const std::string& setup, const RunArgs& a) {
  std::string theirs;
  try {
    theirs = nlohmann::json::parse(setup).at("task").get<std::string>();
  } catch (const std::exception&) {
    throw ferry::Error(ferry::Errc::handshake,
                       "the head at the launch's address is not rank 0 of a launched ferry run "
                       "(a `ferry run --listen` of another job?)");
  }
  if (theirs != a.task) {
    throw ferry::Error(ferry::Errc::handshake, "ranks disagree on the task: this " +
                                                   a.launch->describe() + " was given --task " +
                                                   a.task + ", rank 0 runs " + theirs +
                                                   "; give every rank the same command");
  }
}
}  // namespace

std::optional<ferry::hosts::Launch> launch_of(const RunArgs& a) {
  if (!a.listen.empty() || !a.join.empty() || a.launch_mode == "off") return std::nullopt;
  std::optional<ferry::hosts::Launch> l;
  try {
    l = ferry::hosts::read_launch(ferry::hosts::process_environment());
    if (!l) return l;
    (void)ferry::hosts::Secret::load(a.secret_file);
    if (l->is_head()) (void)ferry::hosts::launch_head_address(*l);
  } catch (const ferry::Error& e) {
    throw LaunchFailure((l ? l->describe() + ": " : std::string("a launched job: ")) + e.detail());
  }
  return l;
}

HostsHead::HostsHead(const RunArgs& a) {
  if (a.launch) {
    hub_ = listen_as_rank0(a);
  } else if (!a.listen.empty()) {
    hub_ = listen_for_hosts(a);
  }
}

std::shared_ptr<ferry::RemoteWorkers> HostsHead::remote() const {
  return hub_;
}

bool HostsHead::joined_in_time(const RunArgs& a) const {
  if (hub_ && a.launch) return launched_ranks_joined(a);
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

// Rank 0 waits for every other rank, and fails at once where one was refused or declined (a
// different task or secret): its launcher would otherwise see a job that never starts.
bool HostsHead::launched_ranks_joined(const RunArgs& a) const {
  const ferry::hosts::Launch& l = *a.launch;
  const auto others = static_cast<std::size_t>(l.world_size - 1);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(a.join_timeout_ms);
  for (;;) {
    const ferry::hosts::HubStats h = hub_->stats();
    if (h.live >= others) return true;
    if (stop_signal()) return false;
    if (h.refused > 0) {
      std::fprintf(stderr,
                   "ferry: %s: %llu rank(s) were refused or declined the job (a different "
                   "--task or secret: their own stderr says which); %zu of the other %zu "
                   "joined\n",
                   l.describe().c_str(), static_cast<unsigned long long>(h.refused), h.live,
                   others);
      return false;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(
          stderr,
          "ferry: %s: %zu of the other %zu rank(s) joined within %d ms "
          "(--join-timeout-ms): are they all running, with the same %s and secret?\n",
          l.describe().c_str(), h.live, others, a.join_timeout_ms,
          l.by == ferry::hosts::Launcher::slurm ? "SLURM step" : "MASTER_ADDR:MASTER_PORT");
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<HostCounts> HostsHead::counts() const {
  if (!hub_) return std::nullopt;
  const ferry::hosts::HubStats h = hub_->stats();
  return HostCounts{h.joined, h.lost, h.refused};
}

int host(const RunArgs& a) {
  ferry::PoolOptions o = pool_options(a);
  const auto join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  const ferry::hosts::Endpoint head = a.launch
                                          ? ferry::hosts::find_launch_head(*a.launch, join_timeout)
                                          : endpoint(a.join, "--join", false);
  const ferry::hosts::Secret secret = load_secret(a.secret_file);
  check_shared_memory(static_cast<unsigned>(o.devices.size()));
  std::optional<ferry::Pool> pool;
  start_pool(pool, o);
  std::atomic<bool> stop{false};
  const StopSignalThread signals([&] { stop = true; });

  ferry::hosts::HostInfo self;
  char hostname[256] = {};
  ::gethostname(hostname, sizeof hostname - 1);
  self.name = !a.name.empty() ? a.name
              : a.launch      ? std::string(hostname) + "/rank" + std::to_string(a.launch->rank)
                              : std::string(hostname);
  self.address = a.address.empty() ? ferry::hosts::address_towards(head.address) : a.address;
  self.devices = o.devices;
  self.capacity = pool->capacity();
  ferry::hosts::LinkOptions link;
  link.address = self.address;
  link.timeout = std::chrono::milliseconds(a.lost_after_ms);
  link.join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  // Inputs land in shared memory (the link's receive_buffer), so this host's workers get them
  // without another copy.
  ferry::hosts::Joined joined =
      ferry::hosts::join_head(ferry::hosts::connect_store(head.address, head.port, join_timeout),
                              secret, self, link, join_timeout, [&a](const std::string& setup) {
                                ferry::hosts::require_workers(setup, "ferry");
                                if (a.launch) require_same_task(setup, a);
                              });
  std::fprintf(stderr,
               "ferry host: joined the head at %s:%u as host %llu (%s, %zu tasks at once)%s%s\n",
               head.address.c_str(), head.port, static_cast<unsigned long long>(joined.number),
               self.address.c_str(), self.capacity, a.launch ? ", as " : "",
               a.launch ? a.launch->describe().c_str() : "");
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

std::optional<ferry::hosts::Launch> launch_of(const RunArgs& a) {
  if (!a.listen.empty() || !a.join.empty() || a.launch_mode == "off") return std::nullopt;
  std::optional<ferry::hosts::Launch> l;
  try {
    l = ferry::hosts::read_launch(ferry::hosts::process_environment());
  } catch (const ferry::Error& e) {
    throw LaunchFailure(std::string("a launched job: ") + e.detail());
  }
  if (l) {
    throw LaunchFailure(l->describe() + ": this ferry was built for one machine only" +
                        FERRY_HOSTS_MISSING);
  }
  return l;
}

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
bool HostsHead::launched_ranks_joined(const RunArgs&) const {
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
