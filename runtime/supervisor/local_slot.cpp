#include "runtime/supervisor/local_slot.hpp"

#include "runtime/worker_protocol.hpp"

namespace ferry::supervisor {
namespace {

constexpr auto kSendTimeout = std::chrono::seconds(10);  // the queues are sized never to fill

}  // namespace

Delivery LocalSlot::send(const HandOver& h, std::unique_lock<std::mutex>& lock) {
  TensorQueue queue = *tasks;  // an open slot has one
  const std::uint64_t process = process_;
  protocol::TaskEnvelope env{h.task->id, h.attempt, h.task->task_index};
  const Prelude* prelude = h.task->prelude.get();
  lock.unlock();
  Delivery d;
  // The book must see this slot's prelude sends in the order they enter the queue: one at a
  // time. A task without a prelude tells the worker nothing to keep, so it takes no lock.
  std::unique_lock<std::mutex> sending(send_mu_, std::defer_lock);
  bool current = false;
  PreludeBook::Plan plan;
  if (prelude) {
    sending.lock();
    if (process > book_process_) {
      preludes_.clear();
      book_process_ = process;
    }
    // A send decided before a restart goes to the old queue, which fails: no book is consulted.
    current = process == book_process_;
    plan = current ? preludes_.plan(prelude->id) : PreludeBook::Plan{true, 0};
    env.prelude = prelude->id;
    env.forget = plan.forget;
    if (plan.attach) env.prelude_tensors = static_cast<std::uint32_t>(prelude->tensors.size());
  }
  try {
    Tensors message;
    message.reserve(1 + env.prelude_tensors + h.task->inputs.size());
    message.push_back(protocol::pack(env));
    if (plan.attach) {
      message.insert(message.end(), prelude->tensors.begin(), prelude->tensors.end());
    }
    message.insert(message.end(), h.task->inputs.begin(), h.task->inputs.end());
    // The inputs' counts: after the envelope and the prelude.
    d.inputs = queue.send(message, kSendTimeout).counts(1 + env.prelude_tensors);
    if (prelude) {
      if (current) preludes_.sent(prelude->id, plan);
      d.prelude_attached = plan.attach;
    }
  } catch (const Error& e) {
    if (e.code() == Errc::closed || e.code() == Errc::peer_dead) {
      d.kind = Delivery::Kind::gone;
    } else if (e.code() == Errc::timeout) {
      d.kind = Delivery::Kind::stuck;
      d.why = "its task queue stayed full for 10 s";
    } else {
      d.kind = Delivery::Kind::refused;
      d.error = e;
    }
  }
  return d;
}

}  // namespace ferry::supervisor
