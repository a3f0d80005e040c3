// ferry-cuda-bench: CUDA tensors between processes, beside the same transfers with
// torch.multiprocessing (cuda_peer.py, which mirrors every measure here) and beside a
// device-to-device copy, in one run and one table:
//   handoff     round trip of a 1 MiB CUDA tensor between two processes, handles cached
//   first_open  what a receiver pays the first time it meets an allocation (cudaIpcOpenMemHandle)
//   copy        copy-on-send (a detached send) bandwidth against a device-to-device copy
//   ledger      the lease's cost per send in the CUDA ledger (shared memory: runs without a GPU)
// --breakdown runs the hand-off once more with ferry's step tally on (ipc/step_times.hpp) and
// prints where each side's time goes: every CUDA call and every transport step, per round trip.
// --device cpu runs the hand-off (and its breakdown) with a CPU tensor in shared memory instead:
// the path without CUDA, on any machine.
// p50 is the median; percentiles are nearest-rank, as in the peer. Without a GPU the CUDA rows say
// why they were skipped and the run exits 0, so `make bench` runs anywhere; docs/benchmarks.md
// explains the numbers.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <optional>
#include <regex>
#include <string>
#include <thread>

#include "../gpu_check.hpp"
#include "ipc/channel.hpp"
#include "ipc/cuda/devices.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/ledger.hpp"
#include "ipc/segment.hpp"
#include "ipc/step_times.hpp"
#include "runtime/ferry.hpp"
#include "runtime/transport/cuda_ipc/cuda_ipc.hpp"
#include "runtime/transport/cuda_ipc/stream.hpp"
#include "test/bench/bench_limits.hpp"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Each constant has its twin in cuda_peer.py; the two columns compare only if they agree.
constexpr int kWarmupRoundTrips = 100;
constexpr std::int64_t kHandoffFloats = std::int64_t{1} << 18;  // 1 MiB of float32
constexpr std::int64_t kBlockFloats = std::int64_t{1} << 20;    // first_open's allocation
constexpr std::int64_t kViewFloats = 1024;                      // each view sent from it
constexpr int kWarmupCopies = 2;

// The issue's goals.
constexpr double kHandoffGoalUs = 30;
constexpr double kCopyGoalRatio = 0.8;

// The CUDA ledger's default size (FERRY_CUDA_LEASE_SLOTS), and how many released leases one
// reclaim frees: the reaper wakes every 20 ms, by which time a stream of sends has released many.
constexpr std::uint32_t kLeaseSlots = 4096;
constexpr int kLedgerBatch = 64;

struct Config {
  int round_trips = 2000;
  int opens = 50;
  int copies = 20;
  std::int64_t copy_bytes = std::int64_t{256} << 20;
  int ledger_batches = 2000;
  std::string python = FERRY_CUDA_PYTHON;
  std::string peer;
  bool torch = true;
  std::string json_path;
  bool breakdown = false;
  std::string device = "cuda";  // or "cpu": the hand-off only, through shared memory
};

// Nearest-rank percentile (pct an integer percent), the definition cuda_peer.py uses.
double percentile(std::vector<double> v, int pct) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t rank = (static_cast<std::size_t>(pct) * v.size() + 99) / 100;
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Three significant digits or so, whatever the magnitude.
std::string num(double v) {
  if (v >= 100) return fmt("%.0f", v);
  if (v >= 10) return fmt("%.1f", v);
  if (v >= 1) return fmt("%.2f", v);
  return fmt("%.3f", v);
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

// Everything `fd` yields until its writers close it.
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

// Runs `fn` in a forked child and returns the JSON it produced: the child may use CUDA, this
// process must not (it forks the next measurement's receiver afterwards).
template <class F>
json in_child(const char* name, F fn) {
  int fds[2];
  if (::pipe(fds) != 0) return {{"status", "failed"}, {"reason", "pipe"}};
  const pid_t pid = fork_child([&] {
    ::close(fds[0]);
    const std::string s = json(fn()).dump();
    (void)!::write(fds[1], s.data(), s.size());
  });
  ::close(fds[1]);
  const std::string out = read_all(fds[0]);
  ::close(fds[0]);
  const int code = reap(pid);
  json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (code != 0 || j.is_discarded()) {
    return {{"status", "failed"},
            {"reason", std::string(name) + " exited with " + std::to_string(code) +
                           " (its error is on stderr)"}};
  }
  return j;
}

// The hand-off's tensor: 1 MiB of float32 on cuda:0, or in shared memory with --device cpu.
at::Tensor handoff_tensor(const Config& cfg) {
  if (cfg.device == "cpu") return ferry::empty_shared({kHandoffFloats}, at::kFloat).fill_(1);
  return at::ones({kHandoffFloats}, kCuda);
}

// This process's step tally, per round trip, biggest first.
json tally_per_round_trip(int round_trips) {
  std::vector<ferry::steps::Tally> all = ferry::steps::snapshot();
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.ns > b.ns; });
  json out = json::array();
  for (const auto& t : all) {
    out.push_back({{"step", t.step},
                   {"thread", t.thread},
                   {"calls", static_cast<double>(t.calls) / round_trips},
                   {"us", static_cast<double>(t.ns) / 1e3 / round_trips}});
  }
  return out;
}

