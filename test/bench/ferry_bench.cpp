// ferry-bench: ferry's transports measured side by side with their limits (a 1-byte pipe round
// trip, single-core memcpy) and with torch.multiprocessing.Queue (torch_peer.py), in one run.
// docs/benchmarks.md explains the method and the columns; `make bench` runs it.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ipc/receipt_policy.hpp"
#include "ipc/stats.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/tensor_queue.hpp"
#include "test/bench/bench_limits.hpp"
#include "test/bench/bench_report.hpp"
#include "test/bench/bench_support.hpp"
#include "test/bench/bench_tensors.hpp"

namespace {

using namespace ferry::bench;
using ferry::Tensors;
using SteadyClock = std::chrono::steady_clock;

constexpr std::uint32_t kCapacity = 8;  // queue depth for every transport, torch's included
// Generous: a wait this long means a peer is stuck, and the run should fail rather than hang.
constexpr std::chrono::milliseconds kTimeout{60'000};
// Stamps are float32 values, exact up to 2^24.
constexpr std::uint32_t kStampModulo = 1u << 24;

// A sink the optimizer cannot see through, so the consumer's reads are really done.
volatile float g_sink = 0;

struct Config {
  std::vector<std::size_t> sizes;
  int iterations = 2000;
  bool quick = false;
  double time_cap_s = 3.0;
  TorchPeer torch;
  std::string json_path;
};

struct Plan {
  int round_trips;
  int messages;
};

// Fewer repetitions as messages grow, so 64 MiB costs about as much wall time as 4 KiB.
// torch_peer.py's plan() is the same formula, for when it runs on its own.
Plan plan(std::size_t size, int iterations, bool quick) {
  const std::size_t byte_cap = (quick ? 128 : 2048) * kMiB;
  const auto n = static_cast<std::size_t>(iterations);
  const auto round_trips = std::max({n / 40, std::min(n, n * kMiB / size), std::size_t{5}});
  const auto messages = std::max({n / 40, std::min(5 * n, byte_cap / size), std::size_t{5}});
  return {static_cast<int>(round_trips), static_cast<int>(messages)};
}

struct Latency {
  double p50 = 0, p99 = 0;
  std::size_t n = 0;
  // CPU time both processes spent per round trip, warm-up included: what a spin costs shows here.
  double cpu_us = -1;
};

struct Throughput {
  double messages_per_s = 0, gb_per_s = 0;
  std::size_t n = 0;
};

Latency summarize(std::vector<double> samples_us) {
  std::sort(samples_us.begin(), samples_us.end());
  return {percentile(samples_us, 50), percentile(samples_us, 99), samples_us.size()};
}

double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// CPU time of this process, all threads, in seconds.
double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// ---------------------------------------------------------------------------------------------
// What producers write and consumers read.

// Round trips carry a stamp at both ends of the tensor, checked on arrival: the answer is the
// data of this iteration, not a stale view.
void stamp(const at::Tensor& t, std::uint32_t i) {
  const float v = static_cast<float>(i % kStampModulo);
  floats(t)[0] = v;
  floats(t)[t.numel() - 1] = v;
}

void check_stamp(const Tensors& msg, std::uint32_t i, std::int64_t numel) {
  if (msg.size() != 1 || msg[0].numel() != numel) {
    throw std::runtime_error("round trip: unexpected message shape");
  }
  const float v = static_cast<float>(i % kStampModulo);
  const float* f = floats(msg[0]);
  if (f[0] != v || f[numel - 1] != v) {
    throw std::runtime_error("round trip: stale data (stamp " + std::to_string(f[0]) +
                             ", expected " + std::to_string(v) + ")");
  }
}

enum class Mode { zero_copy, copy };
const char* mode_name(Mode m) {
  return m == Mode::zero_copy ? "ferry_zero_copy" : "ferry_copy";
}

// Filled, so every page is real before the clock starts and copies move real data.
at::Tensor make_tensor(Mode mode, std::int64_t numel, float value) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  at::Tensor t =
      mode == Mode::zero_copy ? ferry::empty_shared({numel}, options) : at::empty({numel}, options);
  std::fill_n(floats(t), numel, value);
  return t;
}

// Ends a loop whose length the parent decides (count reached or time cap passed). Made the same
// way as the messages, so it does not add a copy to a zero-copy run's counters.
bool is_stop(const Tensors& msg) {
  return msg.size() == 1 && msg[0].numel() == 1;
}

// ---------------------------------------------------------------------------------------------
// The measurements.

struct TimedLoop {
  int warmup, iterations;
  double time_cap_s;
  SteadyClock::time_point deadline{};
  int measured = 0;

  // False once the loop is done; starts the time cap when the warm-up ends. At least 5 samples.
  bool next(int i) {
    if (i == warmup) {
      deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                          std::chrono::duration<double>(time_cap_s));
    }
    if (i >= warmup + iterations) return false;
    if (i > warmup && measured >= 5 && SteadyClock::now() > deadline) return false;
    return true;
  }
};

struct RoundTrips {
  std::vector<double> samples;  // microseconds, warm-up excluded
  int total = 0;                // round trips made, warm-up included
  double cpu_s = 0;             // this process's CPU time over all of them
};

