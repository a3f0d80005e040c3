// ferry-pool-bench: the pool's own costs beside torch.multiprocessing.Pool doing the same work in
// the same run. Reports the round trip of an empty task through a one-worker pool (target: under
// 50 us) and mlp throughput with 1 and 2 workers, each as a ratio to the Python pool. Medians
// throughout; docs/benchmarks.md explains the numbers.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>

#include "runtime/ferry.hpp"
#include "workers/builtin_tasks.hpp"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Config {
  int round_trips = 5000;
  int batches = 2000;
  int batch_size = 64;
  int repeats = 3;
  std::string python = "/usr/bin/python3";
  std::string peer = FERRY_POOL_PEER;
  std::string json_path;
};

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
  const std::string cmd =
      cfg.python + " '" + cfg.peer + "' --round-trips " + std::to_string(cfg.round_trips) +
      " --batches " + std::to_string(cfg.batches) + " --batch-size " +
      std::to_string(cfg.batch_size) + " --repeats " + std::to_string(cfg.repeats);
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
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    cfg.round_trips = 200;
    cfg.batches = 100;
    cfg.repeats = 1;
  }
  try {
    json r;
    r["cores"] = std::thread::hardware_concurrency();
    std::fprintf(stderr, "ferry-pool-bench: empty-task round trip\n");
    r["ferry"]["empty_round_trip_us"] = empty_round_trip(cfg);
    for (int w : {1, 2}) {
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
    std::printf("  [target < 50 us: %s]\n", rt < 50 ? "PASS" : "MISS");
    for (const char* w : {"1", "2"}) {
      const double f = r["ferry"]["mlp_tasks_per_s"][w];
      std::printf("  mlp [%d x %lld], %s worker(s): ferry %.0f tasks/s", cfg.batch_size,
                  static_cast<long long>(ferry::kMlpFeatures), w, f);
      if (r["torch"].contains("mlp_tasks_per_s")) {
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