// The parent sends one persistent 1 MiB tensor, the child answers with its own: after warm-up
// both ends hit their caches, so this is the cost of a cached hand-off each way. With `tally`,
// each side counts its steps over the timed round trips, and the child's come back by a pipe.
json handoff(const Config& cfg, bool tally = false) {
  auto there = ferry::TensorQueue::create({4});
  auto back = ferry::TensorQueue::create({4});
  const int total = cfg.round_trips + kWarmupRoundTrips;
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe");
  const pid_t child = fork_child([&] {
    ::close(fds[0]);
    at::Tensor mine = handoff_tensor(cfg);
    ferry::steps::enable(tally);
    for (int i = 0; i < total; ++i) {
      if (i == kWarmupRoundTrips) ferry::steps::reset();
      ferry::Tensors m = there.recv(60s);
      back.send({mine}, 60s);
    }
    // fork_child ends in _exit, which skips the exit flush: without this wait the last reply
    // could be lost when the parent, seeing this process gone, lets go of its segments before
    // it takes the reply (seen under load).
    if (ferry::flush(60s) != 0) throw std::runtime_error("the last reply was not taken");
    const std::string steps = tally_per_round_trip(cfg.round_trips).dump();
    (void)!::write(fds[1], steps.data(), steps.size());
  });
  ::close(fds[1]);
  at::Tensor mine = handoff_tensor(cfg);
  ferry::steps::enable(tally);
  std::vector<double> us;
  for (int i = 0; i < total; ++i) {
    if (i == kWarmupRoundTrips) ferry::steps::reset();
    const auto t0 = Clock::now();
    there.send({mine}, 60s);
    ferry::Tensors reply = back.recv(60s);
    if (i >= kWarmupRoundTrips) us.push_back(us_since(t0));
  }
  const json first = tally_per_round_trip(cfg.round_trips);
  ferry::steps::enable(false);
  const json echo = json::parse(read_all(fds[0]), nullptr, /*allow_exceptions=*/false);
  ::close(fds[0]);
  if (reap(child) != 0) throw std::runtime_error("hand-off child failed");
  json r = {{"p50_us", percentile(us, 50)}, {"p99_us", percentile(us, 99)}, {"n", us.size()}};
  if (tally) r["steps"] = {{"first", first}, {"echo", echo}};
  return r;
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
    const double result[3] = {percentile(open_us, 50), percentile(hit_us, 50),
                              static_cast<double>(open_us.size())};
    (void)!::write(fds[1], result, sizeof result);
  });
  // Pairs of views of one allocation: the first of each pair opens it, the second hits.
  at::Tensor block = at::ones({kBlockFloats}, kCuda);
  for (int i = 0; i < 2 * cfg.opens; ++i) {
    there.send({block.narrow(0, (i % 2) * kViewFloats, kViewFloats)}, 60s);
    back.recv(60s);
  }
  double result[3] = {0, 0, 0};
  const bool got = ::read(fds[0], result, sizeof result) == sizeof result;
  ::close(fds[0]);
  ::close(fds[1]);
  if (reap(child) != 0 || !got) throw std::runtime_error("first-open child failed");
  // Fewer opens than pairs means the cache kept a mapping the test meant to close: say so.
  return {{"open_recv_us", result[0]},
          {"cached_recv_us", result[1]},
          {"n", cfg.opens},
          {"opens_seen", static_cast<int>(result[2])}};
}

// The device's own clock: two timing events on cuda:0's current stream around the work.
class DeviceTimer {
 public:
  DeviceTimer() {
    check(ferry::cuda::create_timing_event(0, &start_), "creating a timing event");
    check(ferry::cuda::create_timing_event(0, &end_), "creating a timing event");
  }
  // Seconds the device spent between the work's first and last operation on the stream.
  template <class F>
  double seconds(F work) {
    void* stream = ferry::detail::current_cuda_stream(0);
    check(ferry::cuda::record_event(start_, stream), "recording a timing event");
    work();
    check(ferry::cuda::record_event(end_, stream), "recording a timing event");
    check(ferry::cuda::event_synchronize(end_), "waiting for a timing event");
    float ms = 0;
    check(ferry::cuda::elapsed_ms(start_, end_, &ms), "reading a timing event");
    return ms / 1e3;
  }

 private:
  static void check(const ferry::cuda::Status& s, const char* doing) {
    if (!s.ok()) throw std::runtime_error(std::string(doing) + ": " + s.error);
  }
  void* start_ = nullptr;
  void* end_ = nullptr;
};

// Waits until every CUDA lease this process gave out has come back, so the copies they held are
// in LibTorch's cache again: each timed copy then starts from the same allocator state.
void wait_for_leases() {
  const auto until = Clock::now() + 10s;
  while (ferry::detail::cuda_in_flight() != 0) {
    if (Clock::now() > until) throw std::runtime_error("a CUDA lease did not come back in 10 s");
    std::this_thread::sleep_for(1ms);
  }
}

