// ferry-cuda-bench: CUDA tensors between processes, beside the same transfers with
// torch.multiprocessing (cuda_peer.py) and beside cudaMemcpy device-to-device, in one run.
//   handoff     round trip of a 1 MiB CUDA tensor between two processes, handles cached
//   first_open  what a receiver pays the first time it meets an allocation (cudaIpcOpenMemHandle)
//   copy        copy-on-send (a detached send) bandwidth against a device-to-device copy
// Medians throughout. Without a GPU it says why and exits 0 ("skipped"), so `make bench` runs
// anywhere; docs/benchmarks.md explains the numbers.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "../gpu_check.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "runtime/ferry.hpp"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Config {
  int round_trips = 2000;
  int opens = 50;
  int copies = 20;
  std::int64_t copy_bytes = std::int64_t{256} << 20;
  std::string python = "python3";
  std::string peer = FERRY_CUDA_PEER;
  std::string json_path;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

const at::TensorOptions kCuda = at::TensorOptions().device(at::kCUDA, 0).dtype(at::kFloat);

// Forks `fn` as a child (before this process touches CUDA) and returns its pid.
template <class F>
pid_t fork_child(F fn) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry-cuda-bench child: %s\n", e.what());
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

int reap(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The parent sends one persistent 1 MiB tensor, the child answers with its own: after warm-up
// both ends hit their caches, so this is the cost of a cached hand-off each way.
json handoff(const Config& cfg) {
  auto there = ferry::TensorQueue::create({4});
  auto back = ferry::TensorQueue::create({4});
  const int total = cfg.round_trips + 100;
  const pid_t child = fork_child([&] {
    at::Tensor mine = at::ones({1 << 18}, kCuda);
    for (int i = 0; i < total; ++i) {
      ferry::Tensors m = there.recv(60s);
      back.send({mine}, 60s);
    }
  });
  at::Tensor mine = at::ones({1 << 18}, kCuda);
  std::vector<double> us;
  for (int i = 0; i < total; ++i) {
    const auto t0 = Clock::now();
    there.send({mine}, 60s);
    ferry::Tensors reply = back.recv(60s);
    if (i >= 100) us.push_back(us_since(t0));
  }
  if (reap(child) != 0) throw std::runtime_error("hand-off child failed");
  std::sort(us.begin(), us.end());
  return {{"p50_us", us[us.size() / 2]}, {"p99_us", us[us.size() * 99 / 100]}};
}

// A receiver that closes mappings at once (FERRY_CUDA_LINGER_MS=0) and waits for the closer
// between tensors meets the allocation anew each time: its recv pays cudaIpcOpenMemHandle.
json first_open(const Config& cfg) {
  auto there = ferry::TensorQueue::create({4});
  auto back = ferry::TensorQueue::create({4});
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe");
  const pid_t child = fork_child([&] {
    ::setenv("FERRY_CUDA_LINGER_MS", "0", 1);
    std::vector<double> open_us, hit_us;
    ferry::Tensors held;
    for (int i = 0; i < 2 * cfg.opens; ++i) {
      const auto before = ferry::transport_stats().cuda_handles_opened;
      const auto t0 = Clock::now();
      ferry::Tensors m = there.recv(60s);
      const double t = us_since(t0);
      (ferry::transport_stats().cuda_handles_opened > before ? open_us : hit_us).push_back(t);
      if (i % 2 == 0) {
        held = std::move(m);  // keeps the mapping for the second tensor of the pair
      } else {
        held.clear();  // the last views go...
        m.clear();
        std::this_thread::sleep_for(20ms);  // ...and the closer closes the mapping
      }
      back.send({}, 60s);
    }
    const double result[2] = {median(open_us), median(hit_us)};
    (void)!::write(fds[1], result, sizeof result);
  });
  // Pairs of tensors from one allocation: the first of each pair opens it, the second hits.
  at::Tensor block = at::ones({1 << 20}, kCuda);
  for (int i = 0; i < 2 * cfg.opens; ++i) {
    there.send({block.narrow(0, (i % 2) * 1024, 1024)}, 60s);
    back.recv(60s);
  }
  double result[2] = {0, 0};
  const bool got = ::read(fds[0], result, sizeof result) == sizeof result;
  ::close(fds[0]);
  ::close(fds[1]);
  if (reap(child) != 0 || !got) throw std::runtime_error("first-open child failed");
  return {{"open_recv_us", result[0]}, {"cached_recv_us", result[1]}};
}

// Detached sends copy into a fresh block on the device; a device-to-device copy of the same
// bytes is the ceiling. Each timed from the call until the device finished it.
json copy_bandwidth(const Config& cfg) {
  auto q = ferry::TensorQueue::create({4});
  const pid_t child = fork_child([&] {
    for (int i = 0; i < cfg.copies + 2; ++i) q.recv(60s);
  });
  at::Tensor x = at::ones({cfg.copy_bytes / 4}, kCuda);
  std::vector<double> send_s, memcpy_s;
  ferry::TensorQueue::SendOptions detached;
  detached.detached = true;
  detached.timeout = 60s;
  for (int i = 0; i < cfg.copies + 2; ++i) {
    (void)ferry::cuda::synchronize_device(0);
    auto t0 = Clock::now();
    q.send({x}, detached);
    (void)ferry::cuda::synchronize_device(0);
    if (i >= 2) send_s.push_back(us_since(t0) / 1e6);
    t0 = Clock::now();
    at::Tensor y = at::empty_like(x).copy_(x);
    (void)ferry::cuda::synchronize_device(0);
    if (i >= 2) memcpy_s.push_back(us_since(t0) / 1e6);
  }
  if (reap(child) != 0) throw std::runtime_error("copy child failed");
  const double gb = static_cast<double>(cfg.copy_bytes) / 1e9;
  const double send_gbps = gb / median(send_s), memcpy_gbps = gb / median(memcpy_s);
  return {{"bytes", cfg.copy_bytes},
          {"copy_on_send_GBps", send_gbps},
          {"device_memcpy_GBps", memcpy_gbps},
          {"ratio", send_gbps / memcpy_gbps}};
}

json python_peer(const Config& cfg) {
  const std::string cmd = cfg.python + " '" + cfg.peer + "' --round-trips " +
                          std::to_string(cfg.round_trips) + " --copy-bytes " +
                          std::to_string(cfg.copy_bytes);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {{"status", "failed"}, {"reason", "cannot run " + cmd}};
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  try {
    json j = json::parse(out);
    if (status != 0 && !j.contains("skipped")) j["status"] = "failed";
    return j;
  } catch (const std::exception&) {
    return {{"status", "failed"}, {"reason", cmd + " printed no JSON"}};
  }
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool quick = false;
  CLI::App app{"ferry-cuda-bench: CUDA tensors between processes, beside torch.multiprocessing"};
  app.add_flag("--quick", quick, "few iterations: checks that everything runs");
  app.add_option("--python", cfg.python, "Python with a CUDA PyTorch, for the baseline");
  app.add_option("--json", cfg.json_path, "also write the results to this file");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    cfg.round_trips = 50;
    cfg.opens = 5;
    cfg.copies = 3;
    cfg.copy_bytes = 16 << 20;
  }

  json doc;
  if (const std::string why = ferry::test::gpu_unavailable(); !why.empty()) {
    std::printf("ferry-cuda-bench: skipped: %s\n", why.c_str());
    doc = {{"status", "skipped"}, {"reason", why}};
  } else {
    // Each measurement runs in a process of its own, forked from this one, which never touches
    // CUDA: so each can fork its receiver before its own first CUDA call.
    auto isolated = [&](const char* name, json (*fn)(const Config&)) -> json {
      int fds[2];
      if (::pipe(fds) != 0) return {{"status", "failed"}};
      const pid_t pid = fork_child([&] {
        const std::string s = fn(cfg).dump();
        (void)!::write(fds[1], s.data(), s.size());
      });
      ::close(fds[1]);
      std::string out;
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fds[0], buf, sizeof buf)) > 0)
        out.append(buf, static_cast<std::size_t>(n));
      ::close(fds[0]);
      if (reap(pid) != 0 || out.empty()) return {{"status", "failed"}, {"measure", name}};
      return json::parse(out);
    };
    doc["ferry"] = {{"handoff", isolated("handoff", handoff)},
                    {"first_open", isolated("first_open", first_open)},
                    {"copy", isolated("copy", copy_bandwidth)}};
    doc["torch_multiprocessing"] = python_peer(cfg);
    const json& f = doc["ferry"];
    const json& t = doc["torch_multiprocessing"];
    std::printf("ferry-cuda-bench (medians)\n");
    std::printf("  hand-off round trip, 1 MiB, cached: ferry %.1f us",
                f["handoff"].value("p50_us", 0.0));
    if (t.contains("handoff_p50_us")) {
      std::printf(", torch.multiprocessing %.1f us (ratio %.2fx)",
                  t["handoff_p50_us"].get<double>(),
                  t["handoff_p50_us"].get<double>() / f["handoff"].value("p50_us", 1.0));
    }
    std::printf("\n  first open: recv %.1f us (a cached recv %.1f us)",
                f["first_open"].value("open_recv_us", 0.0),
                f["first_open"].value("cached_recv_us", 0.0));
    if (t.contains("first_recv_us"))
      std::printf(", torch first recv %.1f us", t["first_recv_us"].get<double>());
    std::printf("\n  copy-on-send: %.1f GB/s, device memcpy %.1f GB/s (ratio %.2f)\n",
                f["copy"].value("copy_on_send_GBps", 0.0),
                f["copy"].value("device_memcpy_GBps", 0.0), f["copy"].value("ratio", 0.0));
    if (t.contains("skipped"))
      std::printf("  torch.multiprocessing: skipped: %s\n",
                  t["skipped"].get<std::string>().c_str());
  }
  if (!cfg.json_path.empty()) std::ofstream(cfg.json_path) << doc.dump(2) << "\n";
  return 0;
}
