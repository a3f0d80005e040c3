// The parts of `ferry run` and `ferry host` that span several hosts (docs/multi-host.md). Where
// this ferry was built for one machine only (FERRY_HAVE_HOSTS=0), asking for them is a BadInput
// that names what was missing, and the rest of the program does not know the difference.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "runtime/remote_workers.hpp"
#include "tools/ferry_inputs.hpp"
#include "tools/ferry_report.hpp"  // HostCounts

namespace ferry::hosts {
class HeadHub;
}

namespace ferry::tools {

// The head's side of `ferry run --listen`, or of rank 0 of a launched job: hosts may join from
// the time it is made.
class HostsHead {
 public:
  // Listens where --listen (or the launch) says and says so on stderr; without either, nothing.
  explicit HostsHead(const RunArgs& a);
  ~HostsHead();
  HostsHead(const HostsHead&) = delete;
  HostsHead& operator=(const HostsHead&) = delete;

  // What the pool reaches the hosts through (PoolOptions::remote); null without --listen.
  std::shared_ptr<ferry::RemoteWorkers> remote() const;
  // False when fewer hosts than --wait-hosts (a launch: every other rank) joined within
  // --join-timeout-ms, or a launched rank was refused (which it reports on stderr, unless a stop
  // signal cut the wait short).
  bool joined_in_time(const RunArgs& a) const;
  // The counts for the report; nullopt without --listen.
  std::optional<HostCounts> counts() const;

 private:
  bool launched_ranks_joined(const RunArgs& a) const;
  std::shared_ptr<ferry::hosts::HeadHub> hub_;
};

// Where a cluster launcher started `ferry run` (hosts/launch_env.hpp) and neither --listen,
// --join nor --launch off was given: this rank's launch, checked as far as this rank can (the job's
// secret is there, rank 0's address is this machine's); nullopt where no launcher did, or for a
// world of one. A LaunchFailure (exit 3) naming the remedy otherwise.
std::optional<ferry::hosts::Launch> launch_of(const RunArgs& a);

// `ferry host`, and every rank but 0 of a launched job: this machine's workers take tasks from a
// head elsewhere until the head's job ends (exit 0), the head is lost (3), or SIGINT/SIGTERM
// (128+N, after a goodbye to the head).
int host(const RunArgs& a);

}  // namespace ferry::tools
