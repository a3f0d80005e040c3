#include "tools/ferry_run.hpp"

#include <signal.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ipc/cuda/gate.hpp"
#include "ipc/log.hpp"
#include "ipc/names.hpp"
#include "runtime/transport_table.hpp"
#include "tools/ferry_hosts.hpp"
#include "tools/ferry_report.hpp"
#include "tools/input_sharing.hpp"
#include "tools/local_pool.hpp"
#include "tools/progress_text.hpp"
#include "tools/stop_signals.hpp"
#include "tools/task_inputs.hpp"

namespace ferry::tools {
namespace {

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

// The task's inputs: synthetic batches, or the tensors of --input.
class Batches {
 public:
  Batches(const RunArgs& a, const std::vector<std::string>& devices) : a_(a) {
    if (!a.input.empty()) given_ = load_inputs(a.input);
    count_ = a.input.empty() ? static_cast<std::size_t>(a.batches) : given_.size();
    features_ = a.task == "mlp" ? ferry::kMlpFeatures : a.features;
    // Synthetic batches are made in shared memory, as a data loader using ferry would, so they
    // travel zero-copy; inputs read from a file are moved there by share_given().
    // When every worker computes on one CUDA device, batches are staged there once, here, and
    // reach the workers by CUDA IPC handle (their results come back the same way); otherwise
    // they stay on the CPU and each worker moves them itself.
    stage_ = staging_device(devices);
    const std::uint64_t batch_bytes =
        static_cast<std::uint64_t>(a.batch_size) * static_cast<std::uint64_t>(features_) * 4;
    distinct_ = static_cast<std::size_t>(
        std::clamp<std::uint64_t>(kSyntheticBytes / batch_bytes, 1, kSyntheticBatches));
    distinct_ = std::max<std::size_t>(1, std::min(distinct_, count_));
  }

  std::size_t count() const { return count_; }

  // Moves the inputs of --input into shared memory where choose_input_sharing() says so, after
  // the shared-memory checks (their trial reservation counts this process's first segment): then a
  // task's send is a lease on the block, not an allocation and a copy of its bytes in this thread,
  // which feeds every worker (9 of the 20 µs this thread spent a task on the CNN's 50 KiB
  // inputs).
  void share_given() {
    if (given_.empty()) return;
    const std::vector<at::Tensor> storages = copied_on_send();
    std::uint64_t bytes = 0;
    for (const auto& t : storages) bytes += t.storage().nbytes();
    const InputSharing choice = choose_input_sharing(bytes, stage_.has_value());
    ferry::log().debug("--input: {}", choice.why);
    if (!choice.share) return;
    try {
      for (const auto& t : storages) ferry::share_(t);  // every view of the storage follows
    } catch (const ferry::Error& e) {
      // The checks passed, but what they reserved is not held: what was not moved is copied
      // on each send, as before.
      if (e.code() != ferry::Errc::shm_exhausted) throw;
      ferry::log().info("--input: left in this process's memory, copied on each send: {}",
                        e.what());
    }
  }

  ferry::Tensors operator()(std::size_t i) const {
    ferry::Tensors ts;
    if (!a_.input.empty()) {
      ts = given_[i];
    } else {
      ts.push_back(synthetic(i % distinct_));
    }
    if (stage_) {
      for (auto& t : ts) t = t.to(*stage_);
    }
    return ts;
  }

 private:
  // Synthetic batch j: made once, then sent again for every task i with i % distinct_ == j.
  // Normal random numbers take 0.8 ms a MiB on one core, which held a run of large batches at
  // the pace of this loop rather than of the pool it is meant to load.
  at::Tensor synthetic(std::size_t j) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (made_.size() <= j) made_.resize(j + 1);
    if (!made_[j].defined()) {
      made_[j] = ferry::empty_shared({a_.batch_size, features_}, at::kFloat);
      made_[j].normal_(0, 1, at::make_generator<at::CPUGeneratorImpl>(1000 + j));
    }
    return made_[j];
  }

  // The storages of --input that a send would copy into the arena, each once: those of a view
  // that the send's own rule (detail::choose) does not carry inside its record. Rows of one
  // tensor saved as a list (`list(x)`) travel in their records as they are, and stay.
  std::vector<at::Tensor> copied_on_send() const {
    std::vector<at::Tensor> out;
    std::unordered_set<const void*> seen;
    for (const auto& task : given_) {
      for (const auto& t : task) {
        if (!t.defined() || !t.has_storage() || !t.device().is_cpu()) continue;
        if (t.layout() != at::kStrided) continue;  // share_ takes dense tensors only
        const ferry::detail::Sending s = ferry::detail::sending(t, false);
        if (s.shared || ferry::detail::choose(s) != ferry::detail::Carrier::shm_cpu) continue;
        if (seen.insert(t.storage().unsafeGetStorageImpl()).second) out.push_back(t);
      }
    }
    return out;
  }