// Copy-on-send (a detached send: a fresh block on the device, exported) against a
// device-to-device copy of the same bytes into a fresh block, timed alike: a DeviceTimer on the
// same stream, after a warm-up, each from the same allocator state (the last copy back in
// LibTorch's cache) and with the receiver idle (it has dropped the tensor and said so, and its
// mapping is closed: FERRY_CUDA_LINGER_MS=0). Then the peer copy: what the receiver pays to copy
// a tensor it received by handle, instead of using it in place, timed the same way there.
json copy_bandwidth(const Config& cfg) {
  auto q = ferry::TensorQueue::create({4});
  auto back = ferry::TensorQueue::create({4});
  const int total = cfg.copies + kWarmupCopies;
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe");
  const pid_t child = fork_child([&] {
    ::close(fds[0]);
    ::setenv("FERRY_CUDA_LINGER_MS", "0", 1);
    for (int i = 0; i < total; ++i) {
      q.recv(60s);  // dropped at once
      back.send({}, 60s);
    }
    DeviceTimer timer;
    std::vector<double> peer_s;
    for (int i = 0; i < total; ++i) {
      ferry::Tensors m = q.recv(60s);
      const double t = timer.seconds([&] { at::empty_like(m[0]).copy_(m[0]); });
      if (i >= kWarmupCopies) peer_s.push_back(t);
      m.clear();
      back.send({}, 60s);
    }
    const double median = percentile(peer_s, 50);
    (void)!::write(fds[1], &median, sizeof median);
  });
  ::close(fds[1]);
  at::Tensor x = at::ones({cfg.copy_bytes / 4}, kCuda);
  DeviceTimer timer;
  std::vector<double> send_s, memcpy_s;
  ferry::TensorQueue::SendOptions detached;
  detached.detached = true;
  detached.timeout = 60s;
  for (int i = 0; i < total; ++i) {
    const double sent = timer.seconds([&] { q.send({x}, detached); });
    back.recv(60s);
    wait_for_leases();
    const double copied = timer.seconds([&] { at::empty_like(x).copy_(x); });
    if (i >= kWarmupCopies) {
      send_s.push_back(sent);
      memcpy_s.push_back(copied);
    }
  }
  for (int i = 0; i < total; ++i) {  // by handle, for the peer copy
    q.send({x}, 60s);
    back.recv(60s);
  }
  double peer_s = 0;
  const bool got = ::read(fds[0], &peer_s, sizeof peer_s) == sizeof peer_s;
  ::close(fds[0]);
  if (reap(child) != 0 || !got || peer_s <= 0) throw std::runtime_error("copy child failed");
  const double gb = static_cast<double>(cfg.copy_bytes) / 1e9;
  const double send_gbps = gb / percentile(send_s, 50);
  const double memcpy_gbps = gb / percentile(memcpy_s, 50);
  return {{"bytes", cfg.copy_bytes},           {"copy_on_send_GBps", send_gbps},
          {"device_memcpy_GBps", memcpy_gbps}, {"peer_copy_GBps", gb / peer_s},
          {"ratio", send_gbps / memcpy_gbps},  {"n", send_s.size()}};
}

// A lease's whole life in a ledger of the CUDA ledger's size, per tensor sent: acquire and route
// (the sender, in send), claim and release (the receiver, in its pop and through its closer), and
// a share of one reclaim (the sender's reaper). In one process, so it is the ledger's own work:
// no cache lines travel between cores, and the closer's device wait is not in it.
json ledger_cost(const Config& cfg) {
  auto ledger = ferry::Ledger::create(kLeaseSlots);
  auto channel = ferry::Channel::create({});
  const ferry::Segment& segment = *ledger->segment();
  const pid_t me = ::getpid();
  std::vector<ferry::Ledger::Lease> leases(kLedgerBatch);
  std::vector<double> send_ns, receive_ns, reclaim_ns, total_ns;
  std::uint64_t seq = 0;
  const int warmup = std::max(1, cfg.ledger_batches / 10);
  for (int b = 0; b < warmup + cfg.ledger_batches; ++b) {
    const auto t0 = Clock::now();
    for (auto& l : leases) {
      l = ledger->acquire(std::make_shared<int>(b));  // the real keepalive is a shared_ptr too
      ledger->route(l, channel, seq++);
    }
    const auto t1 = Clock::now();
    for (const auto& l : leases) {
      if (!ferry::Ledger::claim(segment, l.slot, l.gen, me))
        throw std::runtime_error("ledger: a fresh lease could not be claimed");
      ferry::Ledger::release(segment, l.slot, l.gen, me);
    }
    const auto t2 = Clock::now();
    if (ledger->reclaim(false) != leases.size())
      throw std::runtime_error("ledger: reclaim did not free every released lease");
    const auto t3 = Clock::now();
    if (b < warmup) continue;
    auto per_send = [](Clock::time_point a, Clock::time_point z) {
      return std::chrono::duration<double, std::nano>(z - a).count() / kLedgerBatch;
    };
    send_ns.push_back(per_send(t0, t1));
    receive_ns.push_back(per_send(t1, t2));
    reclaim_ns.push_back(per_send(t2, t3));
    total_ns.push_back(per_send(t0, t3));
  }
  return {{"per_send_us", percentile(total_ns, 50) / 1e3},
          {"sender_ns", percentile(send_ns, 50)},
          {"receiver_ns", percentile(receive_ns, 50)},
          {"reclaim_ns", percentile(reclaim_ns, 50)},
          {"slots", kLeaseSlots},
          {"batch", kLedgerBatch},
          {"sends", cfg.ledger_batches * kLedgerBatch}};
}

