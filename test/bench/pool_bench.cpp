// ferry-pool-bench: the pool's own costs beside torch.multiprocessing.Pool doing the same work in
// the same run. Reports the round trip of one empty task through a one-worker pool, the overhead
// per empty task when many are in flight (target: 15 us or less), and mlp throughput from 1 worker
// to twice the cores, each as a ratio to the Python pool. Medians throughout;
// docs/benchmarks.md explains the numbers.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

#include "runtime/ferry.hpp"
#include "test/bench/bench_support.hpp"
#include "workers/builtin_tasks.hpp"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Tasks in flight per worker for the deep pipelined measurement.
constexpr int kDeep = 32;

struct Config {
  int round_trips = 5000;
  int pipelined = 20000;  // empty tasks per repeat of the pipelined measurement
  std::vector<int> workers;
  int batches = 2000;
  int batch_size = 64;
  int repeats = 3;
  std::string python = "/usr/bin/python3";
  std::string peer = FERRY_POOL_PEER;
  std::string json_path;
};

std::string cpu_model() {
  const std::string model = ferry::bench::read_first_match("/proc/cpuinfo", "model name");
  return model.empty() ? "unknown" : model;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

json empty_round_trip(const Config& cfg) {
  ferry::PoolOptions o;
  o.devices = {"cpu"};
  ferry::Pool pool(o);
  for (int i = 0; i < 200; ++i) pool.submit("echo", {}).get();
  std::vector<double> us;
  for (int i = 0; i < cfg.round_trips; ++i) {
    const auto t0 = Clock::now();
    pool.submit("echo", {}).get();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {{"p50", us[us.size() / 2]}, {"p99", us[us.size() * 99 / 100]}};
}

// Many empty tasks in flight through one worker: the pool's cost per task when no one waits for a
// single answer (submission, hand-over, the worker's dispatch, the result's way back), in us.
// `inflight`: tasks handed to the worker before submission blocks (PoolOptions' default, 0,
// lets the pool choose, 3 to 64; torch.multiprocessing's imap has no such bound).
double empty_pipelined_us(const Config& cfg, int inflight) {
  ferry::PoolOptions o;
  o.devices = {"cpu"};
  o.max_inflight_per_worker = inflight;
  ferry::Pool pool(o);
  const std::vector<ferry::Tensors> inputs(static_cast<std::size_t>(cfg.pipelined));
  pool.map("echo", std::vector<ferry::Tensors>(200));
  std::vector<double> per_task;
  for (int r = 0; r < cfg.repeats; ++r) {
    const auto t0 = Clock::now();
    auto stream = pool.imap_unordered("echo", inputs);
    std::size_t n = 0;
    while (auto res = stream.next()) n += res->error ? 0 : 1;
    if (n != inputs.size()) throw std::runtime_error("pipelined: an empty task failed");
    per_task.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                       static_cast<double>(n));
  }
  return median(per_task);
}

double mlp_rate(const Config& cfg, int workers) {
  ferry::PoolOptions o;
  o.devices.assign(workers, "cpu");
  ferry::Pool pool(o);
  std::vector<ferry::Tensors> batches;
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(5);
  for (int i = 0; i < cfg.batches; ++i) {
    at::Tensor t = ferry::empty_shared({cfg.batch_size, ferry::kMlpFeatures}, at::kFloat);
    t.normal_(0, 1, g);
    batches.push_back({t});
  }
  pool.map("mlp", std::vector<ferry::Tensors>(batches.begin(), batches.begin() + 50));
  std::vector<double> rates;
  for (int r = 0; r < cfg.repeats; ++r) {
    const auto t0 = Clock::now();
    auto stream = pool.imap_unordered("mlp", batches);
    std::size_t n = 0;
    while (auto res = stream.next()) n += res->error ? 0 : 1;
    rates.push_back(static_cast<double>(n) /
                    std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(rates);
}

json python_peer(const Config& cfg) {
  if (::access(cfg.python.c_str(), X_OK) != 0) return {{"skipped", cfg.python + " not found"}};
  std::string workers;
  for (int w : cfg.workers) workers += (workers.empty() ? "" : ",") + std::to_string(w);
  const std::string cmd =
      cfg.python + " '" + cfg.peer + "' --round-trips " + std::to_string(cfg.round_trips) +
      " --pipelined " + std::to_string(cfg.pipelined) + " --batches " +
      std::to_string(cfg.batches) + " --batch-size " + std::to_string(cfg.batch_size) +
      " --repeats " + std::to_string(cfg.repeats) + " --workers " + workers;
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) out += buf;
  if (!p || ::pclose(p) != 0) return {{"skipped", "the Python peer failed: " + cmd}};
  return json::parse(out);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-pool-bench: the pool against torch.multiprocessing.Pool, same run"};
  Config cfg;
  bool quick = false;
  app.add_option("--json", cfg.json_path, "write every number to this JSON file");
  app.add_option("--python", cfg.python, "Python with torch for the baseline");
  app.add_flag("--quick", quick, "few iterations: checks that everything runs");
  auto* pipelined = app.add_option("--pipelined", cfg.pipelined,
                                   "empty tasks per repeat of the in-flight measurement");
  app.add_option("--workers", cfg.workers,
                 "worker counts for the mlp curve (default 1 to twice the cores, at most 8)")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (cfg.workers.empty()) {
    for (int w = 1; w <= std::min(2 * cores, 8); ++w) cfg.workers.push_back(w);
  }
  for (int w : cfg.workers) {
    if (w < 1 || w > 64) {
      std::fprintf(stderr, "ferry-pool-bench: bad worker count %d in --workers (1 to 64)\n", w);
      return 2;
    }
  }
  if (quick) {
    cfg.round_trips = 200;
    if (pipelined->count() == 0) cfg.pipelined = 500;
    cfg.batches = 100;
    cfg.repeats = 1;
    cfg.workers = {1, 2};
  }
  try {
    json r;
    r["tool"] = "ferry-pool-bench";
    r["date"] = ferry::bench::utc_now();
    r["cores"] = cores;
    r["machine"] = {{"cores", cores}, {"cpu_model", cpu_model()}};
    std::fprintf(stderr, "ferry-pool-bench: empty-task round trip\n");
    r["ferry"]["empty_round_trip_us"] = empty_round_trip(cfg);
    std::fprintf(stderr, "ferry-pool-bench: empty tasks in flight\n");
    r["ferry"]["empty_pipelined_us_per_task"] =
        empty_pipelined_us(cfg, ferry::PoolOptions{}.max_inflight_per_worker);
    r["ferry"]["empty_pipelined_deep_us_per_task"] = empty_pipelined_us(cfg, kDeep);
    for (int w : cfg.workers) {
      std::fprintf(stderr, "ferry-pool-bench: mlp with %d worker(s)\n", w);
      r["ferry"]["mlp_tasks_per_s"][std::to_string(w)] = mlp_rate(cfg, w);
    }
    std::fprintf(stderr, "ferry-pool-bench: torch.multiprocessing.Pool baseline\n");
    r["torch"] = python_peer(cfg);

    const double rt = r["ferry"]["empty_round_trip_us"]["p50"];
    std::printf("\nferry-pool-bench, %u cores (medians)\n", r["cores"].get<unsigned>());
    std::printf("  empty task round trip, 1 worker: ferry %.1f us (p99 %.1f)", rt,
                r["ferry"]["empty_round_trip_us"]["p99"].get<double>());
    if (r["torch"].contains("empty_round_trip_us")) {
      const double py = r["torch"]["empty_round_trip_us"]["p50"];
      std::printf(", torch.multiprocessing %.1f us: %.1fx faster", py, py / rt);
    }
    std::printf("\n");
    const double pipelined = r["ferry"]["empty_pipelined_us_per_task"];
    std::printf("  empty tasks in flight, 1 worker, the default depth: ferry %.1f us per task",
                pipelined);
    if (r["torch"].contains("empty_pipelined_us_per_task")) {
      const double py = r["torch"]["empty_pipelined_us_per_task"];
      std::printf(", torch.multiprocessing %.1f us: %.1fx faster", py, py / pipelined);
    }
    const double deep = r["ferry"]["empty_pipelined_deep_us_per_task"];
    std::printf(
        "\n  the same with %d in flight (max_inflight_per_worker): ferry %.1f us per task"
        "  [target <= 15 us: %s]\n",
        kDeep, deep, std::min(pipelined, deep) <= 15 ? "PASS" : "MISS");
    const double one = r["ferry"]["mlp_tasks_per_s"][std::to_string(cfg.workers.front())];
    for (int wi : cfg.workers) {
      const std::string w = std::to_string(wi);
      const double f = r["ferry"]["mlp_tasks_per_s"][w];
      std::printf("  mlp [%d x %lld], %s worker(s): ferry %.0f tasks/s (%.2fx of %d)",
                  cfg.batch_size, static_cast<long long>(ferry::kMlpFeatures), w.c_str(), f,
                  f / one, cfg.workers.front());
      if (r["torch"].contains("mlp_tasks_per_s") && r["torch"]["mlp_tasks_per_s"].contains(w)) {
        const double py = r["torch"]["mlp_tasks_per_s"][w];
        std::printf(", torch.multiprocessing %.0f tasks/s: %.2fx", py, f / py);
      }
      std::printf("\n");
    }
    if (!cfg.json_path.empty()) std::ofstream(cfg.json_path) << r.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-pool-bench: %s\n", e.what());
    return 1;
  }
}
