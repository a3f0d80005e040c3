#include "runtime/supervisor/board.hpp"

#include "runtime/task_error.hpp"

namespace ferry::supervisor {

Board::Board(int here_count, int per_worker, int max_retries, std::uint64_t tasks_per_life,
             std::size_t records_per_worker)
    : book(here_count, per_worker, max_retries, tasks_per_life, records_per_worker) {}

bool Board::is_stopping() const {
  std::lock_guard<std::mutex> lock(mu);
  return life.stopping();
}

void Board::request_kill(int w, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu);
    LocalSlot& s = *here[w];
    if (!s.tasks || !s.kill_request.empty()) return;
    s.kill_request = why;
    book.set_open(w, false);
  }
  monitor.rouse();
}

void Board::rouse_collector(int w) {
  if (w < 0 || static_cast<std::size_t>(w) >= here.size()) return;
  CollectorGate& g = here[w]->gate;
  if (g.parked && book.needs_collector(w)) g.wake.notify_one();
}

void Board::fail_every_task(const std::string& why, const std::string& device) {
  std::vector<TaskPtr> doomed;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (fatal.empty()) fatal = why;
    doomed = book.take_all();
    changed.notify_all();
  }
  for (auto& t : doomed) {
    end_task(*t, std::make_exception_ptr(
                     TaskError(Errc::worker_lost, t->name, t->index, -1, device, -1, why)));
  }
}

void end_task(Task& t, std::exception_ptr error, Tensors outputs, int worker) {
  t.inputs.clear();
  t.done(t, std::move(error), std::move(outputs), worker);
}

void end_lost(const std::vector<TaskPtr>& ended, const std::string& device) {
  for (const auto& t : ended) {
    end_task(*t, std::make_exception_ptr(
                     TaskError(Errc::worker_lost, t->name, t->index, -1, device, -1,
                               "lost with its worker on all " + std::to_string(t->attempts) +
                                   " attempt(s); the last: " + t->lost_because)));
  }
}

}  // namespace ferry::supervisor
