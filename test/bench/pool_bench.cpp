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
#include <ATen/Parallel.h>

#include "runtime/ferry.hpp"
#include "test/bench/bench_limits.hpp"
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
  double time_cap_s = 2.0;  // for the wake-up floor's round trips
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

// ---- the limits (docs/benchmarks.md, "Every row against its limit") --------------------------

// One send and one receive of an empty message through a queue, in one process, one thread: the
// caller's own part of each task in flight (it sends the task and takes the result; the worker
// does the same on its side at once), with no process to wake. CPU microseconds, median of
// batches.
double empty_hand_off_alone_us(int messages) {
  auto q = ferry::TensorQueue::create({8});
  for (int i = 0; i < 200; ++i) {
    q.send({}, std::chrono::seconds(60));
    q.recv(std::chrono::seconds(60));
  }
  std::vector<double> per_message;
  const int batch = std::max(1, messages / 10);
  for (int b = 0; b < 10; ++b) {
    const double t0 = ferry::bench::cpu_seconds();
    for (int i = 0; i < batch; ++i) {
      q.send({}, std::chrono::seconds(60));
      q.recv(std::chrono::seconds(60));
    }
    per_message.push_back((ferry::bench::cpu_seconds() - t0) * 1e6 / batch);
  }
  return median(per_message);
}

