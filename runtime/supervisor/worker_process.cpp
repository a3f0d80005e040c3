#include "runtime/supervisor/worker_process.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "ipc/control_socket.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/names.hpp"
#include "ipc/process.hpp"

namespace ferry::supervisor {
namespace {

std::string who(int id, const std::string& device) {
  return "worker " + std::to_string(id) + " (" + device + ")";
}

// A collector wakes this often while it waits for results, to see whether it is still needed.
constexpr std::chrono::milliseconds kCollectSlice{100};

int reap_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

void discard_queued(TensorQueue& q) {
  q.close();
  for (;;) {
    try {
      q.recv(std::chrono::milliseconds(0));
    } catch (const Error&) {
      if (q.size() == 0) return;
    }
  }
}

WorkerProcess::WorkerProcess(int id, std::string device) : id_(id), device_(std::move(device)) {}

WorkerProcess::~WorkerProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    reap_status(pid_);
  }
  stop_collector();
}

std::optional<StartFailure> WorkerProcess::launch(const LaunchSpec& spec, std::vector<int> others,
                                                  pid_t supervisor) {
  const std::string name = who(id_, device_);
  kill_reason_.clear();
  retiring_ = false;
  std::string executable;
  try {
    how_ = resolve_start(spec.start);
    if (how_ == Start::Spawn) executable = find_worker_executable(spec.executable);
    executable_ = executable;
    TensorQueue tasks_q = TensorQueue::create({spec.queue_capacity});
    TensorQueue results_q = TensorQueue::create({spec.queue_capacity});
    // The caller, the dispatcher, the collector and the workers outnumber the cores of a small
    // machine: their polls give way to one another (the worker does the same on its side).
    tasks_q.set_yielding(true);
    results_q.set_yielding(true);
    auto [mine, theirs] = control_socket_pair();
    others.push_back(mine.get());
    LaunchedWorker w = launch_worker(how_, theirs.get(), executable, others, spec.args);
    theirs.reset();
    pid_ = w.pid;
    pidfd_ = std::move(w.pidfd);
    control_ = std::move(mine);
    tasks_ = tasks_q;
    results_ = results_q;
    // CUDA tensors (shared ones, then inputs) go to this worker by IPC when it can open them,
    // else through shared memory.
    tasks_->set_receiver(pid_, device_ == "cpu" ? -1 : std::stoi(device_.substr(5)));
    phase_ = Phase::Starting;
    start_deadline_ = Clock::now() + spec.start_timeout;
  } catch (const Error& e) {
    // Nothing was started. A refusal to even try (no worker library for fork, no executable,
    // fork after CUDA init) will not change; running out of processes or memory may.
    const StartFault f =
        e.code() == Errc::invalid_argument ? StartFault::refused : StartFault::crashed;
    return StartFailure{f, name + " could not be started: " + e.detail()};
  }
  try {
    protocol::Hello hello;
    hello.supervisor_pid = supervisor;
    hello.worker_id = id_;
    hello.device = device_;
    hello.threads = spec.threads;
    hello.shared_allocations = spec.shared_allocations;
    hello.config = spec.config;
    for (const auto& [name, t] : spec.shared) hello.shared.push_back(name);
    send_shared(spec.shared);
    // The results queue's custody goes too: a result the worker has sent outlives the worker.
    std::vector<int> fds{tasks_->fd(), results_->fd()};
    if (results_->custody_fd() >= 0) fds.push_back(results_->custody_fd());
    send_control(control_.get(), protocol::encode(hello), fds);
  } catch (const Error& e) {
    // A worker already gone is seen on its pidfd; anything else ends this start now. Shared
    // tensors that cannot be shared with it will not be with the next one either.
    if (e.code() != Errc::peer_dead) {
      ::kill(pid_, SIGKILL);
      reap_status(pid_);
      forget_process();
      const bool shared = e.code() == Errc::invalid_argument;
      return StartFailure{shared ? StartFault::refused : StartFault::crashed,
                          name +
                              (shared ? " cannot hold the pool's shared tensors: "
                                      : " could not be sent its hello: ") +
                              e.detail()};
    }
  }
  log().debug("{} launched as pid {} by {}", name, pid_, start_name(how_));
  return std::nullopt;
}

