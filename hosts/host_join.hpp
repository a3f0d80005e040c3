// How a host joins the head of a job: through the head's store, proving the shared secret both
// ways before a link is made (docs/multi-host.md, "Joining").
//
// The steps, each a small value in the store under ferry/join/<n>/, n being the host's number
// from a counter the store increments for each joining host:
//   host  hello    its name, its address and devices, and a fresh challenge
//   head  head     the head's answer to that challenge, a challenge of its own, and the job's
//                  setup (what a host must know to start its workers), which the answer covers
//   host  proof    the host's answer, sent only if the head's answer was right (a head that does
//                  not hold the secret gets nothing from the host either), or its reason for not
//                  taking part when it cannot serve that setup
//   head  verdict  "admitted" or "refused"
// Then both make the link ferry/link/<n> (HostLink), the head as rank 0. Each answer is bound to
// the job (a random id the head puts in the store), the host's number and the role, so nothing
// recorded from one join serves in another. A host that is refused, or that stops half way, costs
// the head one timeout and is counted; its number is never reused. Every wait has a timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hosts/host_auth.hpp"
#include "hosts/host_link.hpp"

namespace ferry::hosts {

// The most tasks a host may ask to be given at once (a bad hello cannot make the head reserve
// more room than that).
inline constexpr std::size_t kMaxHostCapacity = 65536;

struct HostInfo {
  std::string name;                  // for messages and logs (the host's hostname by default)
  std::string address;               // where the head reaches its end of the link
  std::vector<std::string> devices;  // its workers' devices, e.g. "cpu", "cuda:0"
  std::size_t capacity = 1;          // tasks it takes at once (its pool's capacity)
};

struct Joined {
  std::uint64_t number = 0;  // the host's number in this job, from 1; never reused
  HostInfo host;
  std::string setup;  // on the host's side, the head's setup (proved to come from the head)
  std::unique_ptr<HostLink> link;
};

// Called by join_head with the head's setup once the head has proved the secret; throws to decline
// the job (e.g. a Python job for a host whose workers are not Python's): the head is told why.
using AcceptSetup = std::function<void(const std::string& setup)>;

// The setups of ferry's own heads: JSON whose "workers" names the workers a host's pool must have
// ("ferry": ferry-worker's tasks, as `ferry run` gives; "python": ferry.Pool's Python calls), and
// whatever else those workers need to start.
std::string workers_setup(const std::string& workers, const std::string& extra_json = "{}");
// Error(handshake) when `setup` is not a ferry setup asking for `workers`, naming the command that
// joins such a job.
void require_workers(const std::string& setup, const std::string& workers);

// The head's side: creates the job's id in `store` and admits hosts one by one, giving each the
// job's `setup` (opaque here; ferry run's and ferry.Pool's say whose workers the tasks need).
class HeadDoor {
 public:
  HeadDoor(c10::intrusive_ptr<c10d::Store> store, Secret secret, LinkOptions link_options,
           std::string setup = {});

  // The next host that proves the secret, its link made; waits at most `timeout` for one to
  // start joining (nullopt if none did). A host that fails the proof or stops answering is
  // refused, logged with its name and address, and the wait goes on for the next.
  std::optional<Joined> admit(std::chrono::milliseconds timeout);

  // Hosts turned away so far; read by any thread (the hub's stats) while admit() runs.
  std::uint64_t refused() const noexcept { return refused_.load(std::memory_order_relaxed); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  Secret secret_;
  LinkOptions link_options_;
  std::string setup_;
  std::string job_;
  std::uint64_t next_ = 1;  // the next host number to look at
  std::atomic<std::uint64_t> refused_{0};
};

// The host's side: joins the head behind `store`, proving `secret`, and makes its link.
// Error(handshake) when the head refuses this host (its secret differs) or the head's own answer
// is wrong (that head does not hold the secret: nothing more is sent to it); Error(timeout) when
// a step is not answered within `timeout`; what `accept` throws when it declines the job's setup
// (the head is told, and counts the host as refused).
Joined join_head(const c10::intrusive_ptr<c10d::Store>& store, const Secret& secret, HostInfo self,
                 LinkOptions link_options, std::chrono::milliseconds timeout,
                 const AcceptSetup& accept = {});

}  // namespace ferry::hosts
