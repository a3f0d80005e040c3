#include "hosts/head_hub.hpp"

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <utility>

#include "ipc/log.hpp"

namespace ferry::hosts {

struct HeadHub::Host {
  int slot = -1;
  HostInfo info;
  std::unique_ptr<HostLink> link;
  std::thread receiver, beater;
  std::atomic<bool> lost{false};
  bool ready = false;  // its pool runs (HeadHub::mu_): counted live, given tasks
  std::mutex mu;       // guards the fields below
  std::condition_variable wake;
  std::uint64_t next_seq = 1;
  // What each task frame sent stands for in the pool's book: (task, attempt).
  std::unordered_map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> asked;
  std::chrono::steady_clock::time_point last_sent = std::chrono::steady_clock::now();
  bool leaving = false;  // stop(): the beater says goodbye and ends

  std::string who() const { return "host " + info.name + " (slot " + std::to_string(slot) + ")"; }
};

HeadHub::HeadHub(HubOptions options) : options_(std::move(options)) {
  if (!options_.secret) {
    throw Error(Errc::invalid_argument,
                "a head needs the job's secret: pass --secret-file or set FERRY_SECRET "
                "(docs/multi-host.md, \"The secret\")");
  }
  if (options_.heartbeat.count() <= 0 || options_.heartbeat * 2 > options_.lost_after) {
    throw Error(Errc::invalid_argument,
                "heartbeat " + std::to_string(options_.heartbeat.count()) + " ms and lost_after " +
                    std::to_string(options_.lost_after.count()) +
                    " ms: the heartbeat must be positive and at most half of lost_after, or a "
                    "quiet host would be taken for a lost one");
  }
  store_ = listen_store(options_.address, options_.port, options_.join_timeout);
  LinkOptions link;
  link.address = options_.address;
  link.timeout = options_.lost_after;
  link.join_timeout = options_.join_timeout;
  door_ = std::make_unique<HeadDoor>(store_, *options_.secret, link, options_.setup);
}

HeadHub::~HeadHub() {
  try {
    stop();
  } catch (const std::exception& e) {
    log().error("stopping the hosts' hub: {}", e.what());
  }
}

std::uint16_t HeadHub::port() const {
  return store_port(store_);
}

HubStats HeadHub::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  HubStats s = stats_;
  s.refused = door_->refused();
  return s;
}

bool HeadHub::wait_for_hosts(std::size_t hosts, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, timeout, [&] { return life_.stopping() || stats_.live >= hosts; });
  return stats_.live >= hosts;
}

void HeadHub::start(RemoteEvents& events) {
  std::lock_guard<std::mutex> lock(mu_);
  life_.start();
  events_ = &events;
  admitter_ = std::thread([this] { admit_loop(); });
}

void HeadHub::admit_loop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (life_.stopping()) return;
    }
    std::optional<Joined> j;
    try {
      j = door_->admit(std::chrono::milliseconds(200));
    } catch (const std::exception& e) {
      // The door's own store is local: this is not a host's fault. Keep admitting, at a pace
      // that does not flood the log if it keeps failing.
      log().error("admitting hosts: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    if (!j) continue;
    auto h = std::make_shared<Host>();
    h->info = j->host;
    h->link = std::move(j->link);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (life_.stopping()) {
        try {
          h->link->send(FrameKind::bye, 0, "", {});
        } catch (const std::exception&) {
          // The host finds the head gone at its next heartbeat anyway.
        }
        return;
      }
    }
    h->slot = events_->joined(h->info.name, h->info.devices, h->info.capacity);
    if (h->slot < 0) {
      try {
        h->link->send(FrameKind::bye, 0, "", {});
      } catch (const std::exception&) {
        // The host finds the head gone at its next heartbeat anyway.
      }
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      hosts_.push_back(h);
      ++stats_.joined;
    }
    log().info("{} joined from {} with {} ({} tasks at once)", h->who(), h->info.address,
               h->info.devices.size(), h->info.capacity);
    Host* raw = h.get();
    h->receiver = std::thread([this, raw] { receive_loop(*raw); });
    h->beater = std::thread([this, raw] { beat_loop(*raw); });
  }
}

void HeadHub::mark_ready(Host& h) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (h.lost.load()) return;  // lose() counts it out only if it was counted in
    h.ready = true;
    ++stats_.live;
    changed_.notify_all();
  }
  log().debug("{} is ready", h.who());
  // A loss racing this is harmless: a retired slot has no room left, open or not.
  events_->ready(h.slot);
}

std::shared_ptr<HeadHub::Host> HeadHub::find(int slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& h : hosts_) {
    if (h->slot == slot) return h;
  }
  return nullptr;
}

