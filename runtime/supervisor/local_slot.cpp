#include "runtime/supervisor/local_slot.hpp"

#include "runtime/worker_protocol.hpp"

namespace ferry::supervisor {
namespace {

constexpr auto kSendTimeout = std::chrono::seconds(10);  // the queues are sized never to fill

}  // namespace

Delivery LocalSlot::send(const HandOver& h, std::unique_lock<std::mutex>& lock) {
  TensorQueue queue = *tasks;  // an open slot has one
  const protocol::TaskEnvelope env{h.task->id, h.attempt, h.task->task_index};
  lock.unlock();
  Delivery d;
  try {
    Tensors message;
    message.reserve(h.task->inputs.size() + 1);
    message.push_back(protocol::pack(env));
    message.insert(message.end(), h.task->inputs.begin(), h.task->inputs.end());
    d.inputs = queue.send(message, kSendTimeout).counts(1);  // after the envelope
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