// ---- the limits (docs/benchmarks.md, "Every row against its limit") --------------------------

// A lease's state changes alone: one uncontended compare-and-swap on a word of shared memory per
// change (in flight, held, released, free), one thread, per send. CPU microseconds, median of
// batches.
double lease_changes_alone_us(int sends) {
  void* page = ::mmap(nullptr, sizeof(std::atomic<std::uint64_t>), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) throw std::runtime_error("mmap");
  auto* word = new (page) std::atomic<std::uint64_t>(0);
  std::uint64_t state = 0;
  auto send = [&] {
    for (int change = 0; change < 4; ++change, ++state) {
      std::uint64_t expected = state;
      if (!word->compare_exchange_strong(expected, state + 1, std::memory_order_acq_rel))
        throw std::runtime_error("lease changes: a compare-and-swap failed alone");
    }
  };
  const int batch = std::max(1, sends / 10);
  std::vector<double> us;
  for (int b = 0; b < 11; ++b) {
    const double t0 = ferry::bench::cpu_seconds();
    for (int i = 0; i < batch; ++i) send();
    // The first batch warms up.
    if (b > 0) us.push_back((ferry::bench::cpu_seconds() - t0) * 1e6 / batch);
  }
  ::munmap(page, sizeof(std::atomic<std::uint64_t>));
  return percentile(us, 50);
}

// What the rows are held to, measured before them: the wake-up floor between two processes (this
// one has not touched CUDA, so it may fork) and the ledger's state changes alone.
json measure_limits(const Config& cfg) {
  const auto floor = ferry::bench::wake_floor(cfg.round_trips, cfg.round_trips < 2000 ? 0.5 : 3);
  json j = ferry::bench::wake_floor_json(floor);
  j["wake_floor_us"] = floor.us();
  j["lease_changes_alone_us"] = lease_changes_alone_us(cfg.ledger_batches * kLedgerBatch);
  return j;
}

std::string cuda_version(int v) {
  return v <= 0 ? "none" : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// The kernel module's version, as nvidia-smi prints it ("580.65.06"); the CUDA API level alone
// does not tell two drivers apart. /sys/module/nvidia/version holds just that; /proc's line names
// the module first, and the open module's ("... Open Kernel Module for x86_64  580.65.06 ...")
// has digits before the version.
std::string nvidia_driver() {
  std::string v;
  std::ifstream("/sys/module/nvidia/version") >> v;
  if (std::regex_match(v, std::regex(R"([0-9]+\.[0-9]+(\.[0-9]+)?)"))) return v;
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  std::getline(f, line);
  std::smatch m;
  if (std::regex_search(line, m,
                        std::regex(R"(Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9]+(\.[0-9]+)?))")))
    return m[1];
  return "";
}

// cuda:0 and the driver as ferry's own probe sees them, asked in a child (the probe creates a
// context, after which this process could not fork receivers that use CUDA).
json gpu_info() {
  json g = in_child("the GPU probe", [] {
    const ferry::cuda::CudaStatus s = ferry::cuda::probe();
    json j = {{"driver_cuda", cuda_version(s.driver_version)},
              {"ferry_cuda_runtime", cuda_version(s.runtime_version)},
              {"devices", s.devices.size()}};
    if (!s.devices.empty()) {
      const auto& d = s.devices[0];
      j["name"] = d.name;
      j["uuid"] = d.uuid;
      j["compute_capability"] = std::to_string(d.major) + "." + std::to_string(d.minor);
      j["memory_GiB"] = static_cast<double>(d.total_memory) / (1 << 30);
    }
    return j;
  });
  g["driver"] = nvidia_driver();
  return g;
}

std::string default_peer() {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string path(exe, static_cast<std::size_t>(n));
    path = path.substr(0, path.rfind('/') + 1) + "cuda_peer.py";
    if (::access(path.c_str(), R_OK) == 0) return path;
  }
  return FERRY_CUDA_PEER_SOURCE;
}