void WorkerProcess::send_shared(const NamedTensors& shared) {
  if (shared.empty()) return;
  std::vector<std::string> names;
  Tensors message;
  const auto flush_message = [&] {
    // The queue was made with room for all of them: this never waits.
    const SendReport r = tasks_->send(message, std::chrono::milliseconds(0));
    for (std::size_t i = 0; i < message.size(); ++i) {
      if (r.tensors[i].copied) {
        throw Error(Errc::invalid_argument,
                    "shared tensor '" + names[i] + "' would reach it as a copy (" +
                        copy_reason_name(*r.tensors[i].copied) +
                        "), not as the pool's memory; share CUDA tensors with CUDA workers "
                        "that can open them (docs/cuda.md)");
      }
    }
    names.clear();
    message.clear();
  };
  for (const auto& [name, t] : shared) {
    names.push_back(name);
    message.push_back(t);
    if (message.size() == protocol::kMaxTensorsPerTask) flush_message();
  }
  if (!message.empty()) flush_message();
}

std::optional<StartFailure> WorkerProcess::finish_start(const LaunchSpec& spec,
                                                        std::vector<std::string>& tasks,
                                                        Collecting c) {
  const std::string name = who(id_, device_);
  protocol::Welcome welcome;
  try {
    welcome =
        protocol::decode_welcome(recv_control(control_.get(), std::chrono::milliseconds(0)).bytes);
  } catch (const Error& e) {
    if (e.code() == Errc::peer_dead) return start_failed(false, spec);
    if (e.code() == Errc::timeout) return std::nullopt;  // woken early: still Starting
    ::kill(pid_, SIGKILL);
    reap_status(pid_);
    forget_process();
    return StartFailure{StartFault::refused, name + " failed its handshake: " + e.detail()};
  }
  std::string refusal;
  if (welcome.version != protocol::kVersion) {
    refusal = "speaks protocol version " + std::to_string(welcome.version) +
              ", this supervisor version " + std::to_string(protocol::kVersion) +
              ": the worker program is from another ferry build; rebuild it against this libferry";
  } else if (!welcome.error.empty()) {
    refusal = "refused to start: " + welcome.error;
  } else if (welcome.pid != pid_) {
    refusal = "answered as pid " + std::to_string(welcome.pid) + ", not " + std::to_string(pid_);
  } else if (!tasks.empty() && tasks != welcome.tasks) {
    refusal = "has tasks [" + join_names(welcome.tasks) + "] but the pool's others have [" +
              join_names(tasks) + "]; every worker must run the same program";
  } else {
    for (const auto& need : spec.require_tasks) {
      if (std::find(welcome.tasks.begin(), welcome.tasks.end(), need) == welcome.tasks.end()) {
        refusal = "has no task '" + need + "' (it has: " + join_names(welcome.tasks) +
                  "); register it with FERRY_TASK in the worker program";
        break;
      }
    }
  }
  if (!refusal.empty()) {
    ::kill(pid_, SIGKILL);
    reap_status(pid_);
    forget_process();
    return StartFailure{StartFault::refused, name + " " + refusal};
  }
  if (tasks.empty()) tasks = welcome.tasks;
  phase_ = Phase::Ready;
  history_ = {};
  TensorQueue results = *results_;
  collecting_ = std::move(c);
  collector_ = std::thread([results, c = collecting_]() mutable {
    // Every exception ends here: a collector that threw would take the supervisor with it.
    for (;;) {
      // The gate is looked at only while nothing is queued: a stream of results costs no lock
      // of the board's per result, and a collector on its way back to the gate never holds the
      // turn that a caller taking its own result wants.
      if (results.messages() == 0) c.until_needed();
      std::lock_guard<std::mutex> turn(*c.turn);
      try {
        // In slices, so that a collector no longer needed (its worker's tasks all awaited, or
        // none) goes back to the gate without a message to wake it.
        std::optional<Tensors> message = results.try_recv(kCollectSlice);
        if (message) c.on_result(std::move(*message));
      } catch (const Error& e) {
        if (e.code() == Errc::closed) return;  // ends on close() or the worker's exit
        if (e.code() == Errc::peer_dead && results.size() == 0) return;
        c.on_unreadable(e);  // the message is lost: the supervisor kills the worker and retries
      } catch (const std::exception& e) {
        c.on_unreadable(Error(Errc::system, std::string("collecting a result: ") + e.what()));
      }
    }
  });
  log().debug("{} ready as pid {}", name, pid_);
  return std::nullopt;
}