// Stamps `own`, sends it on `out`, takes the answer from `in` and checks its stamp, until the loop
// is done. `in` and `out` are one queue when measuring within a process.
RoundTrips time_round_trips(const at::Tensor& own, ferry::TensorQueue& out, ferry::TensorQueue& in,
                            std::int64_t numel, int iterations, double time_cap_s) {
  TimedLoop loop{std::max(5, iterations / 10), iterations, time_cap_s};
  RoundTrips r;
  std::vector<double>& samples = r.samples;
  const double cpu0 = process_cpu_s();
  int i = 0;
  for (; loop.next(i); ++i) {
    const auto n = static_cast<std::uint32_t>(i);
    stamp(own, n);
    const auto t0 = SteadyClock::now();
    out.send({own}, kTimeout);
    Tensors back = in.recv(kTimeout);
    check_stamp(back, n, numel);
    const auto t1 = SteadyClock::now();
    if (i >= loop.warmup) {
      samples.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      ++loop.measured;
    }
  }
  r.total = i;
  r.cpu_s = process_cpu_s() - cpu0;
  return r;
}

// The peer's side of a CPU figure: its CPU time over `messages` answers, sent up the link.
void report_cpu(Link& link, double cpu0, std::uint64_t messages) {
  link.send<double>(process_cpu_s() - cpu0);
  link.send<std::uint64_t>(messages);
}

// Both processes' CPU per round trip, in microseconds: this one's over `own_trips`, the peer's as
// report_cpu sent it.
double cpu_per_trip_us(Link& link, double own_cpu_s, int own_trips) {
  const double peer_cpu_s = link.recv<double>();
  const auto peer_messages = static_cast<double>(link.recv<std::uint64_t>());
  return 1e6 * (own_cpu_s / std::max(own_trips, 1) + peer_cpu_s / std::max(peer_messages, 1.0));
}

Latency pipe_round_trip(int iterations, double time_cap_s) {
  Link link;
  Child child(
      [&] {
        link.child_side();
        const double cpu0 = process_cpu_s();
        std::uint64_t n = 0;
        for (char c; (c = link.recv<char>()) != 'q'; ++n) link.send(c);
        report_cpu(link, cpu0, n);
      },
      "ferry-bench child");
  link.parent_side();
  TimedLoop loop{std::max(5, iterations / 10), iterations, time_cap_s};
  std::vector<double> samples;
  const double cpu0 = process_cpu_s();
  int i = 0;
  for (; loop.next(i); ++i) {
    const auto t0 = SteadyClock::now();
    link.send('p');
    if (link.recv<char>() != 'p') throw std::runtime_error("pipe round trip: wrong byte");
    const auto t1 = SteadyClock::now();
    if (i >= loop.warmup) {
      samples.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      ++loop.measured;
    }
  }
  const double cpu = process_cpu_s() - cpu0;
  link.send('q');
  Latency l = summarize(std::move(samples));
  l.cpu_us = cpu_per_trip_us(link, cpu, i);
  child.wait();
  return l;
}

// The parent sends a stamped tensor, the child checks it and answers with its own tensor of the
// same size (a received tensor sent back would be copied: ferry forwards by copying).
Latency ferry_round_trip(Mode mode, std::size_t bytes, int iterations, double time_cap_s) {
  const auto numel = static_cast<std::int64_t>(bytes / sizeof(float));
  auto down = ferry::TensorQueue::create({kCapacity});
  auto up = ferry::TensorQueue::create({kCapacity});
  Link link;
  Child child(
      [&] {
        link.child_side();
        const at::Tensor own = make_tensor(mode, numel, 0);
        const double cpu0 = process_cpu_s();
        std::uint32_t i = 0;
        for (;; ++i) {
          Tensors msg = down.recv(kTimeout);
          if (is_stop(msg)) break;
          check_stamp(msg, i, numel);
          msg.clear();  // done with it: its lease goes back before the answer, as in a real
                        // consumer
          stamp(own, i);
          up.send({own}, kTimeout);
        }
        report_cpu(link, cpu0, i);
      },
      "ferry-bench child");
  link.parent_side();
  const at::Tensor own = make_tensor(mode, numel, 1);
  RoundTrips r = time_round_trips(own, down, up, numel, iterations, time_cap_s);
  down.send({make_tensor(mode, 1, 0)}, kTimeout);
  Latency l = summarize(std::move(r.samples));
  l.cpu_us = cpu_per_trip_us(link, r.cpu_s, r.total);
  child.wait();
  return l;
}

