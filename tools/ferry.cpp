// ferry: the supervisor binary. `ferry run` starts a pool of workers, streams batches through a
// task, and reports throughput, latency, per-worker counts and how many bytes moved zero-copy.
//
// Exit codes: 0 every task succeeded; 1 some tasks failed (the rest ran); 2 bad arguments or
// input; 3 the pool could not start or broke; 128+N interrupted by signal N (SIGINT 130,
// SIGTERM 143) after a clean shutdown.
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/script.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>

#include "ipc/cuda/gate.hpp"
#include "ipc/cuda/visible_gpus.hpp"
#include "ipc/log.hpp"
#include "ipc/names.hpp"
#include "ipc/shm_check.hpp"
#include "ipc/units.hpp"
#include "runtime/ferry.hpp"
#include "tools/stop_signals.hpp"
#include "workers/builtin_tasks.hpp"
#include "workers/task_registry.hpp"
#if FERRY_HAVE_HOSTS
#include "runtime/hosts/head_hub.hpp"
#include "runtime/hosts/host_serve.hpp"
#endif

namespace {

using Seconds = std::chrono::duration<double>;
using nlohmann::json;

constexpr int kOk = 0, kTasksFailed = 1, kBadInput = 2, kBroken = 3;

struct RunArgs {
  int workers = 0;
  std::string devices;
  std::string start = "auto";
  std::string task = "mlp";
  std::string model, input, output, worker;
  int batches = 200;
  int batch_size = 64;
  std::int64_t features = ferry::kMlpFeatures;
  int timeout_ms = 0;
  int retries = 2;
  ferry::RestartPolicy restart;
  int backoff_ms = static_cast<int>(restart.backoff.count());
  int backoff_max_ms = static_cast<int>(restart.backoff_max.count());
  bool json = false;
  // Several hosts (docs/multi-host.md): the head listens; each host joins.
  std::string listen, join, secret_file, address, name;
  int wait_hosts = 0;
  int join_timeout_ms = 30000;
  int heartbeat_ms = 500;
  int lost_after_ms = 5000;
};

// A problem with what the user gave us, reported as exit code 2.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Whether this program's LibTorch has CUDA, asked without initialising it (torch::cuda's and
// at::hasCUDA()'s answers count the devices, which initialises the driver): a CUDA build has
// loaded c10's CUDA library with it.
bool torch_has_cuda() {
  void* lib = ::dlopen("libc10_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return false;
  ::dlclose(lib);
  return true;
}

// The default device list: every core as a CPU worker and every GPU this LibTorch can use. The
// GPUs are counted without initialising CUDA here, so the workers may still be forked, and the
// one on a GPU can use it.
std::vector<std::string> default_devices() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> d(cores, "cpu");
  if (torch_has_cuda()) {
    const int gpus = ferry::cuda::visible_gpus();
    for (int i = 0; i < gpus; ++i) d.push_back("cuda:" + std::to_string(i));
  }
  return d;
}

// Tensors saved from Python with torch.save([t0, t1, ...]) (a list or tuple of tensors).
std::vector<at::Tensor> load_tensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw BadInput("cannot read --input '" + path + "': " + std::strerror(errno));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
  torch::jit::IValue v;
  try {
    v = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw BadInput("--input '" + path + "' is not a file written by torch.save: " +
                   std::string(e.what()).substr(0, 200));
  }
  std::vector<at::Tensor> out;
  auto take = [&](const torch::jit::IValue& x) {
    if (!x.isTensor()) {
      throw BadInput("--input '" + path + "' holds a " + x.tagKind() +
                     " where a tensor should be; save a list or tuple of tensors");
    }
    out.push_back(x.toTensor());
  };
  if (v.isList()) {
    for (const auto& x : v.toListRef()) take(x);
  } else if (v.isTuple()) {
    for (const auto& x : v.toTuple()->elements()) take(x);
  } else if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else {
    throw BadInput("--input '" + path + "' holds a " + v.tagKind() +
                   "; save a list or tuple of tensors with torch.save");
  }
  return out;
}

