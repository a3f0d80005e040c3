#include "workers/worker_loop.hpp"

#include <dlfcn.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "ipc/control_socket.hpp"
#include "ipc/cuda/fork_safety.hpp"
#include "ipc/cuda/gate.hpp"
#include "ipc/env.hpp"
#include "ipc/log.hpp"
#include "runtime/shared_allocations.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/supervisor/transfer_tally.hpp"
#include "runtime/worker_launch.hpp"
#include "runtime/worker_protocol.hpp"
#include "workers/task_registry.hpp"

namespace ferry {
namespace {

constexpr auto kHelloTimeout = std::chrono::seconds(30);
constexpr auto kPoll = std::chrono::milliseconds(200);  // how often an idle worker checks its
                                                        // supervisor is still there

// The protocol version this worker speaks; FERRY_TEST_WORKER_PROTOCOL pretends another, so the
// mismatch path can be tested (a hook for the state only: the check itself is the real one).
int my_protocol_version() {
  return static_cast<int>(
      env::integer("FERRY_TEST_WORKER_PROTOCOL", protocol::kVersion, 0, 1 << 30));
}

// Why this worker cannot compute on `device`, or "" when it can.
std::string device_problem(const std::string& device) {
  if (device == "cpu") return "";
  if (device.rfind("cuda:", 0) != 0) return "unknown device '" + device + "'";
  if (cuda::forked_after_init()) {
    return "this worker was forked after CUDA was initialised in its parent, so it cannot use "
           "CUDA; start the pool with spawn";
  }
  cuda::enter("a pool worker on a CUDA device");
  if (!torch::cuda::is_available()) {
    return "device " + device +
           " asked for, but this worker's LibTorch has no CUDA or sees no GPU (build against a "
           "CUDA LibTorch, check CUDA_VISIBLE_DEVICES and the driver)";
  }
  const long index = std::strtol(device.c_str() + 5, nullptr, 10);
  const auto count = static_cast<long>(torch::cuda::device_count());
  if (index >= count) {
    return "device " + device + " does not exist: " + std::to_string(count) +
           " CUDA device(s) visible";
  }
  return "";
}

// What a task (or the worker's start, with no task) is told of where it runs.
TaskContext context_for(const protocol::Hello& hello, const NamedTensors& shared,
                        std::string task) {
  TaskContext ctx;
  ctx.worker_id = hello.worker_id;
  ctx.device = at::Device(hello.device);
  ctx.task = std::move(task);
  ctx.config = &hello.config;
  ctx.logger = &log();
  ctx.shared = &shared;
  return ctx;
}

// Runs the program's start for this worker (set_worker_start); "" or why it failed.
// What an exception says to the supervisor, and so to the user: LibTorch's without the C++
// backtrace its what() carries, which goes to this worker's FERRY_LOG=debug instead.
std::string error_text(const std::exception& e) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e)) {
    log().debug("{}", e.what());
    return torch_error->what_without_backtrace();
  }
  return e.what();
}

std::string run_start(const protocol::Hello& hello, const NamedTensors& shared) {
  const StartFn* start = worker_start();
  if (!start) return "";
  TaskContext ctx = context_for(hello, shared, "");
  try {
    (*start)(ctx);
    return "";
  } catch (const std::exception& e) {
    return "the worker's start failed: " + error_text(e);
  } catch (...) {
    return "the worker's start threw something that is not a std::exception";
  }
}

// The preludes this worker holds, by id: as many as its supervisor's sends told it to keep
// (runtime/supervisor/prelude_book.hpp), each a copy in this process's own memory, so that
// keeping it holds no lease on the sender's.
using Preludes = std::unordered_map<std::uint64_t, Tensors>;