// {"status": "ok", ...the peer's output} or {"status": "skipped"|"failed", "reason": ...}.
json python_peer(const Config& cfg) {
  if (!cfg.torch) return {{"status", "skipped"}, {"reason", "--no-torch"}};
  if (cfg.python.find('/') != std::string::npos && ::access(cfg.python.c_str(), X_OK) != 0)
    return {{"status", "skipped"}, {"reason", cfg.python + " not found"}};
  if (::access(cfg.peer.c_str(), R_OK) != 0)
    return {{"status", "skipped"}, {"reason", cfg.peer + " not found"}};
  const std::string cmd = shell_quote(cfg.python) + " " + shell_quote(cfg.peer) +
                          " --round-trips " + std::to_string(cfg.round_trips) + " --opens " +
                          std::to_string(cfg.opens) + " --copies " + std::to_string(cfg.copies) +
                          " --copy-bytes " + std::to_string(cfg.copy_bytes) + " --device " +
                          cfg.device;
  std::fflush(nullptr);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {{"status", "failed"}, {"reason", "cannot run " + cmd}};
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 127) return {{"status", "skipped"}, {"reason", cfg.python + " not found"}};
  json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return {{"status", "failed"},
            {"reason", "the peer exited with " + std::to_string(code) +
                           " and printed no JSON; "
                           "command: " +
                           cmd}};
  }
  if (j.contains("skipped")) return {{"status", "skipped"}, {"reason", j["skipped"]}};
  json r = {{"status", code == 0 ? "ok" : "failed"}};
  if (code != 0)
    r["reason"] = "a measurement failed in the peer (exit " + std::to_string(code) + ")";
  r.update(j);
  return r;
}

std::optional<double> get(const json& j, const char* measure, const char* key) {
  if (!j.contains(measure) || !j[measure].contains(key) || !j[measure][key].is_number())
    return std::nullopt;
  return j[measure][key].get<double>();
}

struct Row {
  std::string name;
  std::optional<double> ferry, torch;
  bool lower_is_better;         // times; rates are higher-is-better
  std::string goal;             // "" when the issue sets none
  std::optional<bool> pass;     // the goal's verdict on ferry's figure; unset without a goal
  bool torch_has_none = false;  // torch has no such figure (not: torch's was not measured)
  json limit = nullptr;         // what bounds ferry's figure, and the share of it reached
};

std::string result(const Row& r) {
  if (r.goal.empty()) return "-";
  if (!r.ferry) return "failed";
  return *r.pass ? "PASS" : "MISS";
}

std::string cell(const std::optional<double>& v) {
  return v ? num(*v) : "-";
}

// Ratio: how many times better ferry's figure is than torch's (above 1: ferry is better).
std::optional<double> advantage(const Row& r) {
  if (!r.ferry || !r.torch || *r.ferry <= 0 || *r.torch <= 0) return std::nullopt;
  return r.lower_is_better ? *r.torch / *r.ferry : *r.ferry / *r.torch;
}