// Results for Python's torch.load: a list with one entry per input, a tensor when the task
// returned one, else a list of its tensors. The lists go untagged: torch::jit::pickle_save tags
// each with torch.jit._pickle.restore_type_tag (or build_tensorlist), a global that torch.load's
// weights_only unpickler refuses, and weights_only=True is its default from PyTorch 2.6 on.
void save_results(const std::string& path, const std::vector<ferry::Tensors>& results) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& r : results) {
    if (r.size() == 1) {
      list.push_back(r[0].cpu());
    } else {
      c10::impl::GenericList inner(c10::AnyType::get());  // c10::List<Tensor> would be tagged
      for (const auto& t : r) inner.push_back(t.cpu());
      list.push_back(inner);
    }
  }
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* p, std::size_t n) { pickled.insert(pickled.end(), p, p + n); }, nullptr,
      nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(list);
  pickler.stop();
  // The zip archive torch.save writes, as torch::jit::pickle_save makes it.
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw BadInput("cannot write --output '" + path + "': " + std::strerror(errno));
  {
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* p, std::size_t n) -> std::size_t {
      f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
      return f ? n : 0;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                       zip);
    zip.writeEndOfFile();
  }
  f.flush();
  if (!f) throw BadInput("cannot write --output '" + path + "': " + std::strerror(errno));
}

// Shows progress on a terminal as a bar redrawn in place, elsewhere as a line every 10%.
class Progress {
 public:
  explicit Progress(std::size_t total) : total_(total), tty_(::isatty(2) == 1) {}
  void update(std::size_t done, std::size_t failed) {
    const auto now = std::chrono::steady_clock::now();
    const double rate = done / std::max(1e-9, Seconds(now - start_).count());
    if (tty_) {
      if (done != total_ && now - last_ < std::chrono::milliseconds(100)) return;
      last_ = now;
      const int width = 30;
      const int filled = total_ ? static_cast<int>(width * done / total_) : width;
      std::fprintf(stderr, "\r[%s%s] %zu/%zu tasks, %zu failed, %.0f tasks/s ",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done,
                   total_, failed, rate);
      if (done == total_) std::fprintf(stderr, "\n");
    } else {
      const std::size_t tenth = total_ ? 10 * done / total_ : 10;
      if (tenth == last_tenth_) return;
      last_tenth_ = tenth;
      std::fprintf(stderr, "ferry: %zu/%zu tasks (%zu%%), %zu failed, %.0f tasks/s\n", done, total_,
                   tenth * 10, failed, rate);
    }
  }

 private:
  std::size_t total_;
  bool tty_;
  std::size_t last_tenth_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_;
};

// The checks of `ferry-shm check` (the CUDA probe aside: it would stop this process forking),
// so a job that cannot work stops here, with the number that is wrong and the remedy, instead of
// failing later inside a worker.
void check_shared_memory(unsigned workers) {
  ferry::ShmCheckOptions options;
  options.workers = workers;
  const ferry::ShmReport report = ferry::check_shm(options);
  std::string failures;
  std::optional<ferry::Errc> code;  // the first failed check's, in the report's order
  for (const auto& item : report.items) {
    if (item.verdict == ferry::Verdict::ok) continue;
    const std::string line =
        item.name + ": " + item.summary + (item.remedy.empty() ? "" : "; " + item.remedy);
    if (item.verdict == ferry::Verdict::fail) {
      failures += "\n  " + line;
      if (!code) code = ferry::failure_code(item.name);
    } else {
      ferry::log().info("shared-memory check: {}", line);
    }
  }
  if (code) {
    throw ferry::Error(*code,
                       "the shared-memory checks failed (ferry-shm check tells more):" + failures);
  }
}

