#include "runtime/supervisor/remote_slots.hpp"

#include "ipc/log.hpp"
#include "ipc/names.hpp"

namespace ferry::supervisor {

Delivery RemoteSlot::send(const HandOver& h, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  Delivery d;
  try {
    remote_.send(h.worker, h.task->id, h.attempt, h.task->name, h.task->inputs,
                 h.task->prelude.get());
    d.prelude_attached = h.task->prelude != nullptr;  // a link carries it every time
  } catch (const Error& e) {
    if (e.code() == Errc::invalid_argument) {
      d.kind = Delivery::Kind::refused;
      d.error = e;
    } else {
      d.kind = Delivery::Kind::gone;
    }
  }
  return d;
}

int RemoteSlots::joined(const std::string& name, const std::vector<std::string>& devices,
                        std::size_t room) {
  std::lock_guard<std::mutex> lock(board_.mu);
  if (board_.life.closing()) return -1;
  const int w = board_.book.add_worker(room);
  WorkerStats ws;
  ws.id = w;
  ws.device = "host " + name + " (" + join_names(devices) + ")";
  ws.remote = true;
  ws.start = "join";
  log().info("pool: {} joined as slot {}, room for {} tasks", ws.device, w, room);
  board_.slots.push_back(std::make_unique<RemoteSlot>(std::move(ws), remote_));
  return w;
}

void RemoteSlots::ready(int slot) {
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    if (board_.life.closing()) return;
    board_.book.set_open(slot, true);
    board_.changed.notify_all();  // the capacity grew: submitters may go on
  }
  dispatcher_.dispatch();
}

void RemoteSlots::finished(int slot, std::uint64_t task, std::uint32_t attempt, bool ok,
                           Tensors outputs, const std::string& error) {
  collector_.finished(slot, task, attempt, ok, std::move(outputs), error);
}

void RemoteSlots::lost(int slot, const std::string& why) {
  std::vector<TaskPtr> ended;
  std::string device;
  {
    std::lock_guard<std::mutex> lock(board_.mu);
    WorkerStats& ws = board_.slots[slot]->stats;
    device = ws.device;
    board_.book.set_open(slot, false);
    ended = board_.book.worker_lost(slot, device + " was lost: " + why);
    board_.book.retire(slot);
    ws.last_exit = why;
    ws.given_up = true;
    if (!board_.life.stopping()) {
      log().warn("pool: {} was lost ({}); its tasks go to the others", device, why);
    }
    board_.changed.notify_all();
  }
  end_lost(ended, device);
  dispatcher_.dispatch();
}

}  // namespace ferry::supervisor