StartFailure WorkerProcess::start_failed(bool deadline_passed, const LaunchSpec& spec) {
  const std::string name = who(id_, device_);
  if (deadline_passed) ::kill(pid_, SIGKILL);
  const int status = reap_status(pid_);
  StartFailure f;
  if (deadline_passed) {
    f = {StartFault::crashed, name + " did not answer its handshake within " +
                                  std::to_string(spec.start_timeout.count()) +
                                  " ms (raise PoolOptions::start_timeout if the machine is very "
                                  "slow)"};
  } else {
    f = {classify_exit(status),
         name + " ended during its start-up, " + describe_wait_status(status) +
             (how_ == Start::Spawn ? " (worker executable '" + executable_ + "')" : "") +
             "; its own message, if any, is on stderr above"};
  }
  forget_process();
  return f;
}

std::string WorkerProcess::reap() {
  int status = 0;
  const bool got = ::waitpid(pid_, &status, 0) == pid_;
  std::string how = got ? describe_wait_status(status) : "ended (its status was reaped elsewhere)";
  // Results that arrived before the death are real: the collector delivers them, then stops.
  stop_collector();
  if (!kill_reason_.empty()) how = kill_reason_ + ", " + how;
  forget_process();
  return how;
}

void WorkerProcess::stop_collector() {
  if (results_) results_->close();
  if (!collector_.joinable()) return;
  collecting_.closing();
  collector_.join();
  // A caller that took a result of this process has ended its task before it let go.
  { std::lock_guard<std::mutex> wait(*collecting_.turn); }
  collecting_ = {};
}

void WorkerProcess::forget_process() {
  if (tasks_) discard_queued(*tasks_);
  if (results_) results_->close();
  tasks_.reset();
  results_.reset();
  pid_ = -1;
  pidfd_.reset();
  control_.reset();
  phase_ = Phase::Down;
}

RestartDecision WorkerProcess::after_failed_start(const RestartPolicy& policy, StartFault fault) {
  RestartDecision d = supervisor::after_failed_start(policy, history_, fault);
  if (d.give_up) {
    phase_ = Phase::Failed;
  } else {
    phase_ = Phase::Down;
    restart_at_ = Clock::now() + d.delay;
  }
  return d;
}

void WorkerProcess::after_exit() {
  phase_ = Phase::Down;
  restart_at_ = Clock::now();
  retiring_ = false;
}

void WorkerProcess::retire(std::chrono::milliseconds grace) {
  if (phase_ != Phase::Ready || retiring_ || !kill_reason_.empty()) return;
  retiring_ = true;
  retire_deadline_ = Clock::now() + grace;
  request_stop();
}

void WorkerProcess::kill(const std::string& why) {
  if (phase_ != Phase::Ready || !kill_reason_.empty()) return;
  kill_reason_ = "killed by the supervisor: " + why;
  log().warn("{} (pid {}) {}", who(id_, device_), pid_, kill_reason_);
  ::kill(pid_, SIGKILL);
}

void WorkerProcess::request_stop() {
  if (phase_ == Phase::Starting) {
    ::kill(pid_, SIGKILL);  // half started: nothing of ours runs there yet
  } else if (tasks_) {
    discard_queued(*tasks_);
  }
}

void WorkerProcess::mark_stopped() {
  if (pid_ > 0) {
    if (phase_ == Phase::Ready) {
      reap();
    } else {
      reap_status(pid_);
      forget_process();
    }
  }
  phase_ = Phase::Stopped;
}

}  // namespace ferry::supervisor