void HeadHub::send(int slot, std::uint64_t task, std::uint32_t attempt, const std::string& name,
                   const Tensors& inputs, const Prelude* prelude) {
  const std::shared_ptr<Host> h = find(slot);
  if (!h || h->lost.load()) {
    throw Error(Errc::peer_dead, "slot " + std::to_string(slot) + " is no host that is live");
  }
  std::uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(h->mu);
    seq = h->next_seq++;
    h->asked.emplace(seq, std::make_pair(task, attempt));
    h->last_sent = std::chrono::steady_clock::now();
  }
  try {
    if (prelude) {
      // The prelude's tensors lead; the host's own pool sends them on once per worker.
      Tensors all = prelude->tensors;
      all.insert(all.end(), inputs.begin(), inputs.end());
      h->link->send(FrameKind::task, seq, task_body(name, prelude->id, prelude->tensors.size()),
                    all);
    } else {
      h->link->send(FrameKind::task, seq, task_body(name, 0, 0), inputs);
    }
  } catch (const Error& e) {
    {
      std::lock_guard<std::mutex> lock(h->mu);
      h->asked.erase(seq);
    }
    if (e.code() != Errc::invalid_argument) lose(*h, e.detail());
    throw;
  }
}

void HeadHub::receive_loop(Host& h) {
  bool ready = false;  // this thread's copy of h.ready
  try {
    for (;;) {
      Message m = h.link->recv(options_.lost_after);
      const bool starting = m.frame.kind == FrameKind::heartbeat && m.frame.body == kStarting;
      if (!ready && !starting && m.frame.kind != FrameKind::bye) {
        ready = true;
        mark_ready(h);
      }
      if (m.frame.kind == FrameKind::heartbeat) continue;
      if (m.frame.kind == FrameKind::bye) {
        lose(h, "it left");  // nothing more is sent there...
        try {
          h.link->send(FrameKind::bye, 0, "", {});  // ...but the answer it waits for
        } catch (const std::exception&) {
          // It stops at its own timeout instead.
        }
        return;
      }
      if (m.frame.kind != FrameKind::result) {
        lose(h, std::string("it sent a ") + frame_kind_name(m.frame.kind) +
                    " frame, which hosts do not send");
        return;
      }
      std::pair<std::uint64_t, std::uint32_t> asked;
      {
        std::lock_guard<std::mutex> lock(h.mu);
        const auto it = h.asked.find(m.frame.seq);
        if (it == h.asked.end()) {
          asked.first = 0;
        } else {
          asked = it->second;
          h.asked.erase(it);
        }
      }
      if (asked.first == 0) {
        lose(h, "it sent a result for task frame " + std::to_string(m.frame.seq) +
                    ", which it was not given");
        return;
      }
      const ResultBody body = parse_result_body(m.frame.body);
      events_->finished(h.slot, asked.first, asked.second, body.ok, std::move(m.tensors),
                        body.error);
    }
  } catch (const std::exception& e) {
    lose(h, e.what());
  }
}

void HeadHub::beat_loop(Host& h) {
  std::unique_lock<std::mutex> lock(h.mu);
  for (;;) {
    const auto due = h.last_sent + options_.heartbeat;
    h.wake.wait_until(lock, due, [&] { return h.leaving || h.lost.load(); });
    if (h.lost.load()) return;
    const bool bye = h.leaving;
    if (!bye && std::chrono::steady_clock::now() < h.last_sent + options_.heartbeat) continue;
    h.last_sent = std::chrono::steady_clock::now();
    lock.unlock();
    try {
      h.link->send(bye ? FrameKind::bye : FrameKind::heartbeat, 0, "", {});
    } catch (const std::exception& e) {
      lose(h, e.what());
      return;
    }
    if (bye) return;
    lock.lock();
  }
}

void HeadHub::lose(Host& h, const std::string& why) {
  if (h.lost.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.asked.clear();
    h.wake.notify_all();
  }
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping = life_.stopping();
    if (!stopping) ++stats_.lost;  // let go at the end is not lost
    if (h.ready) --stats_.live;
    changed_.notify_all();
  }
  if (stopping) {
    log().debug("{} let go at the end: {}", h.who(), why);
  } else {
    log().warn("{} lost: {}", h.who(), why);
  }
  events_->lost(h.slot, why);
}

void HeadHub::stop() {
  std::vector<std::shared_ptr<Host>> hosts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!life_.stop()) return;  // another stop() does the rest
    changed_.notify_all();
  }
  if (admitter_.joinable()) admitter_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    hosts = hosts_;
  }
  for (const auto& h : hosts) {
    std::lock_guard<std::mutex> lock(h->mu);
    h->leaving = true;
    h->wake.notify_all();
  }
  // A host answers the goodbye with its own, which ends its receiver; a frozen one is waited for
  // at most lost_after.
  for (const auto& h : hosts) {
    if (h->beater.joinable()) h->beater.join();
    if (h->receiver.joinable()) h->receiver.join();
  }
}

}  // namespace ferry::hosts