// Files what `env` says of preludes; the task's prelude, or null when it has none. The tensors
// of one that came are message[1 ...].
const Tensors* take_prelude(const protocol::TaskEnvelope& env, const Tensors& message,
                            Preludes& preludes) {
  if (env.forget != 0) preludes.erase(env.forget);
  if (env.prelude == 0) return nullptr;
  if (env.prelude_tensors > 0) {
    if (message.size() < 1 + std::size_t{env.prelude_tensors}) {
      throw Error(Errc::bad_record, "a task message is shorter than its prelude");
    }
    Tensors kept;
    for (std::size_t i = 1; i <= env.prelude_tensors; ++i) {
      kept.push_back(message[i].clone(at::MemoryFormat::Contiguous));
    }
    preludes[env.prelude] = std::move(kept);
  }
  const auto it = preludes.find(env.prelude);
  if (it == preludes.end()) {
    throw std::logic_error("its prelude " + std::to_string(env.prelude) +
                           " never reached this worker; supervisor and worker disagree on what "
                           "it holds (a bug in ferry)");
  }
  return &it->second;
}

// Runs one task message and sends its result or its error back (`start_error`, when the
// worker's start failed).
void handle(const Tensors& message, const protocol::Hello& hello,
            const std::vector<std::string>& names, const NamedTensors& shared,
            const std::string& start_error, Preludes& preludes, TensorQueue& results) {
  const protocol::TaskEnvelope env = protocol::unpack_task(message.at(0));
  const auto first_input =
      message.begin() + 1 + std::min<std::size_t>(env.prelude_tensors, message.size() - 1);
  protocol::ResultEnvelope reply;
  reply.task_id = env.task_id;
  reply.attempt = env.attempt;
  Tensors out;
  std::string error;
  std::string detail;
  bool failed = true;  // until the task returned and its outputs passed the checks
  try {
    // Filed first, whatever becomes of the task: later tasks name it.
    const Tensors* prelude = take_prelude(env, message, preludes);
    if (env.task_index >= names.size()) {
      throw std::invalid_argument("task number " + std::to_string(env.task_index) +
                                  " is not one of this worker's");
    }
    if (!start_error.empty()) throw std::runtime_error(start_error);
    TaskContext ctx = context_for(hello, shared, names[env.task_index]);
    ctx.prelude = prelude;
    ctx.prelude_id = prelude ? env.prelude : 0;
    out = (*find_task(ctx.task))(ctx, Tensors(first_input, message.end()));
    if (out.size() > protocol::kMaxTensorsPerTask) {
      throw std::length_error("returned " + std::to_string(out.size()) +
                              " tensors; a task returns at most " +
                              std::to_string(protocol::kMaxTensorsPerTask));
    }
    // Device in, device out: a caller that sent CUDA tensors gets CUDA results (by IPC); one
    // that sent CPU tensors gets CPU results and need not touch CUDA at all.
    const bool cuda_in =
        std::any_of(first_input, message.end(), [](const at::Tensor& t) { return t.is_cuda(); });
    for (auto& t : out) {
      if (!t.defined()) throw std::invalid_argument("returned an undefined tensor");
      if (t.is_cuda() && !cuda_in) t = t.cpu();
    }
    failed = false;
  } catch (const TaskFailure& e) {
    error = e.what();
    detail = e.detail();
  } catch (const std::exception& e) {
    error = error_text(e);
  } catch (...) {
    error = "threw something that is not a std::exception";
  }
  // What a task threw with no words still fails it: the error's text is what says so below.
  if (failed && error.empty()) error = "(an exception with no message)";
  // A failed task's reply travels in its records (text_tensors), so it cannot fail for want of
  // shared memory; only a detail too large for them needs some, and where there is none the
  // failure goes without it (the text still says what the task raised).
  auto fail_with = [&](const std::string& text) {
    reply.ok = false;
    auto send = [&](const Tensors& tail) {
      reply.detail_pieces = static_cast<std::uint32_t>(tail.size());
      Tensors m = protocol::text_tensors(text, protocol::kMaxTensorsPerTask - tail.size());
      m.insert(m.begin(), protocol::pack(reply));
      m.insert(m.end(), tail.begin(), tail.end());
      results.send(m);
    };
    try {
      send(protocol::detail_tensors(detail));
    } catch (const Error& e) {
      if (!protocol::detail_needs_shared_memory(detail) || e.code() == Errc::peer_dead ||
          e.code() == Errc::closed) {
        throw;
      }
      log().warn(
          "task {}: its error's detail ({} bytes) could not be sent: {}; the error goes "
          "without it",
          env.task_id, detail.size(), e.what());
      send({});
    }
  };
  try {
    if (!error.empty()) {
      fail_with(error);
    } else {
      // The envelope counts how this message's results travel, as the send itself reports it.
      results.send_described(
          [&](const SendReport& sent) {
            add_transfer_counts(reply, sent.counts());  // its counts start at 0
            return protocol::pack(reply);
          },
          out, TensorQueue::SendOptions{});  // ends with peer_dead if the supervisor dies
    }
  } catch (const Error& e) {
    if (!error.empty() || e.code() == Errc::peer_dead || e.code() == Errc::closed) throw;
    // The results cannot travel (shared memory full, too many tensors out): the task fails with
    // that error, which names the sizes and the remedy, instead of this worker dying for it and
    // the next one with it.
    reply = protocol::ResultEnvelope{env.task_id, env.attempt, false};  // nothing was sent
    detail.clear();
    fail_with("its results could not be sent back: " + e.detail());
  }
}