// What this process moved by CUDA IPC: batches staged on a device and the results it opened.
json cuda_summary() {
  const ferry::TransportStats t = ferry::transport_stats();
  json reasons = json::object();
  for (int r = 0; r < static_cast<int>(ferry::CopyReason::count_); ++r) {
    if (t.copies_by_reason[r]) {
      reasons[ferry::copy_reason_name(static_cast<ferry::CopyReason>(r))] = t.copies_by_reason[r];
    }
  }
  return {{"tensors_sent_zero_copy", t.cuda_tensors_zero_copy},
          {"bytes_sent_zero_copy", t.cuda_bytes_zero_copy},
          {"handles_exported", t.cuda_handles_exported},
          {"handles_opened", t.cuda_handles_opened},
          {"handle_cache_hits", t.cuda_handle_cache_hits},
          {"events_recorded", t.cuda_events_recorded},
          {"event_pool_syncs", t.cuda_event_pool_syncs},
          {"copies_by_reason", reasons},
          // Why this process called into CUDA, if it did: a supervisor that did cannot fork.
          {"ferry_entered",
           ferry::cuda::first_entry() ? json(ferry::cuda::first_entry()) : json(nullptr)}};
}

// The CUDA device every worker uses, if they all use the same one. Only then does this process
// touch CUDA (it stages the batches there), so the question to LibTorch comes last.
std::optional<at::Device> staging_device(const std::vector<std::string>& devices) {
  if (devices.empty()) return std::nullopt;
  for (const auto& d : devices) {
    if (d != devices.front()) return std::nullopt;
  }
  const std::string& d = devices.front();
  if (d.rfind("cuda", 0) != 0) return std::nullopt;
  ferry::cuda::enter("ferry run stages its batches on the workers' CUDA device");
  if (!at::hasCUDA()) return std::nullopt;
  return at::Device(d == "cuda" ? std::string("cuda:0") : d);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

// The pool's options from the command line, for `ferry run` and `ferry host` alike.
ferry::PoolOptions pool_options(const RunArgs& a) {
  ferry::PoolOptions o;
  if (!a.devices.empty()) {
    o.devices = split(a.devices);
  } else if (a.workers > 0) {
    o.devices.assign(a.workers, "cpu");
  } else {
    o.devices = default_devices();
  }
  o.start = ferry::parse_start(a.start);
  o.worker_executable = a.worker;
  o.task_timeout = std::chrono::milliseconds(a.timeout_ms);
  o.max_retries = a.retries;
  o.restart = a.restart;
  o.restart.backoff = std::chrono::milliseconds(a.backoff_ms);
  o.restart.backoff_max = std::chrono::milliseconds(a.backoff_max_ms);
  if (!a.model.empty()) o.config["model"] = a.model;
  if (a.task == "torchscript" && a.model.empty()) {
    throw BadInput("--task torchscript needs --model FILE.pt (a model saved by torch.jit.save)");
  }
  if (!a.model.empty() && ::access(a.model.c_str(), R_OK) != 0) {
    throw BadInput("cannot read --model '" + a.model + "': " + std::strerror(errno));
  }
  return o;
}

// Starts this machine's pool into `pool`; options the pool refuses are the user's (exit 2).
void start_pool(std::optional<ferry::Pool>& pool, const ferry::PoolOptions& o) {
  try {
    pool.emplace(o);
  } catch (const ferry::Error& e) {
    if (e.code() == ferry::Errc::invalid_argument) throw BadInput(e.detail());
    throw;
  }
}

#if FERRY_HAVE_HOSTS
ferry::hosts::Secret load_secret(const std::string& path) {
  try {
    return ferry::hosts::Secret::load(path);
  } catch (const ferry::Error& e) {
    throw BadInput(e.detail());
  }
}

ferry::hosts::Endpoint endpoint(const std::string& text, const char* option, bool any_port) {
  try {
    return ferry::hosts::parse_endpoint(text, any_port);
  } catch (const ferry::Error& e) {
    throw BadInput(std::string(option) + ": " + e.detail());
  }
}

// The head's side of a job on several hosts: listening from here on, hosts admitted any time.
std::shared_ptr<ferry::hosts::HeadHub> listen_for_hosts(const RunArgs& a) {
  ferry::hosts::HubOptions h;
  const ferry::hosts::Endpoint at = endpoint(a.listen, "--listen", true);
  h.address = at.address;
  h.port = at.port;
  h.secret = load_secret(a.secret_file);
  h.join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  h.heartbeat = std::chrono::milliseconds(a.heartbeat_ms);
  h.lost_after = std::chrono::milliseconds(a.lost_after_ms);
  auto hub = std::make_shared<ferry::hosts::HeadHub>(std::move(h));
  std::fprintf(stderr, "ferry: listening for hosts on %s:%u (ferry host --join %s:%u)\n",
               at.address.c_str(), hub->port(), at.address.c_str(), hub->port());
  return hub;
}
#endif

int run(const RunArgs& a) {
  ferry::PoolOptions o = pool_options(a);

  std::vector<at::Tensor> given;
  if (!a.input.empty()) given = load_tensors(a.input);
  const std::size_t count = a.input.empty() ? static_cast<std::size_t>(a.batches) : given.size();
  const std::int64_t features = a.task == "mlp" ? ferry::kMlpFeatures : a.features;
  // Synthetic batches are made in shared memory, as a data loader using ferry would, so they
  // travel zero-copy; inputs read from a file are copied once on send.
  // When every worker computes on one CUDA device, batches are staged there once, here, and
  // reach the workers by CUDA IPC handle (their results come back the same way); otherwise
  // they stay on the CPU and each worker moves them itself.
  const std::optional<at::Device> stage = staging_device(o.devices);
  auto make = [&](std::size_t i) -> ferry::Tensors {
    at::Tensor t;
    if (!a.input.empty()) {
      t = given[i];
    } else {
      t = ferry::empty_shared({a.batch_size, features}, at::kFloat);
      t.normal_(0, 1, at::make_generator<at::CPUGeneratorImpl>(1000 + i));
    }
    return {stage ? t.to(*stage) : t};
  };

  check_shared_memory(static_cast<unsigned>(o.devices.size()));
#if FERRY_HAVE_HOSTS
  std::shared_ptr<ferry::hosts::HeadHub> hub;
  if (!a.listen.empty()) hub = listen_for_hosts(a);
  o.remote = hub;
#else
  if (!a.listen.empty()) {
    throw BadInput(std::string("--listen: this ferry was built for one machine only") +
                   FERRY_HOSTS_MISSING);
  }
#endif
  std::optional<ferry::Pool> pool;
  start_pool(pool, o);
  const std::vector<std::string> tasks = pool->tasks();
  if (std::find(tasks.begin(), tasks.end(), a.task) == tasks.end()) {
    throw BadInput("--task '" + a.task +
                   "' is not a task of the workers (they have: " + ferry::join_names(tasks) +
                   "); register it with FERRY_TASK in a worker and pass --worker");
  }
  // SIGINT and SIGTERM close the pool: in-flight tasks are cancelled, workers stopped and
  // reaped, and the loop below ends.
  const ferry::tools::StopSignalThread signals([&] {
    try {
      pool->close(ferry::Shutdown::Cancel);
    } catch (const std::exception& e) {
      ferry::log().error("closing the pool on a signal: {}", e.what());
    }
  });
#if FERRY_HAVE_HOSTS
  if (hub && a.wait_hosts > 0 &&
      !hub->wait_for_hosts(static_cast<std::size_t>(a.wait_hosts),
                           std::chrono::milliseconds(a.join_timeout_ms))) {
    if (ferry::tools::stop_signal()) return 128 + ferry::tools::stop_signal();
    std::fprintf(stderr,
                 "ferry: %zu of the %d hosts asked for (--wait-hosts) joined within %d ms\n",
                 hub->stats().live, a.wait_hosts, a.join_timeout_ms);
    return kBroken;
  }
#endif
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ferry::Tensors> results(a.output.empty() ? 0 : count);
  std::vector<double> latencies;
  std::vector<std::string> errors;
  std::string broken;  // why the pool could not go on, if it could not
  std::size_t done = 0;
  Progress progress(count);
  try {
    auto stream = pool->imap_unordered(a.task, count, make);
    while (auto r = stream.next()) {
      ++done;
      latencies.push_back(std::chrono::duration<double>(r->latency).count());
      if (r->error) {
        try {
          std::rethrow_exception(r->error);
        } catch (const std::exception& e) {
          if (!ferry::tools::stop_signal()) errors.push_back(e.what());
        }
      } else if (!results.empty()) {
        results[r->index] = std::move(r->outputs);
      }
      if (!a.json) progress.update(done, errors.size());
    }
  } catch (const ferry::Error& e) {
    if (!ferry::tools::stop_signal()) broken = e.what();
  }
  const double elapsed = Seconds(std::chrono::steady_clock::now() - t0).count();
  const ferry::PoolStats s = pool->stats();  // before close, while the pids are current
  pool->close(ferry::Shutdown::Cancel);
  if (broken.empty() &&
      std::all_of(s.workers.begin(), s.workers.end(), [](const auto& w) { return w.given_up; })) {
    broken = "ferry: worker_lost: every worker was given up";
  }
  if (ferry::tools::stop_signal()) {
    std::fprintf(stderr, "ferry: stopped by %s after %zu of %zu tasks; workers stopped\n",
                 ferry::tools::stop_signal() == SIGINT ? "SIGINT" : "SIGTERM", done, count);
    return 128 + ferry::tools::stop_signal();
  }
  for (std::size_t i = 0; i < std::min<std::size_t>(errors.size(), 5); ++i) {
    std::fprintf(stderr, "%s\n", errors[i].c_str());
  }
  if (errors.size() > 5) std::fprintf(stderr, "... and %zu more failures\n", errors.size() - 5);
  if (!broken.empty()) std::fprintf(stderr, "%s\n", broken.c_str());
  const bool complete = errors.empty() && broken.empty() && done == count;
  if (!a.output.empty() && complete) save_results(a.output, results);

  const double rate = static_cast<double>(done) / std::max(elapsed, 1e-9);
  const std::uint64_t in_zc = s.input_bytes_zero_copy, in_cp = s.input_bytes_copied;
  std::uint64_t out_zc = 0, out_cp = 0;
  for (const auto& w : s.workers) {
    out_zc += w.bytes_zero_copy;
    out_cp += w.bytes_copied;
  }
  if (a.json) {
    json workers = json::array();
    for (const auto& w : s.workers) {
      workers.push_back({{"id", w.id},
                         {"device", w.device},
                         {"start", w.start},
                         {"pid", w.pid},
                         {"tasks", w.tasks_done},
                         {"failed", w.tasks_failed},
                         {"lost", w.tasks_lost},
                         {"restarts", w.restarts},
                         {"timeouts", w.timeouts},
                         {"given_up", w.given_up},
                         {"last_exit", w.last_exit},
                         {"bytes_zero_copy", w.bytes_zero_copy},
                         {"bytes_copied", w.bytes_copied}});
    }
    json doc = {
        {"task", a.task},
        {"tasks", done},
        {"failed", errors.size()},
        {"retried", s.retried},
        {"seconds", elapsed},
        {"tasks_per_second", rate},
        {"latency_ms",
         {{"p50", percentile(latencies, 0.5) * 1e3}, {"p99", percentile(latencies, 0.99) * 1e3}}},
        {"inputs", {{"bytes_zero_copy", in_zc}, {"bytes_copied", in_cp}}},
        {"results", {{"bytes_zero_copy", out_zc}, {"bytes_copied", out_cp}}},
        {"cuda", cuda_summary()},
        {"workers", workers},
        {"errors", errors},
        {"broken", broken}};
#if FERRY_HAVE_HOSTS
    if (hub) {
      const ferry::hosts::HubStats h = hub->stats();
      doc["hosts"] = {{"joined", h.joined}, {"lost", h.lost}, {"refused", h.refused}};
    }
#endif
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("ferry run: task '%s' on %zu worker(s), %zu tasks in %.2f s\n", a.task.c_str(),
                s.workers.size(), done, elapsed);
    std::printf("  throughput  %.1f tasks/s, %zu failed, %llu retried\n", rate, errors.size(),
                static_cast<unsigned long long>(s.retried));
    std::printf("  latency     p50 %.2f ms, p99 %.2f ms (hand-over to result)\n",
                percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3);
#if FERRY_HAVE_HOSTS
    if (hub) {
      const ferry::hosts::HubStats h = hub->stats();
      std::printf("  hosts       %llu joined, %llu lost, %llu refused\n",
                  static_cast<unsigned long long>(h.joined),
                  static_cast<unsigned long long>(h.lost),
                  static_cast<unsigned long long>(h.refused));
    }
#endif
    std::printf("  inputs      %s zero-copy, %s copied\n", ferry::format_bytes(in_zc).c_str(),
                ferry::format_bytes(in_cp).c_str());
    std::printf("  results     %s zero-copy, %s copied\n", ferry::format_bytes(out_zc).c_str(),
                ferry::format_bytes(out_cp).c_str());
    int width = 8;  // a host's slot names the host and its devices
    for (const auto& w : s.workers) width = std::max(width, static_cast<int>(w.device.size()));
    std::printf("  %-6s %-*s %-6s %8s %7s %8s %11s %11s\n", "worker", width, "device", "start",
                "tasks", "failed", "restarts", "zero-copy", "copied");
    for (const auto& w : s.workers) {
      std::printf("  %-6d %-*s %-6s %8llu %7llu %8llu %11s %11s\n", w.id, width, w.device.c_str(),
                  w.start.c_str(), static_cast<unsigned long long>(w.tasks_done),
                  static_cast<unsigned long long>(w.tasks_failed),
                  static_cast<unsigned long long>(w.restarts),
                  ferry::format_bytes(w.bytes_zero_copy).c_str(),
                  ferry::format_bytes(w.bytes_copied).c_str());
    }
    for (const auto& w : s.workers) {
      if (w.given_up) {
        std::printf("  worker %d (%s) given up; its last start: %s\n", w.id, w.device.c_str(),
                    w.last_exit.c_str());
      }
    }
    if (!a.output.empty() && complete) {
      std::printf("  wrote %zu results to %s\n", results.size(), a.output.c_str());
    }
  }
  if (!broken.empty()) return kBroken;
  return errors.empty() ? kOk : kTasksFailed;
}

#if FERRY_HAVE_HOSTS
// `ferry host`: this machine's workers take tasks from a head elsewhere until the head's job
// ends (exit 0), the head is lost (3), or SIGINT/SIGTERM (128+N, after a goodbye to the head).
int host(const RunArgs& a) {
  ferry::PoolOptions o = pool_options(a);
  const ferry::hosts::Endpoint head = endpoint(a.join, "--join", false);
  const ferry::hosts::Secret secret = load_secret(a.secret_file);
  check_shared_memory(static_cast<unsigned>(o.devices.size()));
  std::optional<ferry::Pool> pool;
  start_pool(pool, o);
  std::atomic<bool> stop{false};
  const ferry::tools::StopSignalThread signals([&] { stop = true; });

  ferry::hosts::HostInfo self;
  char hostname[256] = {};
  ::gethostname(hostname, sizeof hostname - 1);
  self.name = a.name.empty() ? hostname : a.name;
  self.address = a.address.empty() ? ferry::hosts::address_towards(head.address) : a.address;
  self.devices = o.devices;
  self.capacity = pool->capacity();
  ferry::hosts::LinkOptions link;
  link.address = self.address;
  link.timeout = std::chrono::milliseconds(a.lost_after_ms);
  link.join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  // Inputs land in shared memory (the link's receive_buffer), so this host's workers get them
  // without another copy.
  const auto join_timeout = std::chrono::milliseconds(a.join_timeout_ms);
  ferry::hosts::Joined joined = ferry::hosts::join_head(
      ferry::hosts::connect_store(head.address, head.port, join_timeout), secret, self, link,
      join_timeout,
      [](const std::string& setup) { ferry::hosts::require_workers(setup, "ferry"); });
  std::fprintf(stderr,
               "ferry host: joined the head at %s:%u as host %llu (%s, %zu tasks at once)\n",
               head.address.c_str(), head.port, static_cast<unsigned long long>(joined.number),
               self.address.c_str(), self.capacity);
  ferry::hosts::ServeOptions serve;
  serve.heartbeat = std::chrono::milliseconds(a.heartbeat_ms);
  serve.lost_after = std::chrono::milliseconds(a.lost_after_ms);
  int code = kOk;
  try {
    const ferry::hosts::ServeEnd end = ferry::hosts::serve_head(*pool, *joined.link, serve, stop);
    if (end == ferry::hosts::ServeEnd::stopped) code = 128 + ferry::tools::stop_signal();
    std::fprintf(stderr, "ferry host: %s\n",
                 end == ferry::hosts::ServeEnd::stopped ? "stopped; the head was told"
                                                        : "the head's job ended");
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry host: lost the head: %s\n", e.what());
    code = ferry::tools::stop_signal() ? 128 + ferry::tools::stop_signal() : kBroken;
  }
  pool->close(ferry::Shutdown::Cancel);  // what is left runs again elsewhere: the head retries it
  return code;
}
#endif

}  // namespace