  static constexpr std::uint64_t kSyntheticBytes = kSharedInputBytes;
  static constexpr std::uint64_t kSyntheticBatches = 64;

  const RunArgs& a_;
  mutable std::mutex mu_;
  mutable std::vector<at::Tensor> made_;
  std::size_t distinct_ = 1;
  std::vector<ferry::Tensors> given_;  // each task's, from --input
  std::size_t count_ = 0;
  std::int64_t features_ = 0;
  std::optional<at::Device> stage_;
};

// BadInput unless the workers have the task --task names.
void require_task(const ferry::Pool& pool, const std::string& task) {
  const std::vector<std::string> tasks = pool.tasks();
  if (std::find(tasks.begin(), tasks.end(), task) == tasks.end()) {
    throw BadInput("--task '" + task +
                   "' is not a task of the workers (they have: " + join_names(tasks) +
                   "); register it with FERRY_TASK in a worker and pass --worker");
  }
}

// Streams every batch through the task, gathering what the report needs; a stop signal or a
// broken pool ends the stream early.
RunOutcome stream(ferry::Pool& pool, const RunArgs& a, const Batches& batches) {
  RunOutcome r;
  r.count = batches.count();
  r.results.resize(a.output.empty() ? 0 : r.count);
  const auto t0 = std::chrono::steady_clock::now();
  Progress progress(r.count);
  try {
    auto results = pool.imap_unordered(a.task, r.count, [&](std::size_t i) { return batches(i); });
    for (;;) {
      // Without --json, a wait of a second at most, so that progress shows while long tasks run.
      std::optional<ferry::Pool::Result> got;
      try {
        got = results.next(a.json ? ferry::kForever : std::chrono::milliseconds(1000));
      } catch (const ferry::Error& e) {
        if (e.code() != ferry::Errc::timeout) throw;
        progress.update(r.done, r.errors.size());
        continue;
      }
      if (!got) break;
      ++r.done;
      r.latencies.push_back(std::chrono::duration<double>(got->latency).count());
      if (got->error) {
        try {
          std::rethrow_exception(got->error);
        } catch (const std::exception& e) {
          if (!stop_signal()) r.errors.push_back(e.what());
        }
      } else if (!r.results.empty()) {
        r.results[got->index] = std::move(got->outputs);
      }
      if (!a.json) progress.update(r.done, r.errors.size());
    }
  } catch (const ferry::Error& e) {
    if (!stop_signal()) {
      r.broken = e.what();
      r.broken_detail = e.detail();
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stats = pool.stats();  // before close, while the pids are current
  return r;
}

}  // namespace

int run(const RunArgs& a) {
  ferry::PoolOptions o = pool_options(a);
  if (a.task == "torchscript") check_model(a.model);
  Batches batches(a, o.devices);
  check_shared_memory(static_cast<unsigned>(o.devices.size()));
  batches.share_given();
  const HostsHead hosts(a);
  o.remote = hosts.remote();
  std::optional<ferry::Pool> pool;
  const auto started = std::chrono::steady_clock::now();
  start_pool(pool, o);
  require_task(*pool, a.task);
  if (!a.json) {
    std::vector<std::string> starts, devices;
    for (const auto& w : pool->stats().workers) {
      starts.push_back(w.start);
      devices.push_back(w.device);
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::fprintf(stderr, "ferry: %s\n", ready_text(starts, devices, took).c_str());
  }
  // SIGINT and SIGTERM close the pool: in-flight tasks are cancelled, workers stopped and
  // reaped, and the stream ends.
  const StopSignalThread signals([&] {
    try {
      pool->close(ferry::Shutdown::Cancel);
    } catch (const std::exception& e) {
      ferry::log().error("closing the pool on a signal: {}", e.what());
    }
  });
  if (!hosts.joined_in_time(a)) return stop_signal() ? 128 + stop_signal() : kBroken;

  RunOutcome r = stream(*pool, a, batches);
  pool->close(ferry::Shutdown::Cancel);
  const auto& workers = r.stats.workers;
  if (r.broken.empty() &&
      std::all_of(workers.begin(), workers.end(), [](const auto& w) { return w.given_up; })) {
    r.broken = "ferry: worker_lost: every worker was given up";
  }
  if (stop_signal()) {
    std::fprintf(stderr, "ferry: stopped by %s after %zu of %zu tasks; workers stopped\n",
                 stop_signal() == SIGINT ? "SIGINT" : "SIGTERM", r.done, r.count);
    return 128 + stop_signal();
  }
  print_failures(r);
  if (!a.output.empty() && r.complete()) save_results(a.output, r.results);
  r.hosts = hosts.counts();
  print_summary(a, r);
  if (!r.broken.empty()) return kBroken;
  return r.errors.empty() ? kOk : kTasksFailed;
}

}  // namespace ferry::tools