// The pool's shared tensors, which the supervisor queued ahead of every task: views of its
// memory (received tensors the user shares deliberately are never copied on receipt).
NamedTensors take_shared(TensorQueue& tasks, const protocol::Hello& hello) {
  NamedTensors shared;
  std::size_t next = 0;
  for (std::size_t m = 0; m < protocol::shared_messages(hello.shared.size()); ++m) {
    for (at::Tensor& t : tasks.recv(kHelloTimeout)) {
      if (next == hello.shared.size()) break;
      shared.emplace(hello.shared[next++], std::move(t));
    }
  }
  if (next != hello.shared.size()) {
    throw Error(Errc::bad_record, "the hello names " + std::to_string(hello.shared.size()) +
                                      " shared tensors but " + std::to_string(next) + " came");
  }
  return shared;
}

// Tells the supervisor why this worker will not start; it reports it (once, in its error). Only
// a refusal that cannot reach it is printed here.
int refuse(int control, protocol::Welcome& welcome, const std::string& why) {
  welcome.error = why;
  try {
    send_control(control, protocol::encode(welcome));
  } catch (const Error&) {
    std::fprintf(stderr, "ferry-worker %d: refusing to start: %s\n", static_cast<int>(::getpid()),
                 why.c_str());
  }
  return kWorkerRefused;
}