// The options of this machine's pool, the same for `ferry run` and `ferry host`.
void add_pool_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--workers", a.workers, "CPU workers (default: one per core)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--devices", a.devices,
                  "one worker per entry, e.g. cpu,cpu,cuda:0 (overrides --workers)")
      ->excludes("--workers");
  cmd->add_option("--start", a.start,
                  "how workers start: fork (only while CUDA is uninitialised here), spawn (runs "
                  "the worker executable), auto (fork when safe)")
      ->check(CLI::IsMember({"auto", "fork", "spawn"}));
  cmd->add_option("--model", a.model, "TorchScript file for --task torchscript");
  cmd->add_option("--timeout-ms", a.timeout_ms,
                  "kill a worker whose task runs longer (0: no limit)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--retries", a.retries, "times a task lost with its worker is retried")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--max-failed-starts", a.restart.max_failed_starts,
                  "failed starts in a row, any cause, before a worker slot is given up")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--max-start-crashes", a.restart.max_start_crashes,
                  "failed starts in a row by the worker's own fault before it is given up")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--restart-backoff-ms", a.backoff_ms,
                  "wait before retrying a failed start; doubles with each failure in a row")
      ->check(CLI::Range(0, 3600000));
  cmd->add_option("--restart-backoff-max-ms", a.backoff_max_ms, "the longest such wait")
      ->check(CLI::Range(0, 3600000));
  cmd->add_option("--worker", a.worker,
                  "worker executable for spawn (default: ferry-worker beside this program)");
}

