#include "runtime/hosts/host_serve.hpp"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

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
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Reply> replies;
  bool bye = false;     // say goodbye once what is queued is sent
  bool closed = false;  // serve_head is returning: send nothing more

  void push(Reply r) {
    std::lock_guard<std::mutex> lock(mu);
    if (closed || bye) return;
    replies.push_back(std::move(r));
    cv.notify_all();
  }
  void say_bye() {
    std::lock_guard<std::mutex> lock(mu);
    bye = true;
    cv.notify_all();
  }
};

// The sender thread's body: replies in order, heartbeats while quiet, then the goodbye.
void send_loop(HostLink& link, Outbox& box, const ServeOptions& options,
               const std::atomic<bool>& stop) {
  auto last = Clock::now();
  std::unique_lock<std::mutex> lock(box.mu);
  for (;;) {
    box.cv.wait_until(lock, last + options.heartbeat,
                      [&] { return box.closed || box.bye || !box.replies.empty(); });
    if (box.closed) return;
    if (stop.load() && !box.bye) box.bye = true;  // noticed within one heartbeat
    std::optional<Reply> r;
    if (!box.replies.empty()) {
      r = std::move(box.replies.front());
      box.replies.pop_front();
    } else if (!box.bye && Clock::now() < last + options.heartbeat) {
      continue;
    }
    const bool bye = !r && box.bye;
    lock.unlock();
    try {
      if (r) {
        std::vector<at::Tensor> cpu;
        for (const at::Tensor& t : r->outputs) cpu.push_back(t.is_cuda() ? t.cpu() : t);
        link.send(FrameKind::result, r->seq, result_body(r->ok, r->error), cpu);
      } else {
        link.send(bye ? FrameKind::bye : FrameKind::heartbeat, 0, "", {});
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

}  // namespace

ServeEnd serve_head(Pool& pool, HostLink& link, const ServeOptions& options,
                    const std::atomic<bool>& stop) {
  auto box = std::make_shared<Outbox>();
  std::thread sender([&link, box, &options, &stop] { send_loop(link, *box, options, stop); });
  struct Join {
    Outbox& box;
    std::thread& t;
    bool graceful = false;  // let a queued goodbye go out first
    ~Join() {
      if (!graceful) {
        std::lock_guard<std::mutex> lock(box.mu);
        box.closed = true;
        box.cv.notify_all();
      }
      t.join();
    }
  } join{*box, sender};

  for (;;) {
    Message m = link.recv(options.lost_after);
    switch (m.frame.kind) {
      case FrameKind::heartbeat:
        break;
      case FrameKind::bye: {
        bool we_left = false;
        {
          std::lock_guard<std::mutex> lock(box->mu);
          we_left = box->bye;
        }
        if (we_left) return ServeEnd::stopped;  // the head answered ours
        box->say_bye();                         // answer the head's
        join.graceful = true;
        return ServeEnd::head_left;
      }
      case FrameKind::task: {
        const std::uint64_t seq = m.frame.seq;
        try {
          pool.submit(m.frame.body, std::move(m.tensors), [box, seq](Pool::Result&& r) {
            Reply reply{seq, !r.error, {}, std::move(r.outputs)};
            if (r.error) {
              try {
                std::rethrow_exception(r.error);
              } catch (const std::exception& e) {
                reply.error = e.what();
              } catch (...) {
                reply.error = "an unknown exception";
              }
            }
            box->push(std::move(reply));
          });
        } catch (const Error& e) {
          box->push(Reply{seq, false, e.what(), {}});
        }
        break;
      }
      case FrameKind::result:
        throw Error(Errc::bad_record, "the head sent a result frame, which heads do not send");
    }
  }
}

}  // namespace ferry::hosts