// The parent sends as fast as the queue takes messages; the child reads every page of each, or,
// with `read_pages` false, drops each unread (a diagnostic: what the sending side alone can
// do). The clock runs from the first timed send until the child reports it has the last message.
Throughput ferry_throughput(Mode mode, std::size_t bytes, int messages, double time_cap_s,
                            bool read_pages = true) {
  const auto numel = static_cast<std::int64_t>(bytes / sizeof(float));
  const int warmup = static_cast<int>(kCapacity) + 2;
  auto q = ferry::TensorQueue::create({kCapacity});
  Link link;
  Child child(
      [&] {
        link.child_side();
        float sum = 0;
        for (int i = 0; i < warmup; ++i) sum += touch_pages(q.recv(kTimeout).at(0));
        link.send('w');
        std::uint64_t count = 0;
        for (;;) {
          Tensors msg = q.recv(kTimeout);
          if (is_stop(msg)) break;
          if (read_pages) sum += touch_pages(msg.at(0));
          ++count;
        }
        g_sink = sum;
        link.send<std::uint64_t>(count);
      },
      "ferry-bench child");
  link.parent_side();

  // Zero-copy: a pool of shared tensors, more than can be in flight (the queue's capacity plus
  // the one the consumer holds), reused as a producer recycling its buffers would. Copy: one
  // ordinary tensor, copied into shared memory by every send.
  std::vector<at::Tensor> pool;
  const std::size_t pool_size = mode == Mode::zero_copy ? kCapacity + 2 : 1;
  for (std::size_t k = 0; k < pool_size; ++k) {
    pool.push_back(make_tensor(mode, numel, static_cast<float>(k)));
  }
  for (int i = 0; i < warmup; ++i) q.send({pool[i % pool.size()]}, kTimeout);
  if (link.recv<char>() != 'w') throw std::runtime_error("throughput: bad warm-up signal");

  const auto t0 = SteadyClock::now();
  std::uint64_t sent = 0;
  for (int i = 0; i < messages; ++i) {
    if (sent >= 5 && seconds_since(t0) > time_cap_s) break;
    q.send({pool[i % pool.size()]}, kTimeout);
    ++sent;
  }
  q.send({make_tensor(mode, 1, 0)}, kTimeout);
  const auto received = link.recv<std::uint64_t>();
  const double elapsed = seconds_since(t0);
  child.wait();
  if (received != sent) {
    throw std::runtime_error("throughput: sent " + std::to_string(sent) + ", received " +
                             std::to_string(received));
  }
  const double n = static_cast<double>(sent);
  return {n / elapsed, n * static_cast<double>(bytes) / elapsed / 1e9, sent};
}

// Single core, same process, buffers warm: the copy ferry's copy-on-send path is held against.
// Median over batches of copies, each batch at least 64 MiB (16 MiB quick) of copying. With
// `destinations` > 1 the copies rotate through that many destination buffers, as copy-on-send
// rotates through the arena blocks of the messages in flight: a diagnostic for how much of the
// one-buffer figure comes from a destination that stays in cache.
Throughput memcpy_bandwidth(std::size_t bytes, bool quick, std::size_t destinations = 1) {
  const std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  using Buffer = std::unique_ptr<void, decltype(&std::free)>;
  auto alloc = [&](int fill) {
    Buffer b(std::aligned_alloc(kPage, rounded), &std::free);
    if (!b) throw std::runtime_error("memcpy: out of memory");
    std::memset(b.get(), fill, bytes);
    return b;
  };
  const Buffer src = alloc(1);
  std::vector<Buffer> dst;
  for (std::size_t d = 0; d < destinations; ++d) dst.push_back(alloc(0));
  const std::size_t reps = std::max<std::size_t>(1, (quick ? 16 : 64) * kMiB / bytes);
  const int batches = quick ? 5 : 11;
  std::size_t next = 0;
  auto batch = [&] {
    for (std::size_t r = 0; r < reps; ++r) {
      void* to = dst[next++ % dst.size()].get();
      std::memcpy(to, src.get(), bytes);
      // Makes each copy observable, so none is merged or dropped.
      asm volatile("" : : "r"(to) : "memory");
    }
  };
  batch();  // warm caches and TLBs
  std::vector<double> rates;
  for (int b = 0; b < batches; ++b) {
    const auto t0 = SteadyClock::now();
    batch();
    rates.push_back(static_cast<double>(reps) / seconds_since(t0));
  }
  std::sort(rates.begin(), rates.end());
  const double rate = rates[rates.size() / 2];
  return {rate, rate * static_cast<double>(bytes) / 1e9, reps * static_cast<std::size_t>(batches)};
}

// send() then recv() in one process: the transport's own CPU cost per message, with no process
// to wake. A round trip is about two of these plus two wake-ups, which is how docs/benchmarks.md
// splits a round trip into ferry's work and the scheduler's.
Latency ferry_in_process(Mode mode, std::size_t bytes, int iterations, double time_cap_s) {
  const auto numel = static_cast<std::int64_t>(bytes / sizeof(float));
  auto q = ferry::TensorQueue::create({kCapacity});
  const at::Tensor own = make_tensor(mode, numel, 1);
  return summarize(time_round_trips(own, q, q, numel, iterations, time_cap_s).samples);
}

// A stream's whole work for one message in one process, one thread, with no process to wake: the
// producer's send (a copy, copying), the consumer's receive and its read of every page, from a pool
// as the stream's own (zero-copy: more tensors than can be in flight, so the pages are as cold).
// A producer and a consumer can at best share that work out over two cores: its compute ceiling.
Throughput stream_alone(Mode mode, std::size_t bytes, int messages, double time_cap_s) {
  const auto numel = static_cast<std::int64_t>(bytes / sizeof(float));
  auto q = ferry::TensorQueue::create({kCapacity});
  std::vector<at::Tensor> pool;
  const std::size_t pool_size = mode == Mode::zero_copy ? kCapacity + 2 : 1;
  for (std::size_t k = 0; k < pool_size; ++k) {
    pool.push_back(make_tensor(mode, numel, static_cast<float>(k)));
  }
  float sum = 0;
  auto one = [&](int i) {
    q.send({pool[static_cast<std::size_t>(i) % pool.size()]}, kTimeout);
    sum += touch_pages(q.recv(kTimeout).at(0));
  };
  for (int i = 0; i < static_cast<int>(kCapacity) + 2; ++i) one(i);
  const auto t0 = SteadyClock::now();
  const double cpu0 = process_cpu_s();
  int n = 0;
  for (; n < messages; ++n) {
    if (n >= 5 && seconds_since(t0) > time_cap_s) break;
    one(n);
  }
  // CPU time: the work alone, whatever else the machine runs meanwhile.
  const double elapsed = process_cpu_s() - cpu0;
  g_sink = sum;
  return {n / elapsed, n * static_cast<double>(bytes) / elapsed / 1e9, static_cast<std::size_t>(n)};
}