// The mlp task alone, on one [batch_size x features] batch, in a forked process with one
// intra-op thread (this one's threads stay as the pools need them): CPU seconds per task.
double mlp_alone_s(const Config& cfg) {
  ferry::bench::Link link;
  ferry::bench::Child child(
      [&] {
        link.child_side();
        at::set_num_threads(1);
        const at::Tensor x = at::randn({cfg.batch_size, ferry::kMlpFeatures});
        for (int i = 0; i < 20; ++i) ferry::reference_mlp(x);
        std::vector<double> per_task;
        const int batch = std::max(1, cfg.batches / 10);
        for (int b = 0; b < 10; ++b) {
          const double t0 = ferry::bench::cpu_seconds();
          for (int i = 0; i < batch; ++i) ferry::reference_mlp(x);
          per_task.push_back((ferry::bench::cpu_seconds() - t0) / batch);
        }
        link.send(median(per_task));
      },
      "ferry-pool-bench: mlp alone");
  link.parent_side();
  const auto s = link.recv<double>();
  child.wait();
  return s;
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

// ---- the rows: ferry's figure, torch's, the ratio, the goal, the limit ----------------------

json row(const std::string& name, const std::string& unit, const json& ferry_figure,
         const json& torch_figure, const json& ratio, const json& limit) {
  return {{"name", name},          {"unit", unit},   {"ferry", ferry_figure},
          {"torch", torch_figure}, {"ratio", ratio}, {"limit", limit}};
}

// torch's figure at `path` in the peer's JSON, or null where it has none.
json torch_figure(const json& r, const json::json_pointer& path) {
  return r["torch"].contains(path) ? r["torch"][path] : json(nullptr);
}

json ratio_of(const json& a, const json& b) {
  if (!a.is_number() || !b.is_number() || b.get<double>() <= 0) return nullptr;
  return a.get<double>() / b.get<double>();
}

json rows(const json& r, const Config& cfg) {
  using ferry::bench::limit_json;
  using ferry::bench::rate_limit;
  using ferry::bench::time_limit;
  const json& f = r["ferry"];
  const json& m = r["limits_measured"];
  json out = json::array();

  // One task at a time: every hop of caller -> worker -> caller waits for the one before.
  const json& rt = f["empty_round_trip_us"];
  const double floor = std::min(m["wake_floor"]["pipe_1byte_us"]["p50"].get<double>(),
                                m["wake_floor"]["shared_word_us"]["p50"].get<double>());
  json floors = json::array();
  for (const char* pct : {"p50", "p99"}) {
    floors.push_back(
        json(limit_json(time_limit(std::string("ferry ") + pct, ferry::bench::kWakeFloorName, "us",
                                   floor, rt[pct].get<double>()))));
  }
  const json torch_rt = torch_figure(r, "/empty_round_trip_us/p50"_json_pointer);
  out.push_back(row("empty task round trip, 1 worker", "us", rt, torch_rt,
                    ratio_of(torch_rt, rt["p50"]), floors));

  // Tasks in flight: no one waits for an answer, so the caller's own hand-offs bound the rate.
  const std::string hand_off =
      "hand-off floor: one send and one receive of an empty message in one process, one thread "
      "(the caller's part of a task)";
  const double alone = m["empty_hand_off_alone_us"].get<double>();
  const json& pipelined = f["empty_pipelined_us_per_task"];
  const json torch_pipelined = torch_figure(r, "/empty_pipelined_us_per_task"_json_pointer);
  out.push_back(row("empty tasks in flight, 1 worker, the default depth, per task", "us", pipelined,
                    torch_pipelined, ratio_of(torch_pipelined, pipelined),
                    limit_json(time_limit("", hand_off, "us", alone, pipelined.get<double>()))));
  const json& deep = f["empty_pipelined_deep_us_per_task"];
  json deep_row =
      row("empty tasks, " + std::to_string(kDeep) + " in flight, 1 worker, per task", "us", deep,
          nullptr, nullptr, limit_json(time_limit("", hand_off, "us", alone, deep.get<double>())));
  deep_row["goal"] = "<= 15 us (either depth)";
  deep_row["result"] =
      std::min(pipelined.get<double>(), deep.get<double>()) <= 15 ? "PASS" : "MISS";
  out.push_back(deep_row);

  // The mlp: its compute alone, as many at once as there are workers and cores.
  const double one = f["mlp_tasks_per_s"][std::to_string(cfg.workers.front())].get<double>();
  for (int w : cfg.workers) {
    const std::string key = std::to_string(w);
    const double rate = f["mlp_tasks_per_s"][key].get<double>();
    const ferry::bench::Ceiling c =
        ferry::bench::compute_ceiling("the mlp task on a [" + std::to_string(cfg.batch_size) +
                                          " x " + std::to_string(ferry::kMlpFeatures) + "] batch",
                                      w, "workers");
    const json torch_rate = torch_figure(r, json::json_pointer("/mlp_tasks_per_s/" + key));
    json mlp = row("mlp [" + std::to_string(cfg.batch_size) + " x " +
                       std::to_string(ferry::kMlpFeatures) + "], " + key + " worker(s)",
                   "tasks/s", rate, torch_rate, ratio_of(rate, torch_rate),
                   limit_json(rate_limit("", c.name, "tasks/s",
                                         c.factor / m["mlp_alone_s"].get<double>(), rate)));
    mlp["of_first"] = rate / one;  // against the first worker count's rate
    out.push_back(mlp);
  }
  return out;
}

std::string ferry_cell(const json& row) {
  using ferry::bench::num;
  const json& f = row["ferry"];
  std::string cell =
      f.is_object() ? num(f["p50"].get<double>()) + " (p99 " + num(f["p99"].get<double>()) + ")"
                    : num(f.get<double>());
  if (row.contains("of_first")) cell += ", " + num(row["of_first"].get<double>()) + "x";
  return cell;
}

std::string goal_cell(const json& row) {
  if (!row.contains("goal")) return "-";
  return row["goal"].get<std::string>() + ": " + row["result"].get<std::string>();
}

std::string number_cell(const json& v, const std::string& suffix = "") {
  return v.is_number() ? ferry::bench::num(v.get<double>()) + suffix : "-";
}

// A row's figure, torch's, the ratio (how many times better ferry is), its goal, and its limit
// with the share reached (p50 / p99 where the row has both); then what each limit is.
void print_rows(const json& r) {
  using ferry::bench::pad;
  std::size_t w = std::string("measurement").size();
  auto label = [](const json& row) {
    return row["name"].get<std::string>() + " (" + row["unit"].get<std::string>() + ")";
  };
  for (const json& row : r["rows"]) w = std::max(w, label(row).size());
  std::printf("\nferry-pool-bench, %u cores (medians)\n", r["cores"].get<unsigned>());
  std::printf("%s%s%s%s%s%s%s\n", pad("measurement", w + 2).c_str(), pad("ferry", 18).c_str(),
              pad("torch.mp", 10).c_str(), pad("ratio", 9).c_str(), pad("goal", 30).c_str(),
              pad("limit", 20).c_str(), "share");
  for (const json& row : r["rows"]) {
    std::printf("%s%s%s%s%s%s%s\n", pad(label(row), w + 2).c_str(),
                pad(ferry_cell(row), 18).c_str(), pad(number_cell(row["torch"]), 10).c_str(),
                pad(number_cell(row["ratio"], "x"), 9).c_str(), pad(goal_cell(row), 30).c_str(),
                pad(ferry::bench::limit_cells(row["limit"]), 20).c_str(),
                ferry::bench::share_cells(row["limit"]).c_str());
  }
  std::printf("limits:\n");
  for (const std::string& name : ferry::bench::limit_names(r["rows"])) {
    std::printf("  %s\n", name.c_str());
  }
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
    cfg.time_cap_s = 0.5;
    cfg.workers = {1, 2};
  }
  try {
    json r;
    r["tool"] = "ferry-pool-bench";
    r["date"] = ferry::bench::utc_now();
    r["cores"] = cores;
    r["machine"] = {{"cores", cores}, {"cpu_model", cpu_model()}};
    // The limits first, before any pool: no worker is running beside them.
    std::fprintf(stderr, "ferry-pool-bench: limits: the wake-up floor, a hand-off alone\n");
    r["limits_measured"]["wake_floor"] =
        ferry::bench::wake_floor_json(ferry::bench::wake_floor(cfg.round_trips, cfg.time_cap_s));
    r["limits_measured"]["empty_hand_off_alone_us"] = empty_hand_off_alone_us(cfg.pipelined);
    std::fprintf(stderr, "ferry-pool-bench: empty-task round trip\n");
    r["ferry"]["empty_round_trip_us"] = empty_round_trip(cfg);
    std::fprintf(stderr, "ferry-pool-bench: empty tasks in flight\n");
    r["ferry"]["empty_pipelined_us_per_task"] =
        empty_pipelined_us(cfg, ferry::PoolOptions{}.max_inflight_per_worker);
    r["ferry"]["empty_pipelined_deep_us_per_task"] = empty_pipelined_us(cfg, kDeep);
    std::fprintf(stderr, "ferry-pool-bench: limits: the mlp task alone\n");
    r["limits_measured"]["mlp_alone_s"] = mlp_alone_s(cfg);
    for (int w : cfg.workers) {
      std::fprintf(stderr, "ferry-pool-bench: mlp with %d worker(s)\n", w);
      r["ferry"]["mlp_tasks_per_s"][std::to_string(w)] = mlp_rate(cfg, w);
    }
    std::fprintf(stderr, "ferry-pool-bench: torch.multiprocessing.Pool baseline\n");
    r["torch"] = python_peer(cfg);
    r["rows"] = rows(r, cfg);
    print_rows(r);
    if (!cfg.json_path.empty()) std::ofstream(cfg.json_path) << r.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-pool-bench: %s\n", e.what());
    return 1;
  }
}