// The rows of a run; with `cpu` (--device cpu) only the hand-off's and the ledger's, whose goal
// is the CUDA path's.
std::vector<Row> table(const json& f, const json& t, std::int64_t copy_bytes, bool cpu) {
  std::vector<Row> rows;
  auto goal_row = [&](std::string name, std::optional<double> fv, std::optional<double> tv,
                      bool lower, std::string goal, std::optional<bool> pass) {
    rows.push_back({std::move(name), fv, tv, lower, std::move(goal), pass, false, nullptr});
  };
  // The last row's limit, in its unit: `value` where this run measured it, else null and why.
  auto limit = [&](std::string name, std::string unit, std::optional<double> value,
                   std::string why = "not measured in this run") {
    ferry::bench::Limit l =
        ferry::bench::make_limit(!rows.back().lower_is_better, "", std::move(name), std::move(unit),
                                 value, rows.back().ferry);
    if (!value) l.why = std::move(why);
    rows.back().limit = ferry::bench::limit_json(l);
  };
  const std::string& floor = ferry::bench::kWakeFloorName;
  const auto floor_us = get(f, "limits", "wake_floor_us");
  const std::string lease_changes =
      "the lease's four state changes alone: an uncontended compare-and-swap each, one thread";
  if (cpu) {
    goal_row("hand-off round trip, 1 MiB CPU tensor, p50 (us)", get(f, "handoff", "p50_us"),
             get(t, "handoff", "p50_us"), true, "", std::nullopt);
    limit(floor, "us", floor_us);
    goal_row("hand-off round trip, 1 MiB CPU tensor, p99 (us)", get(f, "handoff", "p99_us"),
             get(t, "handoff", "p99_us"), true, "", std::nullopt);
    limit(floor, "us", floor_us);
    goal_row("ledger cost per send (us)", get(f, "ledger", "per_send_us"), std::nullopt, true, "",
             std::nullopt);
    rows.back().torch_has_none = true;
    limit(lease_changes, "us", get(f, "limits", "lease_changes_alone_us"));
    return rows;
  }
  const auto handoff = get(f, "handoff", "p50_us");
  goal_row("cached hand-off round trip, 1 MiB, p50 (us)", handoff, get(t, "handoff", "p50_us"),
           true, "ferry <= " + fmt("%g", kHandoffGoalUs) + " us",
           handoff && *handoff <= kHandoffGoalUs);
  limit(floor, "us", floor_us);
  goal_row("cached hand-off round trip, 1 MiB, p99 (us)", get(f, "handoff", "p99_us"),
           get(t, "handoff", "p99_us"), true, "", std::nullopt);
  limit(floor, "us", floor_us);
  goal_row("first receive from a new block, p50 (us)", get(f, "first_open", "open_recv_us"),
           get(t, "first_open", "open_recv_us"), true, "", std::nullopt);
  limit("the driver's cudaIpcOpenMemHandle of the block, after a wake-up", "us", std::nullopt,
        "this run does not time the driver's open alone (ferry-cuda-sync-bench's cell F does)");
  // The receiver's recv waits out its own answer and the next send: a round trip of wake-ups.
  goal_row("receive from an open block, p50 (us)", get(f, "first_open", "cached_recv_us"),
           get(t, "first_open", "cached_recv_us"), true, "", std::nullopt);
  limit(floor, "us", floor_us);
  const std::string size = fmt("%g", static_cast<double>(copy_bytes) / (1 << 20)) + " MiB";
  const auto device_copy = get(f, "copy", "device_memcpy_GBps");
  const std::string device_copy_name = "a device-to-device copy of the same bytes on cuda:0";
  goal_row("copy-on-send, " + size + " (GB/s)", get(f, "copy", "copy_on_send_GBps"),
           get(t, "copy", "copy_on_send_GBps"), false, "", std::nullopt);
  limit(device_copy_name, "GB/s", device_copy);
  goal_row("device-to-device copy, " + size + " (GB/s)", device_copy,
           get(t, "copy", "device_memcpy_GBps"), false, "", std::nullopt);
  limit("the device's memory bandwidth", "GB/s", std::nullopt,
        "this row is the copy rows' limit; the device's own bandwidth is not read here");
  // What a receiver pays to copy what it received by handle, instead of using it in place.
  goal_row("peer copy by the receiver, " + size + " (GB/s)", get(f, "copy", "peer_copy_GBps"),
           std::nullopt, false, "", std::nullopt);
  rows.back().torch_has_none = true;
  limit(device_copy_name, "GB/s", device_copy);
  const auto ratio = get(f, "copy", "ratio");
  goal_row("copy-on-send / device-to-device copy", ratio, get(t, "copy", "ratio"), false,
           "ferry >= " + fmt("%.2f", kCopyGoalRatio), ratio && *ratio >= kCopyGoalRatio);
  limit(device_copy_name + " (a ratio of 1)", "x", 1.0);
  rows.back().limit["source"] = "by definition: the ratio is to that copy";
  // torch.multiprocessing counts its references inside put() and get(): no separate figure.
  goal_row("ledger cost per send (us)", get(f, "ledger", "per_send_us"), std::nullopt, true, "",
           std::nullopt);
  rows.back().torch_has_none = true;
  limit(lease_changes, "us", get(f, "limits", "lease_changes_alone_us"));
  return rows;
}

std::string pad(const std::string& s, std::size_t w) {
  return s.size() >= w ? s + "  " : s + std::string(w - s.size(), ' ');
}

// Beside each row, its limit and the share of it ferry's figure reached; then what each limit is.
void print_table(const std::vector<Row>& rows) {
  std::printf("\n%s%s%s%s%s%s%s%s\n", pad("measurement", 46).c_str(), pad("ferry", 10).c_str(),
              pad("torch.mp", 10).c_str(), pad("ratio", 9).c_str(), pad("goal", 16).c_str(),
              pad("result", 8).c_str(), pad("limit", 12).c_str(), "share");
  json limits = json::array();
  for (const Row& r : rows) {
    const auto a = advantage(r);
    std::printf("%s%s%s%s%s%s%s%s\n", pad(r.name, 46).c_str(), pad(cell(r.ferry), 10).c_str(),
                pad(r.torch_has_none ? "n/a" : cell(r.torch), 10).c_str(),
                pad(a ? num(*a) + "x" : "-", 9).c_str(),
                pad(r.goal.empty() ? "-" : r.goal, 16).c_str(), pad(result(r), 8).c_str(),
                pad(ferry::bench::limit_cell(r.limit), 12).c_str(),
                ferry::bench::share_cell(r.limit).c_str());
    limits.push_back({{"limit", r.limit}});
  }
  std::printf("limits:\n");
  for (const std::string& name : ferry::bench::limit_names(limits)) {
    std::printf("  %s\n", name.c_str());
  }
}

json rows_json(const std::vector<Row>& rows) {
  json out = json::array();
  for (const Row& r : rows) {
    const auto a = advantage(r);
    out.push_back({{"measurement", r.name},
                   {"ferry", r.ferry ? json(*r.ferry) : json(nullptr)},
                   {"torch_multiprocessing", r.torch ? json(*r.torch) : json(nullptr)},
                   {"ratio", a ? json(*a) : json(nullptr)},
                   {"goal", r.goal.empty() ? json(nullptr) : json(r.goal)},
                   {"result", r.goal.empty() ? json(nullptr) : json(result(r))},
                   {"limit", r.limit}});
  }
  return out;
}

