// HeadHub: the head's side of a job spread over several hosts. It hosts the job's store, admits
// hosts that prove the secret (HeadDoor), and gives each one to a ferry::Pool as a remote slot
// (RemoteWorkers), with room for as many tasks as the host's own pool holds
// (docs/multi-host.md).
//
//   ferry::hosts::HubOptions h;
//   h.address = "10.0.0.1";  h.port = 29400;  h.secret = Secret::load(path);
//   auto hub = std::make_shared<ferry::hosts::HeadHub>(h);   // listening from here on
//   ferry::PoolOptions o;  o.remote = hub;
//   ferry::Pool pool(o);     // local workers; hosts are admitted from now on, at any time
//
// Per host: a thread receives its results and heartbeats; a thread sends a heartbeat when the
// link has been quiet for `heartbeat`, and the goodbye at stop(). A host silent for `lost_after`
// (frozen, cut off), whose link fails (killed), that sends what it was not asked for, or that
// says goodbye is lost: the pool retries its tasks elsewhere and the link is never used again
// (a host that comes back joins anew, as a new slot). Tasks' inputs on CUDA travel through the
// CPU (Gloo); results arrive as CPU tensors.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hosts/host_join.hpp"
#include "hosts/hub_life.hpp"
#include "runtime/remote_workers.hpp"

namespace ferry::hosts {

struct HubOptions {
  std::string address = "127.0.0.1";              // the store and the links listen here only
  std::uint16_t port = 0;                         // the store's port; 0: any free one (port())
  std::optional<Secret> secret;                   // required (Secret::load)
  std::chrono::milliseconds join_timeout{10000};  // each step of a join
  std::chrono::milliseconds heartbeat{500};       // a quiet link sends one this often
  std::chrono::milliseconds lost_after{5000};     // a host silent this long is lost
  // What each host is told when it joins, under the secret's proof: what it needs to start workers
  // that can run this job's tasks (a host declines a setup it cannot serve). By default ferry
  // run's: workers with ferry-worker's tasks, as `ferry host` starts; ferry.Pool gives its own.
  std::string setup = workers_setup("ferry");
};

struct HubStats {
  std::uint64_t joined = 0, refused = 0;
  std::uint64_t lost = 0;  // while the pool ran (those let go at stop() are not counted)
  std::size_t live = 0;    // joined, its pool running, and not lost
};

class HeadHub : public RemoteWorkers {
 public:
  // Starts the store on address:port. Error(system) when it cannot listen; Error(
  // invalid_argument) without a secret, or for a heartbeat not well under lost_after.
  explicit HeadHub(HubOptions options);
  ~HeadHub() override;  // stop()

  std::uint16_t port() const;  // where hosts join: ferry host --join ADDRESS:PORT
  HubStats stats() const;
  // Waits until `hosts` hosts are live (joined, their pools running, not lost); false if
  // `timeout` passed or stop() came first.
  bool wait_for_hosts(std::size_t hosts, std::chrono::milliseconds timeout) const;

  void start(RemoteEvents& events) override;
  void send(int slot, std::uint64_t task, std::uint32_t attempt, const std::string& name,
            const Tensors& inputs, const Prelude* prelude) override;
  void stop() override;

  HeadHub(const HeadHub&) = delete;
  HeadHub& operator=(const HeadHub&) = delete;

 private:
  struct Host;
  void admit_loop();
  void receive_loop(Host& h);
  void mark_ready(Host& h);
  void beat_loop(Host& h);
  void lose(Host& h, const std::string& why);
  std::shared_ptr<Host> find(int slot) const;

  HubOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<HeadDoor> door_;
  RemoteEvents* events_ = nullptr;
  std::thread admitter_;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;  // a host joined or was lost; stopping
  std::vector<std::shared_ptr<Host>> hosts_;
  HubLife life_;
  HubStats stats_;
};

}  // namespace ferry::hosts
