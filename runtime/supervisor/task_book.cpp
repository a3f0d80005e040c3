#include "runtime/supervisor/task_book.hpp"

#include <algorithm>

#include "ipc/error.hpp"

namespace ferry::supervisor {

TaskBook::TaskBook(int workers, int per_worker, int max_retries, std::uint64_t tasks_per_life,
                   std::size_t records_per_worker)
    : capacity_(0),
      max_retries_(static_cast<std::uint32_t>(max_retries)),
      tasks_per_life_(tasks_per_life),
      workers_(static_cast<std::size_t>(workers)) {
  for (Worker& w : workers_) {
    if (per_worker == 0) w.depth.emplace();
    w.limit = w.depth ? w.depth->depth() : static_cast<std::size_t>(per_worker);
    w.record_room = records_per_worker;
    capacity_ += w.limit;
  }
}

std::size_t TaskBook::records_of(const Task& t) noexcept {
  return 1 + t.inputs.size() + (t.prelude ? t.prelude->tensors.size() : 0);
}

TaskId TaskBook::admit(TaskPtr task, Clock::time_point now) {
  task->id = next_id_++;
  task->admitted = now;
  task->attempts = 0;
  task->worker = -1;
  task->records = records_of(*task);
  task->input_bytes = 0;
  for (const at::Tensor& t : task->inputs) {
    if (t.defined()) task->input_bytes += t.nbytes();
  }
  open_.emplace(task->id, task);
  pending_.push_back(std::move(task));
  ++admitted_;
  return next_id_ - 1;
}

void TaskBook::set_open(int worker, bool open) {
  workers_.at(worker).open = open;
}

void TaskBook::begin_life(int worker) {
  workers_.at(worker).given = 0;
}

bool TaskBook::life_spent(int worker) const {
  const Worker& w = workers_.at(worker);
  return life_ended(w) && w.handed.empty();
}

int TaskBook::add_worker(std::size_t limit) {
  workers_.emplace_back();
  workers_.back().limit = limit;
  workers_.back().timed = false;
  capacity_ += limit;
  return static_cast<int>(workers_.size()) - 1;
}

void TaskBook::retire(int worker) {
  Worker& w = workers_.at(worker);
  if (!w.handed.empty()) {
    throw Error(Errc::invalid_argument, "task book: worker " + std::to_string(worker) +
                                            " retired with tasks still handed to it");
  }
  w.open = false;
  capacity_ -= w.limit;
  w.limit = 0;
  w.depth.reset();
}

std::optional<HandOver> TaskBook::next_hand_over(Clock::time_point now) {
  if (pending_.empty()) return std::nullopt;
  const TaskPtr& task = pending_.front();
  int best = -1;
  // Least loaded first; a retry goes elsewhere than where it was lost when it can.
  auto rank = [&](int w) {
    return std::make_pair(w == task->last_worker, workers_[w].handed.size());
  };
  for (int w = 0; w < static_cast<int>(workers_.size()); ++w) {
    const Worker& x = workers_[w];
    if (!x.open || x.handed.size() >= x.limit || life_ended(x)) continue;
    // A task alone always fits: the room is sized for the largest task a queue can carry.
    if (x.record_room != 0 && !x.handed.empty() && x.records + task->records > x.record_room) {
      continue;
    }
    if (best < 0 || rank(w) < rank(best)) best = w;
  }
  if (best < 0) return std::nullopt;
  HandOver h;
  h.task = task;
  pending_.pop_front();
  Worker& w = workers_[best];
  if (w.handed.empty()) w.head_since = now;
  w.handed.push_back(h.task->id);
  w.records += h.task->records;
  if (h.task->awaited) ++w.awaited;
  ++w.given;
  h.task->worker = best;
  h.attempt = ++h.task->attempts;
  h.worker = best;
  h.first = h.attempt == 1;
  return h;
}

TaskPtr TaskBook::end(TaskId id) {
  const auto it = open_.find(id);
  TaskPtr t = std::move(it->second);
  open_.erase(it);
  return t;
}

TaskPtr TaskBook::complete(int worker, TaskId id, std::uint32_t attempt, bool ok,
                           Clock::time_point now, std::uint64_t result_bytes) {
  const auto it = open_.find(id);
  if (it == open_.end() || it->second->worker != worker || it->second->attempts != attempt) {
    return nullptr;  // ended already (cancelled, or lost and retried elsewhere)
  }
  Worker& w = workers_.at(worker);
  const bool was_head = !w.handed.empty() && w.handed.front() == id;
  if (was_head) {
    w.handed.pop_front();  // a worker runs its tasks in order: the usual case
  } else {
    w.handed.erase(std::remove(w.handed.begin(), w.handed.end(), id), w.handed.end());
  }
  unhand(w, *it->second);
  if (was_head) {
    if (w.depth) {
      w.depth->record(now - w.head_since, it->second->input_bytes + result_bytes);
      const std::size_t limit = w.depth->depth();
      capacity_ = capacity_ - w.limit + limit;
      w.limit = limit;
    }
    w.head_since = now;
  }
  if (ok) {
    ++w.counts.done;
    ++completed_;
  } else {
    ++w.counts.failed;
    ++failed_;
  }
  return end(id);
}

TaskPtr TaskBook::hand_over_failed(const HandOver& h) {
  const auto it = open_.find(h.task->id);
  if (it == open_.end() || h.task->worker != h.worker || h.task->attempts != h.attempt) {
    return nullptr;
  }
  Worker& w = workers_.at(h.worker);
  w.handed.erase(std::remove(w.handed.begin(), w.handed.end(), h.task->id), w.handed.end());
  unhand(w, *h.task);
  if (w.given > 0) --w.given;  // it never reached the process
  ++failed_;
  return end(h.task->id);
}

std::vector<TaskPtr> TaskBook::worker_lost(int worker, const std::string& reason) {
  Worker& w = workers_.at(worker);
  std::vector<TaskPtr> ended, retry;
  for (TaskId id : w.handed) {
    const auto it = open_.find(id);
    if (it == open_.end()) continue;
    TaskPtr t = it->second;
    t->worker = -1;
    t->last_worker = worker;
    t->lost_because = reason;
    ++w.counts.lost;
    if (t->attempts > max_retries_) {
      ended.push_back(end(id));
      ++failed_;
    } else {
      retry.push_back(std::move(t));
    }
  }
  w.handed.clear();
  w.records = 0;
  w.awaited = 0;
  // Back to the front, in their old order, so a retry does not wait behind newer work.
  pending_.insert(pending_.begin(), retry.begin(), retry.end());
  retried_ += retry.size();
  return ended;
}

std::vector<TaskPtr> TaskBook::take_all() {
  std::vector<TaskPtr> all;
  all.reserve(open_.size());
  for (auto& [id, t] : open_) all.push_back(std::move(t));
  std::sort(all.begin(), all.end(),
            [](const TaskPtr& a, const TaskPtr& b) { return a->id < b->id; });
  failed_ += all.size();
  open_.clear();
  pending_.clear();
  for (Worker& w : workers_) {
    w.handed.clear();
    w.records = 0;
    w.awaited = 0;
  }
  return all;
}

int TaskBook::stop_awaiting(TaskId id) {
  const auto it = open_.find(id);
  if (it == open_.end() || !it->second->awaited) return -1;
  Task& t = *it->second;
  t.awaited = false;
  if (t.worker < 0) return -1;
  Worker& w = workers_.at(t.worker);
  if (w.awaited > 0) --w.awaited;
  return t.worker;
}

std::vector<std::pair<int, TaskPtr>> TaskBook::overdue(Clock::time_point now,
                                                       std::chrono::milliseconds limit) const {
  std::vector<std::pair<int, TaskPtr>> due;
  if (limit.count() <= 0) return due;
  for (int w = 0; w < static_cast<int>(workers_.size()); ++w) {
    const Worker& x = workers_[w];
    if (!x.timed || x.handed.empty() || now - x.head_since < limit) continue;
    const auto it = open_.find(x.handed.front());
    if (it != open_.end()) due.emplace_back(w, it->second);
  }
  return due;
}

std::optional<Clock::time_point> TaskBook::next_deadline(std::chrono::milliseconds limit) const {
  std::optional<Clock::time_point> next;
  if (limit.count() <= 0) return next;
  for (const Worker& x : workers_) {
    if (!x.timed || x.handed.empty()) continue;
    const auto due = x.head_since + limit;
    if (!next || due < *next) next = due;
  }
  return next;
}

}  // namespace ferry::supervisor