// The options of a job on several hosts that the head and its hosts share.
void add_link_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--secret-file", a.secret_file,
                  "the job's shared secret: a file of 16 bytes or more that only its owner can "
                  "read (default: FERRY_SECRET)");
  cmd->add_option("--join-timeout-ms", a.join_timeout_ms,
                  "how long joining, and --wait-hosts, may take")
      ->check(CLI::Range(100, 1 << 30));
  cmd->add_option("--heartbeat-ms", a.heartbeat_ms, "a quiet link sends a heartbeat this often")
      ->check(CLI::Range(10, 600000));
  cmd->add_option("--lost-after-ms", a.lost_after_ms,
                  "a peer silent this long is lost (at least twice the heartbeat)")
      ->check(CLI::Range(20, 1 << 30));
}

int main(int argc, char** argv) {
  ferry::tools::catch_stop_signals();  // before anything here can start a thread
  CLI::App app{"ferry: run PyTorch work on a pool of worker processes, tensors moved zero-copy"};
  app.require_subcommand(1);
  RunArgs a;
  CLI::App* run_cmd = app.add_subcommand(
      "run",
      "Start workers, stream batches through a task, and report throughput, latency and how "
      "many bytes moved zero-copy. With no options: the built-in 'mlp' over 200 synthetic "
      "batches on every CPU core (and every GPU LibTorch can use).");
  add_pool_options(run_cmd, a);
  // The tasks of this program's own registry: what forked workers run, and what the default
  // ferry-worker has too.
  std::string known;
  for (const auto& n : ferry::task_names()) known += (known.empty() ? "" : ", ") + n;
  run_cmd->add_option(
      "--task", a.task,
      "task to run (here: " + known + "); a custom worker (--worker) may register more");
  run_cmd->add_option("--input", a.input,
                      "tensors saved by torch.save([t0, t1, ...]); each is one task's input");
  run_cmd->add_option("--output", a.output,
                      "write the results, in input order, for Python's torch.load");
  run_cmd->add_option("--batches", a.batches, "synthetic batches when there is no --input")
      ->check(CLI::Range(1, 100000000));
  run_cmd->add_option("--batch-size", a.batch_size, "rows per synthetic batch")
      ->check(CLI::Range(1, 1 << 20));
  run_cmd->add_option("--features", a.features, "columns per synthetic batch (mlp: 64)")
      ->check(CLI::Range(1, 1 << 20));
  run_cmd->add_flag("--json", a.json, "print the summary as one JSON document, no progress");
  run_cmd->add_option("--listen", a.listen,
                      "also run tasks on hosts that join at ADDRESS:PORT (PORT 0: any free one; "
                      "ferry host --join); the store and links listen on that address only");
  run_cmd
      ->add_option("--wait-hosts", a.wait_hosts,
                   "with --listen: wait for this many hosts before the first task")
      ->check(CLI::Range(0, 4096));
  add_link_options(run_cmd, a);
  run_cmd->footer(
      "Exit codes: 0 all tasks succeeded, 1 some tasks failed, 2 bad arguments or input,\n"
      "3 the pool could not start or broke (every worker given up), or --wait-hosts ran out,\n"
      "130/143 stopped by SIGINT/SIGTERM.\n"
      "Environment: FERRY_LOG=debug for detail, FERRY_WORKER for the worker executable,\n"
      "FERRY_SECRET for the hosts' secret; every variable is in docs/environment.md.");

  CLI::App* host_cmd = app.add_subcommand(
      "host",
      "Join the head of a job on another machine (ferry run --listen) and run its tasks on "
      "this machine's workers until the job ends (docs/multi-host.md).");
  host_cmd->add_option("--join", a.join, "the head's ADDRESS:PORT")->required();
  add_pool_options(host_cmd, a);
  host_cmd->add_option("--address", a.address,
                       "this host's address as the head reaches it (default: the one on the "
                       "route to the head)");
  host_cmd->add_option("--name", a.name,
                       "this host's name in the head's reports (default: its "
                       "hostname)");
  add_link_options(host_cmd, a);
  host_cmd->footer(
      "Exit codes: 0 the head's job ended, 2 bad arguments, 3 could not join or lost the head,\n"
      "130/143 stopped by SIGINT/SIGTERM (the head is told and runs its tasks elsewhere).");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kOk : kBadInput;
  }
  try {
    if (host_cmd->parsed()) {
#if FERRY_HAVE_HOSTS
      return host(a);
#else
      throw BadInput(std::string("ferry host: this ferry was built for one machine only") +
                     FERRY_HOSTS_MISSING);
#endif
    }
    return run(a);
  } catch (const BadInput& e) {
    std::fprintf(stderr, "ferry: %s\n", e.what());
    return kBadInput;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // already "ferry: <code>: ..."
    return kBroken;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: %s\n", e.what());
    return kBroken;
  }
}