// --breakdown: where each side of one round trip spends its time, biggest first. A step's time
// includes the steps inside it (a CUDA call inside "send: encode a CUDA tensor", the wait inside
// "recv: pop"); the caller's rows are the hand-off's path, the closer's and reaper's run beside it.
void print_steps(const json& b) {
  std::printf(
      "\nwhere the time goes (--breakdown): calls and mean microseconds per round trip (p50 %s us "
      "with the tally on)\n",
      num(b.value("p50_us", 0.0)).c_str());
  const std::pair<const char*, const char*> sides[] = {
      {"first", "the side that sends first, then takes the reply"},
      {"echo", "the side that takes the tensor, then sends its own"}};
  for (const auto& [key, what] : sides) {
    std::printf("\n%s:\n%s%s%s%s\n", what, pad("step", 52).c_str(), pad("thread", 9).c_str(),
                pad("calls", 8).c_str(), "mean us");
    const json& rows = b["steps"][key];
    if (!rows.is_array() || rows.empty()) {
      std::printf("  (none recorded)\n");
      continue;
    }
    for (const json& r : rows) {
      std::printf("%s%s%s%s\n", pad(r.value("step", "?"), 52).c_str(),
                  pad(r.value("thread", "?"), 9).c_str(),
                  pad(num(r.value("calls", 0.0)), 8).c_str(), num(r.value("us", 0.0)).c_str());
    }
  }
}

// Prints a run's header, table and failures, and adds the table to `doc`; true when a measure
// failed. Also re-prints a saved run (--report), so it reads nothing but the document.
bool report(json& doc) {
  const json& f = doc["ferry"];
  const json& t = doc["torch_multiprocessing"];
  const json& g = doc["machine"]["gpu"];
  bool failed = false;
  for (const auto& [name, m] : f.items())
    if (m.value("status", "") == "failed") failed = true;
  if (t.value("status", "") == "failed") failed = true;

  const bool cpu = doc.value("device", "cuda") == "cpu";
  if (cpu) {
    std::printf(
        "ferry-cuda-bench --device cpu: CPU tensors in shared memory (the hand-off without "
        "CUDA); LibTorch %s\n",
        doc["machine"].value("libtorch", "?").c_str());
  } else {
    std::printf(
        "ferry-cuda-bench on %s (cuda:0, %s), driver %s (CUDA %s); ferry: CUDA runtime %s, "
        "LibTorch %s\n",
        g.value("name", "an unknown GPU").c_str(), g.value("uuid", "?").c_str(),
        g.value("driver", "?").c_str(), g.value("driver_cuda", "?").c_str(),
        g.value("ferry_cuda_runtime", "?").c_str(), doc["machine"].value("libtorch", "?").c_str());
  }
  if (t.value("status", "") == "skipped") {
    std::printf("torch.multiprocessing: skipped: %s\n", t.value("reason", "?").c_str());
  } else {
    auto text = [&](const char* key) {
      if (!t.contains(key)) return std::string("?");
      return t[key].is_string() ? t[key].get<std::string>() : std::string("none");
    };
    std::printf("torch.multiprocessing: PyTorch %s (CUDA %s), Python %s (%s), spawn\n",
                text("torch").c_str(), text("torch_cuda").c_str(), text("python").c_str(),
                text("executable").c_str());
    if (t.value("status", "") == "failed")
      std::printf("torch.multiprocessing: failed: %s\n", t.value("reason", "?").c_str());
  }
  std::printf("p50 is the median; ratio: how many times better ferry's figure is\n");
  const json& c = doc["config"];
  const std::vector<Row> rows = table(f, t, c.value("copy_bytes", std::int64_t{0}), cpu);
  print_table(rows);
  doc["rows"] = rows_json(rows);
  if (f.contains("breakdown") && f["breakdown"].contains("steps")) print_steps(f["breakdown"]);
  if (const auto d = get(t, "handoff_dropped", "p50_us"))
    std::printf(
        "\ntorch.multiprocessing hand-off with each received tensor dropped at once, as "
        "ferry's receivers do: p50 %s us\n",
        num(*d).c_str());
  if (const auto l = get(f, "ledger", "per_send_us"))
    std::printf("ferry's ledger per send: sender %s ns, receiver %s ns, reclaim %s ns\n",
                num(f["ledger"].value("sender_ns", 0.0)).c_str(),
                num(f["ledger"].value("receiver_ns", 0.0)).c_str(),
                num(f["ledger"].value("reclaim_ns", 0.0)).c_str());
  const int opens = c.value("opens", 0);
  if (const auto n = get(f, "first_open", "opens_seen"); n && *n < opens)
    std::printf("warning: ferry's first-open receiver opened %d allocations for %d pairs\n",
                static_cast<int>(*n), opens);
  for (const auto& [name, m] : f.items())
    if (m.value("status", "") == "failed")
      std::printf("ferry %s: failed: %s\n", name.c_str(), m.value("reason", "?").c_str());
  for (const auto& [name, m] : t.items())
    if (m.is_object() && m.value("status", "") == "failed")
      std::printf("torch.multiprocessing %s: failed: %s\n", name.c_str(),
                  m.value("reason", "?").c_str());
  return failed;
}