// ---------------------------------------------------------------------------------------------
// The machine, sizes and formatting.

json to_json(const Latency& l) {
  json j = {{"p50", l.p50}, {"p99", l.p99}, {"n", l.n}};
  if (l.cpu_us >= 0) j["cpu_us_per_round_trip"] = l.cpu_us;
  return j;
}
json to_json(const Throughput& t) {
  return {{"messages_per_s", t.messages_per_s}, {"gb_per_s", t.gb_per_s}, {"n", t.n}};
}

json stats_delta(const ferry::TransportStats& a, const ferry::TransportStats& b) {
  json reasons = json::object();
  for (int r = 0; r < static_cast<int>(ferry::CopyReason::count_); ++r) {
    const auto d = b.copies_by_reason[r] - a.copies_by_reason[r];
    if (d) reasons[ferry::copy_reason_name(static_cast<ferry::CopyReason>(r))] = d;
  }
  return {{"messages_sent", b.messages_sent - a.messages_sent},
          {"tensors_zero_copy", b.tensors_zero_copy - a.tensors_zero_copy},
          {"tensors_copied", b.tensors_copied - a.tensors_copied},
          {"bytes_copied", b.bytes_copied - a.bytes_copied},
          {"segments_created", b.segments_created - a.segments_created},
          {"copies_by_reason", reasons}};
}