int serve_tasks(int control) {
  ControlMessage m = recv_control(control, kHelloTimeout);
  const protocol::Hello hello = protocol::decode_hello(m.bytes);
  protocol::Welcome welcome;
  welcome.version = my_protocol_version();
  welcome.pid = ::getpid();
  welcome.device = hello.device;
  welcome.tasks = task_names();
  if (hello.version != welcome.version) {
    return refuse(control, welcome,
                  "the supervisor speaks protocol version " + std::to_string(hello.version) +
                      ", this worker version " + std::to_string(welcome.version) +
                      "; build the worker against the supervisor's libferry");
  }
  if (::getppid() != hello.supervisor_pid) {
    return kWorkerSupervisorGone;  // it died before PR_SET_PDEATHSIG took hold
  }
  if (m.fds.size() != 2 && m.fds.size() != 3) {
    return refuse(control, welcome,
                  "the hello carried " + std::to_string(m.fds.size()) + " fds, not 2 or 3");
  }
  if (const std::string p = device_problem(hello.device); !p.empty()) {
    return refuse(control, welcome, p);
  }
  at::set_num_threads(std::max(1, hello.threads));
  try {
    set_shared_allocations(hello.shared_allocations);
  } catch (const Error& e) {
    return refuse(control, welcome, e.detail());
  }
  TensorQueue tasks = TensorQueue::attach(m.fds[0].get());
  // With the results queue's custody (the third fd), a result sent reaches the supervisor even if
  // this worker dies the next instant.
  TensorQueue results =
      TensorQueue::attach(m.fds[1].get(), false, m.fds.size() > 2 ? m.fds[2].get() : -1);
  tasks.set_yielding(true);  // as the supervisor's side does (worker_process.cpp)
  results.set_yielding(true);
  m.fds.clear();
  NamedTensors shared;
  try {
    shared = take_shared(tasks, hello);
  } catch (const Error& e) {
    return refuse(control, welcome, "could not take the pool's shared tensors: " + e.detail());
  }
  send_control(control, protocol::encode(welcome));
  log().debug("worker {} (pid {}) serving on {}", hello.worker_id, ::getpid(), hello.device);
  // After the welcome: the pool has started, and tasks queue up while a long start runs.
  const std::string start_error = run_start(hello, shared);
  Preludes preludes;

  for (;;) {
    std::optional<Tensors> message;
    try {
      message = tasks.try_recv(kPoll);
    } catch (const Error& e) {
      if (e.code() == Errc::closed || e.code() == Errc::peer_dead) break;
      throw;
    }
    if (!message) {
      if (::getppid() != hello.supervisor_pid) return kWorkerSupervisorGone;
      continue;
    }
    try {
      handle(*message, hello, welcome.tasks, shared, start_error, preludes, results);
    } catch (const Error& e) {
      if (e.code() == Errc::peer_dead || e.code() == Errc::closed) return kWorkerSupervisorGone;
      throw;
    }
  }
  // Results not yet taken live in this process's memory: stay until the supervisor has them.
  flush(std::chrono::seconds(5));
  return kWorkerStopped;
}

// Registers the in-process entry (for fork) and this library's place (for finding the
// ferry-worker executable beside it) as soon as libferry_worker is loaded.
[[maybe_unused]] const bool g_registered = [] {
  Dl_info info{};
  std::string dir;
  if (::dladdr(reinterpret_cast<void*>(&run_worker), &info) && info.dli_fname) {
    dir = info.dli_fname;
    const auto slash = dir.rfind('/');
    dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  }
  detail::register_worker_library(&run_worker, dir);
  return true;
}();

}  // namespace

int run_worker(int control_fd) {
  // Ctrl-C reaches the whole process group; stopping workers is the supervisor's decision.
  ::signal(SIGINT, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  try {
    const int code = serve_tasks(control_fd);
    ::close(control_fd);
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-worker %d: %s\n", static_cast<int>(::getpid()),
                 error_text(e).c_str());
    return e.what() && std::strstr(e.what(), "peer_dead") ? kWorkerSupervisorGone : kWorkerFailed;
  }
}

int worker_main(int argc, char** argv) {
  const bool help =
      argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
  if (argc == 2 && std::strcmp(argv[1], "--list-tasks") == 0) {
    for (const auto& name : task_names()) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--ferry-control-fd") == 0) {
    char* end = nullptr;
    const long fd = std::strtol(argv[2], &end, 10);
    if (*end == '\0' && fd >= 0 && fd < 1 << 20) return run_worker(static_cast<int>(fd));
  }
  // Asked for, the usage is the answer (stdout, 0); otherwise it says why nothing ran.
  std::fprintf(help ? stdout : stderr,
               "%s: a ferry worker process. A supervisor starts it (ferry run, or ferry::Pool "
               "with start=spawn); it is not run by hand.\n"
               "  %s --list-tasks   print the tasks this worker can run\n",
               argv[0], argv[0]);
  return help ? 0 : kWorkerUsage;
}

}  // namespace ferry