std::string libtorch_version() {
#ifdef TORCH_VERSION
  return TORCH_VERSION;
#else
  return "unknown";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cfg.peer = default_peer();
  bool quick = false;
  CLI::App app{"ferry-cuda-bench: CUDA tensors between processes, beside torch.multiprocessing"};
  app.add_flag("--quick", quick, "few iterations: checks that everything runs");
  app.add_option("--python", cfg.python,
                 "Python with a CUDA PyTorch, for the torch.multiprocessing column (default: the "
                 "one found when the build was configured, " FERRY_CUDA_PYTHON ")");
  app.add_option("--cuda-peer", cfg.peer,
                 "cuda_peer.py to run (default: the copy next to this binary)");
  bool no_torch = false;
  app.add_flag("--no-torch", no_torch, "leave out the torch.multiprocessing column");
  app.add_option("--json", cfg.json_path, "also write the results to this file");
  app.add_flag("--breakdown", cfg.breakdown,
               "run the hand-off once more with ferry's step tally on, and print where each "
               "side's time goes");
  app.add_option("--device", cfg.device,
                 "cuda (default) or cpu: the hand-off alone, with a CPU tensor in shared memory")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  std::string saved;
  app.add_option("--report", saved,
                 "print the table of a run saved with --json, and measure nothing");
  CLI11_PARSE(app, argc, argv);
  if (!saved.empty()) {
    json doc = json::parse(std::ifstream(saved), nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
      std::fprintf(stderr, "ferry-cuda-bench: %s holds no saved run\n", saved.c_str());
      return 2;
    }
    if (doc.value("status", "") == "skipped") {
      std::printf("ferry-cuda-bench: skipped: %s\n", doc.value("reason", "?").c_str());
      return 0;
    }
    return report(doc) ? 1 : 0;
  }
  cfg.torch = !no_torch;
  if (quick) {
    cfg.round_trips = 50;
    cfg.opens = 5;
    cfg.copies = 3;
    cfg.copy_bytes = 16 << 20;
    cfg.ledger_batches = 200;
  }

  json doc;
  doc["tool"] = "ferry-cuda-bench";
  doc["machine"] = {{"libtorch", libtorch_version()}};
  doc["device"] = cfg.device;
  doc["config"] = {{"round_trips", cfg.round_trips},
                   {"opens", cfg.opens},
                   {"copies", cfg.copies},
                   {"copy_bytes", cfg.copy_bytes},
                   {"ledger_sends", cfg.ledger_batches * kLedgerBatch},
                   {"quick", quick}};
  bool failed = false;
  auto measure_handoff = [&] {
    doc["ferry"]["handoff"] = in_child("handoff", [&] { return handoff(cfg); });
    if (cfg.breakdown)
      doc["ferry"]["breakdown"] = in_child("breakdown", [&] { return handoff(cfg, true); });
  };
  if (cfg.device == "cpu") {
    doc["status"] = "ok";
    doc["ferry"]["limits"] = measure_limits(cfg);
    measure_handoff();
    doc["ferry"]["ledger"] = in_child("ledger", [&] { return ledger_cost(cfg); });
    doc["torch_multiprocessing"] = python_peer(cfg);
    failed = report(doc);
  } else if (const std::string why = ferry::test::gpu_unavailable(); !why.empty()) {
    std::printf("ferry-cuda-bench: skipped: %s\n", why.c_str());
    doc["status"] = "skipped";
    doc["reason"] = why;
    // The ledger is shared memory: its row means something on any machine.
    doc["ferry"]["ledger"] = in_child("ledger", [&] { return ledger_cost(cfg); });
    const auto us = get(doc["ferry"], "ledger", "per_send_us");
    if (us) {
      std::printf(
          "  ledger cost per send (no GPU needed): %s us (sender %s ns, receiver %s ns, "
          "reclaim %s ns)\n",
          num(*us).c_str(), num(doc["ferry"]["ledger"].value("sender_ns", 0.0)).c_str(),
          num(doc["ferry"]["ledger"].value("receiver_ns", 0.0)).c_str(),
          num(doc["ferry"]["ledger"].value("reclaim_ns", 0.0)).c_str());
    } else {
      failed = true;
      std::printf("  ledger cost per send: failed\n");
    }
  } else {
    doc["status"] = "ok";
    doc["machine"]["gpu"] = gpu_info();
    doc["ferry"]["limits"] = measure_limits(cfg);
    // Each measurement runs in a process of its own, forked from this one, which never touches
    // CUDA: so each can fork its receiver before its own first CUDA call.
    measure_handoff();
    doc["ferry"]["first_open"] = in_child("first_open", [&] { return first_open(cfg); });
    doc["ferry"]["copy"] = in_child("copy", [&] { return copy_bandwidth(cfg); });
    doc["ferry"]["ledger"] = in_child("ledger", [&] { return ledger_cost(cfg); });
    doc["torch_multiprocessing"] = python_peer(cfg);
    failed = report(doc) || failed;
  }
  if (!cfg.json_path.empty()) std::ofstream(cfg.json_path) << doc.dump(2) << "\n";
  return failed ? 1 : 0;
}