// Each of ferry's figures in a row against what bounds it (docs/benchmarks.md, "Every row against
// its limit"): a round trip against the wake-up floor, plus the two copies a copying one makes;
// the zero-copy stream against its own work done alone; copy-on-send against memcpy into rotating
// destinations, as each message's copy lands in another arena block.
std::vector<Limit> row_limits(const json& e) {
  auto rt = [&](const char* who, const char* pct) {
    return e[who]["round_trip_us"][pct].get<double>();
  };
  auto gb_per_s = [&](const json& figures) { return figures["gb_per_s"].get<double>(); };
  const double rotating = gb_per_s(e["memcpy_rotating"]);
  const double copies_us = 2 * e["size_bytes"].get<double>() / (rotating * 1e3);
  const std::string into = "into " + std::to_string(kCapacity + 1) + " rotating destinations";
  const std::string memcpy_name = "memcpy " + into + ", one core";
  const std::string copies_name =
      kWakeFloorName + ", plus a memcpy of the message each way (" + into + ", one core)";
  const double floor = std::min(rt("pipe_1byte", "p50"), rt("shared_word", "p50"));
  std::vector<Limit> out;
  for (Mode mode : {Mode::zero_copy, Mode::copy}) {
    for (const char* pct : {"p50", "p99"}) {
      const bool copying = mode == Mode::copy;
      out.push_back(time_limit(std::string(mode_name(mode)) + " round trip " + pct,
                               copying ? copies_name : kWakeFloorName, "us",
                               copying ? floor + copies_us : floor, rt(mode_name(mode), pct)));
    }
  }
  // A stream is bound by its work shared out over two processes, and copying, also by the one
  // core that copies: whichever is lower.
  const Ceiling stream =
      compute_ceiling("a message's send, receive and page reads", 2, "processes");
  for (Mode mode : {Mode::zero_copy, Mode::copy}) {
    const json& t = e[mode_name(mode)];
    const double ceiling = gb_per_s(t["throughput_alone"]) * stream.factor;
    const bool by_memcpy = mode == Mode::copy && rotating < ceiling;
    out.push_back(rate_limit(std::string(mode_name(mode)) + " throughput",
                             by_memcpy ? memcpy_name : stream.name, "GB/s",
                             by_memcpy ? rotating : ceiling, gb_per_s(t["throughput"])));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Copy on receipt: what a receiver pays to copy a small copied tensor into its own memory at once
// instead of keeping a view of the sender's block (FERRY_COPY_ON_RECEIPT_BELOW).

constexpr std::size_t kReceiptSizes[] = {256,       4 * kKiB,   16 * kKiB,  32 * kKiB,
                                         64 * kKiB, 128 * kKiB, 256 * kKiB, kMiB};

// One message of an ordinary tensor, sent and received in one process (copy-on-send, then a view
// or a copy on receipt as the setting says), per message in microseconds. `keep`: every message
// received is kept, as a caller collecting results does, so each copy lands in fresh memory and
// each view holds a lease and a block of the sender's arena; otherwise each is dropped at once.
std::vector<double> time_receipts(ferry::TensorQueue& q, std::size_t bytes, bool keep, int n) {
  const auto numel = static_cast<std::int64_t>(bytes / sizeof(float));
  const at::Tensor src = make_tensor(Mode::copy, numel, 1);
  const int warmup = std::max(5, n / 10);
  std::vector<Tensors> kept;
  kept.reserve(static_cast<std::size_t>(keep ? warmup + n : 0));
  std::vector<double> samples;
  for (int i = 0; i < warmup + n; ++i) {
    const auto t0 = SteadyClock::now();
    q.send({src}, kTimeout);
    Tensors m = q.recv(kTimeout);
    g_sink = floats(m[0])[numel - 1];
    if (keep) kept.push_back(std::move(m));
    m.clear();
    const auto t1 = SteadyClock::now();
    if (i >= warmup) samples.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return samples;
}

// Run in a child process that exec'd this binary with FERRY_COPY_ON_RECEIPT_BELOW set, since a
// process reads the setting once: prints the timings of every size, dropped and kept, as JSON.
int receipt_probe(bool quick) {
  at::set_num_threads(1);
  auto q = ferry::TensorQueue::create({kCapacity});
  const int iterations = quick ? 200 : 2000;
  const std::size_t keep_cap = (quick ? 16 : 64) * kMiB;  // bytes kept per size at most
  json out = json::array();
  for (std::size_t bytes : kReceiptSizes) {
    const int kept_n = static_cast<int>(
        std::max<std::size_t>(20, std::min<std::size_t>(iterations, keep_cap / bytes)));
    const auto before = ferry::transport_stats();
    const Latency dropped = summarize(time_receipts(q, bytes, false, iterations));
    const Latency kept = summarize(time_receipts(q, bytes, true, kept_n));
    const auto after = ferry::transport_stats();
    out.push_back(
        {{"size_bytes", bytes},
         {"dropped_us", to_json(dropped)},
         {"kept_us", to_json(kept)},
         {"copied_on_receipt", after.tensors_copied_on_receipt - before.tensors_copied_on_receipt},
         {"received", after.tensors_received - before.tensors_received}});
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// The probe twice: every copied tensor a view (0), then every one copied on receipt (1 GiB).
json measure_receipt(const Config& cfg) {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return {{"status", "failed"}, {"reason", "cannot find this executable"}};
  json result = {{"status", "ok"}};
  for (const char* below : {"0", "1G"}) {
    const std::string cmd = std::string("FERRY_COPY_ON_RECEIPT_BELOW=") + below + " '" +
                            std::string(exe, static_cast<std::size_t>(n)) + "' --receipt-probe" +
                            (cfg.quick ? " --quick" : "");
    std::fflush(nullptr);
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (!pipe) return {{"status", "failed"}, {"reason", "popen failed"}};
    std::string text;
    char buf[4096];
    for (std::size_t k; (k = std::fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, k);
    if (::pclose(pipe) != 0) return {{"status", "failed"}, {"reason", cmd + " failed"}};
    json probe = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!probe.is_array()) return {{"status", "failed"}, {"reason", cmd + " printed no JSON"}};
    // The labels must be true here too: no copy in the view run, every tensor copied in the other.
    for (const json& e : probe) {
      const auto copied = e["copied_on_receipt"].get<std::uint64_t>();
      const auto received = e["received"].get<std::uint64_t>();
      if (copied != (std::string(below) == "0" ? 0 : received)) {
        return {{"status", "failed"},
                {"reason",
                 cmd + " copied " + std::to_string(copied) + " of " + std::to_string(received)}};
      }
    }
    result[std::string(below) == "0" ? "view" : "copy"] = probe;
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// The torch.multiprocessing baseline, run as a subprocess by the system interpreter.

json run_torch_peer(const Config& cfg, const std::vector<Plan>& plans) {
  if (cfg.torch.skip) return {{"status", "skipped"}, {"reason", "--no-torch"}};
  std::vector<int> round_trips, messages;
  for (const Plan& p : plans) {
    round_trips.push_back(p.round_trips);
    messages.push_back(p.messages);
  }
  return run_python_peer(cfg.torch.python, cfg.torch.script,
                         "--sizes " + join(cfg.sizes) + " --round-trips " + join(round_trips) +
                             " --messages " + join(messages) + " --time-cap " +
                             fmt("%g", cfg.time_cap_s) + (cfg.quick ? " --quick" : ""));
}

// ---------------------------------------------------------------------------------------------
// Report.

struct Target {
  std::string name, goal;
  std::size_t size;
  std::optional<double> value;  // nullopt: a side of the ratio was not measured
  bool pass;
};

std::string cell_latency(const json& entry, const char* transport) {
  return entry.contains(transport) ? latency_cell(entry[transport]["round_trip_us"]) : "-";
}

std::string cell_throughput(const json& entry, const char* transport) {
  return entry.contains(transport) ? rate_cell(entry[transport]["throughput"]) : "-";
}

// Each of ferry's figures beside its limit and the share of it reached, then what each limit is.
void print_limits(const json& results, std::size_t w0) {
  std::printf(
      "\nAgainst the limits: the share of its limit each of ferry's figures reaches (row / limit "
      "for a rate, limit / row for a time)\n%s%s%s%s\n",
      pad("size", w0).c_str(), pad("figure", 32).c_str(), pad("limit", 14).c_str(), "share");
  for (const json& e : results) {
    for (const json& l : e["limit"]) {
      std::printf("%s%s%s%s\n", pad(e["size"].get<std::string>(), w0).c_str(),
                  pad(l["figure"].get<std::string>(), 32).c_str(), pad(limit_cell(l), 14).c_str(),
                  share_cell(l).c_str());
    }
  }
  std::printf("limits:\n");
  for (const std::string& name : limit_names(results)) std::printf("  %s\n", name.c_str());
}

void print_report(const json& report, const std::vector<Target>& targets) {
  print_report_head("ferry-bench", report, "baseline");

  const char* transports[] = {"ferry_zero_copy", "ferry_copy", "torch_shared", "torch_fresh"};
  const std::size_t w0 = 8, w = 19;
  std::printf("\nRound trip, microseconds, p50 / p99\n%s%s", pad("size", w0).c_str(),
              pad("pipe 1 B", w).c_str());
  for (const char* t : transports) std::printf("%s", pad(t, w).c_str());
  std::printf("\n");
  for (const json& e : report["results"]) {
    std::printf("%s%s", pad(e["size"].get<std::string>(), w0).c_str(),
                pad(cell_latency(e, "pipe_1byte"), w).c_str());
    for (const char* t : transports) std::printf("%s", pad(cell_latency(e, t), w).c_str());
    std::printf("\n");
  }

  std::printf(
      "\nCPU per round trip, microseconds, both processes together (a spinning waiter's cost "
      "shows here)\n%s%s%s%s\n",
      pad("size", w0).c_str(), pad("pipe 1 B", w).c_str(), pad("ferry_zero_copy", w).c_str(),
      "ferry_copy");
  auto cpu_cell = [](const json& e, const char* t) -> std::string {
    if (!e.contains(t) || !e[t]["round_trip_us"].contains("cpu_us_per_round_trip")) return "-";
    return num(e[t]["round_trip_us"]["cpu_us_per_round_trip"].get<double>());
  };
  for (const json& e : report["results"]) {
    std::printf("%s%s%s%s\n", pad(e["size"].get<std::string>(), w0).c_str(),
                pad(cpu_cell(e, "pipe_1byte"), w).c_str(),
                pad(cpu_cell(e, "ferry_zero_copy"), w).c_str(), cpu_cell(e, "ferry_copy").c_str());
  }

  std::printf("\nOne-way throughput, messages/s (GB/s)\n%s", pad("size", w0).c_str());
  for (const char* t : transports) std::printf("%s", pad(t, w).c_str());
  std::printf("memcpy GB/s\n");
  for (const json& e : report["results"]) {
    std::printf("%s", pad(e["size"].get<std::string>(), w0).c_str());
    for (const char* t : transports) std::printf("%s", pad(cell_throughput(e, t), w).c_str());
    std::printf("%s\n", num(e["memcpy"]["gb_per_s"].get<double>()).c_str());
  }

  std::printf(
      "\nDiagnostics: send+recv in one process, microseconds p50 (no wake-up); copy-on-send "
      "one way, GB/s, the consumer dropping each message unread; memcpy GB/s into %d rotating "
      "destinations\n%s%s%s%s%s\n",
      static_cast<int>(kCapacity + 1), pad("size", w0).c_str(), pad("ferry_zero_copy", w).c_str(),
      pad("ferry_copy", w).c_str(), pad("ferry_copy unread", w).c_str(), "memcpy rotating");
  for (const json& e : report["results"]) {
    std::printf("%s%s%s%s%s\n", pad(e["size"].get<std::string>(), w0).c_str(),
                pad(num(e["ferry_zero_copy"]["in_process_us"]["p50"].get<double>()), w).c_str(),
                pad(num(e["ferry_copy"]["in_process_us"]["p50"].get<double>()), w).c_str(),
                pad(num(e["ferry_copy"]["throughput_unread"]["gb_per_s"].get<double>()), w).c_str(),
                num(e["memcpy_rotating"]["gb_per_s"].get<double>()).c_str());
  }

  const json& receipt = report["copy_on_receipt"];
  if (receipt["status"] == "ok") {
    std::printf(
        "\nCopy on receipt: send+recv of a copied tensor in one process, microseconds p50, "
        "the receiver keeping a view or a copy (default: copy below %s)\n%s%s%s%s%s\n",
        size_name(ferry::kDefaultCopyOnReceiptBelow).c_str(), pad("size", w0).c_str(),
        pad("view, dropped", w).c_str(), pad("copy, dropped", w).c_str(),
        pad("view, kept", w).c_str(), "copy, kept");
    for (std::size_t k = 0; k < receipt["view"].size(); ++k) {
      const json& v = receipt["view"][k];
      const json& c = receipt["copy"][k];
      std::printf("%s%s%s%s%s\n", pad(size_name(v["size_bytes"].get<std::size_t>()), w0).c_str(),
                  pad(num(v["dropped_us"]["p50"].get<double>()), w).c_str(),
                  pad(num(c["dropped_us"]["p50"].get<double>()), w).c_str(),
                  pad(num(v["kept_us"]["p50"].get<double>()), w).c_str(),
                  num(c["kept_us"]["p50"].get<double>()).c_str());
    }
  } else {
    std::printf("\ncopy on receipt: %s: %s\n", receipt["status"].get<std::string>().c_str(),
                receipt["reason"].get<std::string>().c_str());
  }

  print_limits(report["results"], w0);

  std::printf("\nTargets (ratios of p50s)\n%s%s%s%s%s\n", pad("ratio", 46).c_str(),
              pad("size", w0).c_str(), pad("value", 10).c_str(), pad("goal", 9).c_str(), "result");
  int pass = 0, miss = 0, skipped = 0;
  for (const Target& t : targets) {
    const std::string value = t.value ? num(*t.value) + "x" : "-";
    const char* result = !t.value ? "skipped" : t.pass ? "PASS" : "MISS";
    (!t.value ? skipped : t.pass ? pass : miss)++;
    std::printf("%s%s%s%s%s\n", pad(t.name, 46).c_str(), pad(size_name(t.size), w0).c_str(),
                pad(value, 10).c_str(), pad(t.goal, 9).c_str(), result);
  }
  std::printf("%d PASS, %d MISS, %d skipped\n", pass, miss, skipped);
}

// The goals of docs/benchmarks.md, each a ratio of two figures measured in this run.
std::vector<Target> evaluate_targets(const json& results) {
  std::vector<Target> targets;
  auto latency = [](const json& e, const char* t, const char* pct) -> std::optional<double> {
    if (!e.contains(t)) return std::nullopt;
    return e[t]["round_trip_us"][pct].get<double>();
  };
  auto ratio = [](std::optional<double> a, std::optional<double> b) -> std::optional<double> {
    if (!a || !b || *b <= 0) return std::nullopt;
    return *a / *b;
  };
  for (const json& e : results) {
    const auto size = e["size_bytes"].get<std::size_t>();
    // A round trip that wakes no one: the goal holds from 4 KiB to 1 MiB, where the message's
    // bytes are not touched by the transport.
    if (size >= 4 * kKiB && size <= kMiB) {
      const auto p50 = ratio(latency(e, "ferry_zero_copy", "p50"), latency(e, "pipe_1byte", "p50"));
      const auto p99 = ratio(latency(e, "ferry_zero_copy", "p99"), latency(e, "pipe_1byte", "p99"));
      targets.push_back(
          {"ferry zero-copy RTT p50 / pipe RTT p50", "<= 0.35x", size, p50, p50 && *p50 <= 0.35});
      targets.push_back(
          {"ferry zero-copy RTT p99 / pipe RTT p99", "<= 1x", size, p99, p99 && *p99 <= 1.0});
    }
    const auto torch =
        ratio(latency(e, "torch_shared", "p50"), latency(e, "ferry_zero_copy", "p50"));
    targets.push_back(
        {"torch shared RTT / ferry zero-copy RTT", ">= 50x", size, torch, torch && *torch >= 50});
  }
  for (const json& e : results) {
    const auto size = e["size_bytes"].get<std::size_t>();
    if (size < kMiB) continue;
    // Copy-on-send writes each message into another arena block, so the limit is a memcpy into
    // rotating destinations, not into one that stays in cache.
    const double r = e["ferry_copy"]["throughput"]["gb_per_s"].get<double>() /
                     e["memcpy_rotating"]["gb_per_s"].get<double>();
    targets.push_back({"ferry copy GB/s / memcpy rotating GB/s", ">= 0.8x", size, r, r >= 0.8});
  }
  return targets;
}

int run(const Config& cfg) {
  // One intra-op thread: two processes share a small machine, the numbers should measure the
  // transport, and the copy is held against single-core memcpy. It also keeps OpenMP's pool from
  // starting before fork, which a forked child could not use.
  at::set_num_threads(1);

  std::vector<Plan> plans;
  for (std::size_t s : cfg.sizes) plans.push_back(plan(s, cfg.iterations, cfg.quick));

  json report = open_report("ferry-bench", "none used (CPU transports only)");
  // Other work on the machine shifts every number: the CPU time others used during the run says
  // whether it was quiet.
  const CpuSample cpu_start = sample_cpu();
  report["config"] = {
      {"quick", cfg.quick},
      {"iterations", cfg.iterations},
      {"time_cap_s", cfg.time_cap_s},
      {"queue_capacity", kCapacity},
      {"intra_op_threads", 1},
      {"dtype", "float32"},
      {"gb", "1e9 bytes"},
      {"round_trip_consumer", "checks a stamp in the first and last element"},
      {"throughput_consumer", "reads one float per 4 KiB page"},
  };

  bool ok = true;
  json results = json::array();
  for (std::size_t k = 0; k < cfg.sizes.size(); ++k) {
    const std::size_t size = cfg.sizes[k];
    const Plan& p = plans[k];
    std::fprintf(stderr, "ferry-bench: %s: %d round trips, %d messages\n", size_name(size).c_str(),
                 p.round_trips, p.messages);
    json e;
    e["size_bytes"] = size;
    e["size"] = size_name(size);
    e["round_trips_planned"] = p.round_trips;
    e["messages_planned"] = p.messages;
    // Each limit is measured at every size right before the transport it is compared with
    // (pipe before zero-copy round trips, memcpy before copy-on-send throughput), so drift in
    // the machine over the run does not leak into the ratios.
    e["pipe_1byte"] = {{"round_trip_us", to_json(pipe_round_trip(p.round_trips, cfg.time_cap_s))}};
    // The wake-up floor's other half: a waiter that polls one shared word instead of sleeping.
    const RoundTripUs word = word_round_trip_us(p.round_trips, cfg.time_cap_s);
    e["shared_word"] = {{"round_trip_us", to_json(Latency{word.p50, word.p99, word.n})}};
    for (Mode mode : {Mode::zero_copy, Mode::copy}) {
      const auto before = ferry::transport_stats();
      json t;
      t["round_trip_us"] = to_json(ferry_round_trip(mode, size, p.round_trips, cfg.time_cap_s));
      if (mode == Mode::copy) {
        e["memcpy"] = to_json(memcpy_bandwidth(size, cfg.quick));
        e["memcpy_rotating"] = to_json(memcpy_bandwidth(size, cfg.quick, kCapacity + 1));
        e["memcpy_rotating"]["destinations"] = kCapacity + 1;
      }
      t["throughput_alone"] = to_json(stream_alone(mode, size, p.messages, cfg.time_cap_s));
      t["throughput"] = to_json(ferry_throughput(mode, size, p.messages, cfg.time_cap_s));
      if (mode == Mode::copy) {
        t["throughput_unread"] =
            to_json(ferry_throughput(mode, size, p.messages, cfg.time_cap_s, false));
      }
      t["in_process_us"] = to_json(ferry_in_process(mode, size, p.round_trips, cfg.time_cap_s));
      t["transport_stats"] = stats_delta(before, ferry::transport_stats());
      // The labels must be true: a "zero-copy" run that copied measures the wrong path.
      const auto copied = t["transport_stats"]["tensors_copied"].get<std::uint64_t>();
      const auto shared = t["transport_stats"]["tensors_zero_copy"].get<std::uint64_t>();
      const bool labelled_right = mode == Mode::zero_copy ? copied == 0 : shared == 0;
      t["verified"] = labelled_right;
      if (!labelled_right) {
        std::fprintf(
            stderr, "ferry-bench: ERROR: %s at %s sent %llu copied and %llu shared tensors\n",
            mode_name(mode), size_name(size).c_str(), static_cast<unsigned long long>(copied),
            static_cast<unsigned long long>(shared));
        ok = false;
      }
      e[mode_name(mode)] = t;
    }
    e["limit"] = limits_json(row_limits(e));
    results.push_back(e);
  }

  std::fprintf(stderr, "ferry-bench: copy on receipt against a view\n");
  report["copy_on_receipt"] = measure_receipt(cfg);
  if (report["copy_on_receipt"]["status"] != "ok") ok = false;

  std::fprintf(stderr, "ferry-bench: torch.multiprocessing baseline (%s)\n",
               cfg.torch.python.c_str());
  json torch = run_torch_peer(cfg, plans);
  if (torch["status"] == "ok") {
    for (std::size_t k = 0; k < results.size(); ++k) {
      const json& peer = torch["results"].at(k);
      if (peer["size_bytes"].get<std::size_t>() != cfg.sizes[k]) {
        throw std::runtime_error("torch_peer.py answered for other sizes");
      }
      results[k]["torch_shared"] = peer["torch_shared"];
      results[k]["torch_fresh"] = peer["torch_fresh"];
    }
    torch.erase("results");
  } else if (!explain_missing_peer("ferry-bench", "baseline", torch)) {
    ok = false;
  }
  report["torch"] = torch;
  report["results"] = results;

  const std::vector<Target> targets = evaluate_targets(results);
  json jt = json::array();
  for (const Target& t : targets) {
    jt.push_back({{"ratio", t.name},
                  {"size_bytes", t.size},
                  {"value", t.value ? json(*t.value) : json(nullptr)},
                  {"goal", t.goal},
                  {"result", !t.value ? "skipped"
                             : t.pass ? "PASS"
                                      : "MISS"}});
  }
  report["targets"] = jt;
  report["machine_activity"] = activity(cpu_start, sample_cpu());

  print_report(report, targets);
  write_report(report, cfg.json_path);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-bench: ferry's transports beside a pipe, memcpy and torch.multiprocessing"};
  Config cfg;
  std::vector<std::string> sizes = {"4KiB", "64KiB", "1MiB", "16MiB", "64MiB", "256MiB", "1GiB"};
  int iterations = 0;  // 0: the default for the mode
  double time_cap = 0;
  app.add_option("--json", cfg.json_path, "write every number to this JSON file");
  auto* sizes_option =
      app.add_option("--sizes", sizes,
                     "message sizes, e.g. 4KiB,1MiB (float32 tensors of that size; default 4 KiB "
                     "to 1 GiB, leaving out what this machine's memory cannot hold)")
          ->delimiter(',');
  app.add_option("--iterations", iterations,
                 "round trips at sizes up to 1 MiB, fewer above (default 2000, --quick 200)");
  app.add_flag("--quick", cfg.quick, "fewer iterations and a shorter time cap (smoke test)");
  app.add_option("--time-cap", time_cap,
                 "seconds after which a measurement stops early (default 3, --quick 0.5)");
  add_torch_peer_options(app, cfg.torch, "baseline", "torch_peer.py");
  bool receipt_probe_only = false;
  app.add_flag("--receipt-probe", receipt_probe_only,
               "internal: time copy on receipt with this process's setting, print JSON")
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (receipt_probe_only) return receipt_probe(cfg.quick);

  for (const std::string& s : sizes) {
    const auto bytes = parse_size(s);
    if (!bytes || *bytes < 8 || *bytes % sizeof(float) != 0) {
      std::fprintf(stderr, "ferry-bench: bad size '%s' (a multiple of 4 bytes, at least 8)\n",
                   s.c_str());
      return 2;
    }
    // A size is measured with queue capacity + 2 tensors of it in the arena (the zero-copy pool;
    // the arena keeps a segment made for one large tensor for its life) while as many more are
    // alive in the heap (memcpy's rotating buffers, the copies' source); a default size that
    // would take more than half the memory available is left out (1 GiB needs some 20 GiB).
    const std::size_t working_set = 2 * (kCapacity + 2) * *bytes;
    if (sizes_option->count() == 0 && working_set > available_memory() / 2) {
      std::fprintf(stderr, "ferry-bench: leaving out %s: it needs about %s of memory\n",
                   size_name(*bytes).c_str(), size_name(working_set).c_str());
      continue;
    }
    cfg.sizes.push_back(*bytes);
  }
  cfg.iterations = iterations > 0 ? iterations : cfg.quick ? 200 : 2000;
  cfg.time_cap_s = time_cap > 0 ? time_cap : cfg.quick ? 0.5 : 3.0;
  if (cfg.torch.script.empty())
    cfg.torch.script = peer_script("torch_peer.py", FERRY_BENCH_PEER_SOURCE);
  if (iterations < 0 || time_cap < 0) {
    std::fprintf(stderr, "ferry-bench: --iterations and --time-cap must be positive\n");
    return 2;
  }

  try {
    return run(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-bench: %s\n", e.what());
    return 1;
  }
}
