#include "runtime/supervisor/result_collector.hpp"

#include <algorithm>

#include "runtime/supervisor/transfer_tally.hpp"
#include "runtime/task_error.hpp"
#include "runtime/worker_protocol.hpp"

namespace ferry::supervisor {

std::optional<std::string> ResultCollector::on_results(int w, std::vector<Tensors> batch) {
  struct Arrived {
    protocol::ResultEnvelope env;
    Tensors message;
    TaskPtr task;
  };
  std::vector<Arrived> in;
  in.reserve(batch.size());
  std::optional<std::string> why;
  for (Tensors& m : batch) {
    try {
      if (m.empty()) throw Error(Errc::bad_record, "an empty result message");
      in.push_back({protocol::unpack_result(m[0]), std::move(m), nullptr});
    } catch (const Error& e) {
      if (!why) why = "it sent a malformed result (" + e.detail() + ")";
    }
  }
  pid_t pid = -1;
  std::string device;
  bool ended = false;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    WorkerStats& ws = board_.slots[w]->stats;  // even a stale result was sent
    const Clock::time_point now = Clock::now();
    for (Arrived& a : in) {
      add_transfer_counts(ws, a.env);
      a.task = board_.book.complete(w, a.env.task_id, a.env.attempt, a.env.ok, now);
      ended = ended || a.task;
    }
    pid = ws.pid;
    device = ws.device;
    if (ended) board_.changed.notify_all();
    if (ended && board_.book.life_spent(w)) board_.monitor.rouse();  // to replace it now
  }
  // A stale result (its attempt had ended: cancelled, or timed out) has no task.
  for (Arrived& a : in) {
    if (!a.task) continue;
    std::string text;
    std::string detail;
    Tensors& message = a.message;
    if (a.env.ok) {
      message.erase(message.begin());
    } else {
      text = "(no message)";
      try {
        const std::size_t text_end =
            message.size() - std::min<std::size_t>(a.env.detail_pieces, message.size() - 1);
        if (text_end > 1) text = protocol::tensors_text(message, 1, text_end);
        detail = protocol::tensors_text(message, text_end);
      } catch (const Error& e) {
        text = e.detail();
      }
    }
    settle(*a.task, w, a.env.ok, std::move(message), text, device, pid, detail);
  }
  if (ended) dispatcher_.dispatch();  // the room those tasks left, filled once
  return why;
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
  dispatcher_.dispatch();
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
}

}  // namespace ferry::supervisor
