#include "hosts/host_serve.hpp"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "hosts/serve_life.hpp"
#include "ipc/log.hpp"

namespace ferry::hosts {
namespace {

using Clock = std::chrono::steady_clock;

struct Reply {
  std::uint64_t seq = 0;
  bool ok = false;
  std::string error;
  Tensors outputs;
};

// What the sender thread sends, filled by the pool's threads. Shared with the pool's callbacks,
// which may run after serve_head returned (then they are dropped).
struct Outbox {
  // `starting`: the pool is still starting (its heartbeats say kStarting until say_ready()).
  explicit Outbox(bool starting) : life(starting), announce(!starting) {}

  std::mutex mu;  // guards the fields below
  std::condition_variable cv;
  std::deque<Reply> replies;
  ServeLife life;
  bool announce;  // send a heartbeat now: the head takes the first plain one as "ready"

  void push(Reply r) {
    std::lock_guard<std::mutex> lock(mu);
    if (!life.takes_results()) return;
    replies.push_back(std::move(r));
    cv.notify_all();
  }
  void say_bye() {
    std::lock_guard<std::mutex> lock(mu);
    life.leave();
    cv.notify_all();
  }
  void say_ready() {
    std::lock_guard<std::mutex> lock(mu);
    if (life.ready()) announce = true;
    cv.notify_all();
  }
};

// The sender thread's body: replies in order, heartbeats while quiet, then the goodbye.
void send_loop(HostLink& link, Outbox& box, const ServeOptions& options,
               const std::atomic<bool>& stop) {
  auto last = Clock::now();
  std::unique_lock<std::mutex> lock(box.mu);
  for (;;) {
    box.cv.wait_until(lock, last + options.heartbeat, [&] {
      return box.life.closed() || box.life.leaving() || box.announce || !box.replies.empty();
    });
    if (box.life.closed()) return;
    if (stop.load()) box.life.leave();  // noticed within one heartbeat
    std::optional<Reply> r;
    if (!box.replies.empty()) {
      r = std::move(box.replies.front());
      box.replies.pop_front();
    } else if (!box.life.leaving() && !box.announce && Clock::now() < last + options.heartbeat) {
      continue;
    }
    const bool bye = !r && box.life.leaving();
    const std::string beat = box.life.starting() ? kStarting : "";
    if (!r) box.announce = false;
    lock.unlock();
    try {
      if (r) {
        link.send(FrameKind::result, r->seq, result_body(r->ok, r->error), r->outputs);
      } else {
        link.send(bye ? FrameKind::bye : FrameKind::heartbeat, 0, bye ? "" : beat, {});
      }
    } catch (const Error& e) {
      if (e.code() != Errc::invalid_argument || !r) {
        log().warn("host: sending to the head failed: {}", e.what());
        return;  // the link is broken; the receiver finds it so too
      }
      // Outputs a link cannot carry (too many, sparse): the task fails, the link goes on.
      box.push(Reply{r->seq, false, "its outputs cannot go back to the head: " + e.detail(), {}});
    }
    last = Clock::now();
    if (bye) return;
    lock.lock();
  }
}

// The head's preludes as this host's pool knows them: one prelude of this process per head id, so
// that this host's workers get each once. The newest few are kept; one older that comes again
// is made anew (the head sends its tensors with every task).
class HeadPreludes {
 public:
  PreludePtr get(std::uint64_t id, Tensors tensors) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->first == id) {
        PreludePtr p = it->second;
        kept_.erase(it);
        kept_.emplace_back(id, p);
        return p;
      }
    }
    PreludePtr p = make_prelude(std::move(tensors));
    kept_.emplace_back(id, p);
    if (kept_.size() > kPreludesPerWorker) kept_.pop_front();
    return p;
  }

 private:
  std::mutex mu_;
  std::deque<std::pair<std::uint64_t, PreludePtr>> kept_;  // least recently used first
};

// Where tasks go: the pool once it runs; until then they wait here (the pool may still be
// starting on another thread).
struct Gate {
  std::mutex mu;
  HeadPreludes preludes;
  Pool* pool = nullptr;
  bool failed = false;  // the pool did not start: tasks are dropped, the head retries them
  std::exception_ptr error;
  std::vector<Message> waiting;
};

