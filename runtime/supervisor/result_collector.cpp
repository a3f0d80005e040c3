#include "runtime/supervisor/result_collector.hpp"

#include <algorithm>

#include "runtime/supervisor/transfer_tally.hpp"
#include "runtime/task_error.hpp"
#include "runtime/worker_protocol.hpp"

namespace ferry::supervisor {

std::optional<std::string> ResultCollector::on_result(int w, Tensors message) {
  protocol::ResultEnvelope env;
  try {
    if (message.empty()) throw Error(Errc::bad_record, "an empty result message");
    env = protocol::unpack_result(message[0]);
  } catch (const Error& e) {
    return "it sent a malformed result (" + e.detail() + ")";
  }
  // What the result moved, for the depth of the worker's queue (queue_depth.hpp).
  std::uint64_t bytes = 0;
  for (std::size_t i = 1; i < message.size(); ++i) {
    if (message[i].defined()) bytes += message[i].nbytes();
  }
  TaskPtr t;
  pid_t pid = -1;
  std::string device;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    WorkerStats& ws = board_.slots[w]->stats;  // even a stale result was sent
    add_transfer_counts(ws, env);
    t = board_.book.complete(w, env.task_id, env.attempt, env.ok, Clock::now(), bytes);
    pid = ws.pid;
    device = ws.device;
    if (t) board_.changed.notify_all();
    if (t && board_.book.life_spent(w)) board_.monitor.rouse();  // to replace it now
  }
  if (!t) return std::nullopt;  // stale: that attempt had ended (cancelled, or timed out)
  std::string text;
  std::string detail;
  if (env.ok) {
    message.erase(message.begin());
  } else {
    text = "(no message)";
    try {
      const std::size_t text_end =
          message.size() - std::min<std::size_t>(env.detail_pieces, message.size() - 1);
      if (text_end > 1) text = protocol::tensors_text(message, 1, text_end);
      detail = protocol::tensors_text(message, text_end);
    } catch (const Error& e) {
      text = e.detail();
    }
  }
  settle(*t, w, env.ok, std::move(message), text, device, pid, detail);
  return std::nullopt;
}

void ResultCollector::finished(int slot, std::uint64_t task, std::uint32_t attempt, bool ok,
                               Tensors outputs, const std::string& error) {
  TaskPtr t;
  std::string device;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    t = board_.book.complete(slot, task, attempt, ok, Clock::now());
    device = board_.slots[slot]->stats.device;
    if (t) board_.changed.notify_all();
  }
  if (!t) return;  // stale: that attempt had ended
  // A remote failure's detail comes as its one uint8 tensor (RemoteEvents::finished).
  std::string detail;
  if (!ok && outputs.size() == 1) {
    try {
      detail = protocol::tensors_text(outputs, 0);
    } catch (const Error&) {
    }
  }
  settle(*t, slot, ok, ok ? std::move(outputs) : Tensors{}, error, device, -1, detail);
}

void ResultCollector::settle(supervisor::Task& t, int w, bool ok, Tensors outputs,
                             const std::string& error, const std::string& device, pid_t pid,
                             const std::string& detail) {
  if (ok) {
    end_task(t, nullptr, std::move(outputs), w);
  } else {
    end_task(t,
             std::make_exception_ptr(
                 TaskError(Errc::task_failed, t.name, t.index, w, device, pid, error, detail)),
             {}, w);
  }
  dispatcher_.dispatch();
}

}  // namespace ferry::supervisor