void hand(Pool& pool, HeadPreludes& preludes, Message m, const std::shared_ptr<Outbox>& box) {
  const std::uint64_t seq = m.frame.seq;
  try {
    const TaskBody task = parse_task_body(m.frame.body, m.tensors.size());
    PreludePtr prelude;
    if (task.prelude != 0) {
      const auto end = m.tensors.begin() + static_cast<std::ptrdiff_t>(task.prelude_tensors);
      prelude = preludes.get(task.prelude, Tensors(m.tensors.begin(), end));
      m.tensors.erase(m.tensors.begin(), end);
    }
    pool.submit(
        task.name, std::move(m.tensors),
        [box, seq](Pool::Result&& r) {
          Reply reply{seq, !r.error, {}, std::move(r.outputs)};
          if (r.error) {
            try {
              std::rethrow_exception(r.error);
            } catch (const TaskError& e) {
              reply.error = e.what();
              // The detail goes as the reply's one tensor (RemoteEvents::finished).
              if (!e.detail().empty()) {
                at::Tensor d = at::empty({static_cast<std::int64_t>(e.detail().size())}, at::kByte);
                std::memcpy(d.data_ptr(), e.detail().data(), e.detail().size());
                reply.outputs = {std::move(d)};
              }
            } catch (const std::exception& e) {
              reply.error = e.what();
            } catch (...) {
              reply.error = "an unknown exception";
            }
          }
          box->push(std::move(reply));
        },
        kForever, std::move(prelude));
  } catch (const Error& e) {
    box->push(Reply{seq, false, e.what(), {}});
  }
}

ServeEnd serve(const std::function<Pool&()>* start, Gate& gate, HostLink& link,
               const ServeOptions& options, const std::atomic<bool>& stop) {
  auto box = std::make_shared<Outbox>(start != nullptr);
  std::thread sender([&link, box, &options, &stop] { send_loop(link, *box, options, stop); });
  std::thread starter;
  if (start) {
    starter = std::thread([start, &gate, box] {
      try {
        Pool& pool = (*start)();
        std::vector<Message> waiting;
        {
          std::lock_guard<std::mutex> lock(gate.mu);
          gate.pool = &pool;
          waiting.swap(gate.waiting);
        }
        for (Message& m : waiting) hand(pool, gate.preludes, std::move(m), box);
        box->say_ready();
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(gate.mu);
          gate.failed = true;
          gate.error = std::current_exception();
          gate.waiting.clear();
        }
        box->say_bye();
      }
    });
  }
  struct Join {
    Outbox& box;
    std::thread& sender;
    std::thread& starter;
    bool graceful = false;  // let a queued goodbye go out first
    ~Join() {
      if (starter.joinable()) starter.join();  // a pool is not stopped half-started
      if (!graceful) {
        std::lock_guard<std::mutex> lock(box.mu);
        box.life.close();
        box.cv.notify_all();
      }
      sender.join();
    }
  } join{*box, sender, starter};

  for (;;) {
    Message m = link.recv(options.lost_after);
    switch (m.frame.kind) {
      case FrameKind::heartbeat:
        break;
      case FrameKind::bye: {
        bool we_left = false;
        {
          std::lock_guard<std::mutex> lock(box->mu);
          we_left = box->life.leaving();
        }
        if (we_left) return ServeEnd::stopped;  // the head answered ours
        box->say_bye();                         // answer the head's
        join.graceful = true;
        return ServeEnd::head_left;
      }
      case FrameKind::task: {
        Pool* pool = nullptr;
        {
          std::lock_guard<std::mutex> lock(gate.mu);
          if (gate.failed) break;
          if (!gate.pool) {
            gate.waiting.push_back(std::move(m));
            break;
          }
          pool = gate.pool;
        }
        hand(*pool, gate.preludes, std::move(m), box);
        break;
      }
      case FrameKind::result:
        throw Error(Errc::bad_record, "the head sent a result frame, which heads do not send");
    }
  }
}

}  // namespace

ServeEnd serve_head(Pool& pool, HostLink& link, const ServeOptions& options,
                    const std::atomic<bool>& stop) {
  Gate gate;
  gate.pool = &pool;
  return serve(nullptr, gate, link, options, stop);
}

ServeEnd serve_head(const std::function<Pool&()>& start, HostLink& link,
                    const ServeOptions& options, const std::atomic<bool>& stop) {
  Gate gate;
  ServeEnd end{};
  std::exception_ptr served;
  try {
    end = serve(&start, gate, link, options, stop);
  } catch (...) {
    served = std::current_exception();
  }
  // serve() has joined the starter: what the pool's start threw comes first, as the cause.
  if (gate.error) std::rethrow_exception(gate.error);
  if (served) std::rethrow_exception(served);
  return end;
}

}  // namespace ferry::hosts
