// ferry-fanin-bench: many producer processes sending into one ferry::TensorQueue and one consumer
// receiving everything (the multi-GPU inference layout: a process per device, one collector),
// beside torch.multiprocessing doing the same layout (fanin_peer.py), in one run. For each count
// of producers and message size: messages/s into the consumer, one-way latency, and the CPU time
// the consumer and the producers spend per message.
#include <fcntl.h>
#include <sys/prctl.h>
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

constexpr std::uint32_t kCapacity = 8;  // queue depth, torch's included
// More tensors than one producer can have in flight (the queue's capacity plus the one the
// consumer holds), so a pool tensor is never rewritten while the consumer may still read it.
constexpr int kPool = static_cast<int>(kCapacity) + 2;
// Each producer sends its pool once before the start barrier: segments are mapped and pages
// touched in the consumer before the clock starts.
constexpr int kWarmup = kPool;
// Generous: a wait this long means a peer is stuck, and the run should fail rather than hang.
constexpr std::chrono::milliseconds kTimeout{60'000};
// How often a waiting consumer looks for a producer that died, instead of waiting kTimeout.
constexpr std::chrono::milliseconds kPoll{250};
// Messages per (producers, size) point, shared among the producers: about 1-2 s of ferry on a
// 2-core machine. fanin_peer.py's messages_per_producer() is the same formula.
constexpr int kBudget = 200'000;
constexpr int kQuickBudget = 2'000;
constexpr int kMinMessages = 5;
constexpr int kMaxProducers = 64;
// The last element carries the sequence number as a float32, exact up to 2^24.
constexpr std::uint32_t kStampModulo = 1u << 24;
// "FANI": a header that does not start with it is not one this benchmark wrote.
constexpr std::uint64_t kMagic = 0x46414e49;

// A sink the optimizer cannot see through, so the consumer's reads are really done.
volatile float g_sink = 0;

struct Config {
  std::vector<int> producers;
  std::vector<std::size_t> sizes;
  int messages = 0;  // per producer; 0: kBudget (kQuickBudget) shared among the producers
  bool quick = false;
  double time_cap_s = 2.0;
  TorchPeer torch;
  std::string json_path;
};

struct Point {
  int producers;
  std::size_t size;
  int messages_per_producer;
};

int messages_per_producer(const Config& cfg, int producers) {
  if (cfg.messages > 0) return cfg.messages;
  const int budget = cfg.quick ? kQuickBudget : kBudget;
  return std::max(kMinMessages, (budget + producers - 1) / producers);
}

// User plus system time of this process, all threads, in seconds.
double rusage_self_s() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// ---------------------------------------------------------------------------------------------
// The message: one float32 tensor whose first 24 bytes are a header and whose last element
// repeats the sequence number, so a view of stale or foreign data fails the checks.

enum class Kind : std::uint64_t { data = 1, end = 2 };

struct Header {
  std::uint64_t tag;     // kMagic << 32 | kind << 16 | producer
  std::uint64_t seq;     // per producer, warm-up included; an end message carries the count
  std::int64_t sent_ns;  // monotonic_ns() just before send()
};
constexpr std::size_t kMinSize = sizeof(Header) + sizeof(float);

void write_message(const at::Tensor& t, Kind kind, int producer, std::uint64_t seq) {
  floats(t)[t.numel() - 1] = static_cast<float>(seq % kStampModulo);
  Header h{
      kMagic << 32 | static_cast<std::uint64_t>(kind) << 16 | static_cast<std::uint64_t>(producer),
      seq, 0};
  // Stamped last, so the latency starts as close to send() as the producer can make it.
  h.sent_ns = monotonic_ns();
  std::memcpy(t.data_ptr(), &h, sizeof h);
}

// What the consumer knows of each producer's stream, and the checks every message passes.
class Streams {
 public:
  Streams(int producers, std::int64_t numel)
      : numel_(numel),
        next_(static_cast<std::size_t>(producers), 0),
        ended_(static_cast<std::size_t>(producers), false) {}

  // The message's header once it has passed every check; throws naming what was wrong.
  Header check(const Tensors& msg) {
    if (msg.size() != 1 || msg[0].numel() != numel_ || msg[0].scalar_type() != at::kFloat) {
      throw std::runtime_error("a message of the wrong shape");
    }
    Header h{};
    std::memcpy(&h, msg[0].data_ptr(), sizeof h);
    const std::uint64_t producer = h.tag & 0xffff;
    const std::uint64_t kind = (h.tag >> 16) & 0xffff;
    if (h.tag >> 32 != kMagic || producer >= next_.size() ||
        (kind != static_cast<std::uint64_t>(Kind::data) &&
         kind != static_cast<std::uint64_t>(Kind::end))) {
      throw std::runtime_error("a message with a foreign header (tag " + std::to_string(h.tag) +
                               ")");
    }
    const std::string who = "producer " + std::to_string(producer);
    if (ended_[producer]) throw std::runtime_error(who + ": a message after its end");
    if (h.seq != next_[producer]) {
      throw std::runtime_error(who + ": message " + std::to_string(next_[producer]) +
                               " lost or out of order (got " + std::to_string(h.seq) + ")");
    }
    if (kind == static_cast<std::uint64_t>(Kind::end)) {
      ended_[producer] = true;
      return h;
    }
    const float last = floats(msg[0])[numel_ - 1];
    if (last != static_cast<float>(h.seq % kStampModulo)) {
      throw std::runtime_error(who + ": message " + std::to_string(h.seq) +
                               " has stale data (last element " + std::to_string(last) + ")");
    }
    ++next_[producer];
    return h;
  }

  std::uint64_t next(int producer) const { return next_[static_cast<std::size_t>(producer)]; }

 private:
  std::int64_t numel_;
  std::vector<std::uint64_t> next_;
  std::vector<bool> ended_;
};

// ---------------------------------------------------------------------------------------------
// The measurement.

struct Figures {
  double messages_per_s = 0, gb_per_s = 0, p50_us = 0, p99_us = 0;
  double consumer_cpu_us = 0, producer_cpu_us = 0;
  std::uint64_t n = 0;
  std::uint64_t tensors_copied = 0;  // by the producers: zero-copy means none
};

// One producer: warm-up, start barrier, its messages until its count or the time cap, an end
// message with the count, then, once the consumer says it has everything, its CPU time.
void produce(ferry::TensorQueue& q, Link& link, int id, std::int64_t numel, int messages,
             double time_cap_s) {
  std::vector<at::Tensor> pool;
  for (int k = 0; k < kPool; ++k) {
    // Filled, so every page is real before the clock starts.
    pool.push_back(ferry::empty_shared({numel}, at::TensorOptions().dtype(at::kFloat)).zero_());
  }
  std::uint64_t seq = 0;
  auto send = [&](Kind kind) {
    const at::Tensor& t = pool[seq % kPool];
    write_message(t, kind, id, seq);
    q.send({t}, kTimeout);
  };
  for (int i = 0; i < kWarmup; ++i, ++seq) send(Kind::data);
  link.send('r');
  link.expect('g', "start");

  const double cpu0 = rusage_self_s();
  const auto stats0 = ferry::transport_stats();
  const std::int64_t deadline = monotonic_ns() + static_cast<std::int64_t>(time_cap_s * 1e9);
  std::uint64_t sent = 0;
  for (; sent < static_cast<std::uint64_t>(messages); ++sent, ++seq) {
    if (sent >= static_cast<std::uint64_t>(kMinMessages) && monotonic_ns() > deadline) break;
    send(Kind::data);
  }
  send(Kind::end);
  // The consumer may still be reading this producer's blocks until it says otherwise.
  link.expect('d', "done");
  const double cpu = rusage_self_s() - cpu0;
  const auto stats1 = ferry::transport_stats();
  link.send(cpu);
  link.send(sent);
  link.send(stats1.tensors_copied - stats0.tensors_copied);
  if (ferry::flush(kTimeout) != 0) throw std::runtime_error("tensors still unreceived at exit");
}

Figures ferry_fanin(const Point& pt, double time_cap_s) {
  const auto numel = static_cast<std::int64_t>(pt.size / sizeof(float));
  auto q = ferry::TensorQueue::create({kCapacity});
  std::vector<std::unique_ptr<Link>> links;
  std::vector<std::unique_ptr<Child>> producers;
  for (int i = 0; i < pt.producers; ++i) {
    links.push_back(std::make_unique<Link>());
    producers.push_back(std::make_unique<Child>(
        [&, i] {
          // The parent's ends of earlier producers' pipes: held here, they would hide the parent's
          // end of file from those producers.
          for (int j = 0; j < i; ++j) links[static_cast<std::size_t>(j)].reset();
          links[static_cast<std::size_t>(i)]->child_side();
          produce(q, *links[static_cast<std::size_t>(i)], i, numel, pt.messages_per_producer,
                  time_cap_s);
        },
        "ferry-fanin-bench producer"));
    links.back()->parent_side();
  }

  // recv() in slices, so a producer that died fails the run at once instead of after kTimeout.
  auto next_message = [&]() -> Tensors {
    const std::int64_t give_up = monotonic_ns() + kTimeout.count() * 1'000'000;
    for (;;) {
      if (auto msg = q.try_recv(kPoll)) return std::move(*msg);
      for (int i = 0; i < pt.producers; ++i) {
        if (producers[static_cast<std::size_t>(i)]->exited()) {
          throw std::runtime_error("producer " + std::to_string(i) + " exited early");
        }
      }
      if (monotonic_ns() > give_up) throw std::runtime_error("no message for 60 s");
    }
  };

  Streams streams(pt.producers, numel);
  float sum = 0;
  for (int k = 0; k < pt.producers * kWarmup; ++k) {
    Tensors msg = next_message();
    streams.check(msg);
    sum += touch_pages(msg[0]);
  }
  for (auto& link : links) link->expect('r', "ready");

  std::vector<double> latencies_us;
  latencies_us.reserve(static_cast<std::size_t>(pt.producers) *
                       static_cast<std::size_t>(pt.messages_per_producer));
  const double cpu0 = rusage_self_s();
  const std::int64_t t0 = monotonic_ns();
  for (auto& link : links) link->send('g');
  std::int64_t last = t0;
  for (int ended = 0; ended < pt.producers;) {
    Tensors msg = next_message();
    const std::int64_t now = monotonic_ns();
    const Header h = streams.check(msg);
    if (((h.tag >> 16) & 0xffff) == static_cast<std::uint64_t>(Kind::end)) {
      ++ended;
      continue;
    }
    if (h.sent_ns < t0 || h.sent_ns > now) {
      throw std::runtime_error("a send stamp outside the run (" + std::to_string(h.sent_ns - t0) +
                               " ns after the start, " + std::to_string(now - h.sent_ns) +
                               " ns before its receipt)");
    }
    latencies_us.push_back(static_cast<double>(now - h.sent_ns) / 1e3);
    sum += touch_pages(msg[0]);
    last = now;
  }
  const double consumer_cpu = rusage_self_s() - cpu0;
  g_sink = sum;

  Figures f;
  double producer_cpu = 0;
  for (int i = 0; i < pt.producers; ++i) {
    Link& link = *links[static_cast<std::size_t>(i)];
    link.send('d');
    producer_cpu += link.recv<double>();
    const auto sent = link.recv<std::uint64_t>();
    f.tensors_copied += link.recv<std::uint64_t>();
    if (sent != streams.next(i) - kWarmup) {
      throw std::runtime_error("producer " + std::to_string(i) + " sent " + std::to_string(sent) +
                               ", the consumer received " +
                               std::to_string(streams.next(i) - kWarmup));
    }
  }
  for (auto& p : producers) p->wait();
  if (f.tensors_copied != 0) {
    throw std::runtime_error(std::to_string(f.tensors_copied) +
                             " tensors were copied: the run did not measure zero-copy");
  }

  f.n = latencies_us.size();
  const double n = static_cast<double>(f.n);
  const double elapsed = static_cast<double>(last - t0) / 1e9;
  f.messages_per_s = n / elapsed;
  f.gb_per_s = n * static_cast<double>(pt.size) / elapsed / 1e9;
  std::sort(latencies_us.begin(), latencies_us.end());
  f.p50_us = percentile(latencies_us, 50);
  f.p99_us = percentile(latencies_us, 99);
  f.consumer_cpu_us = 1e6 * consumer_cpu / n;
  f.producer_cpu_us = 1e6 * producer_cpu / n;
  return f;
}

// ---------------------------------------------------------------------------------------------
// The limits (docs/benchmarks.md, "Every row against its limit"), measured once per size before
// its first row.

// One message's whole work in one process, one thread, with no process to wake: a producer's
// stamp and send, the consumer's receive, checks and read of every page, from a pool as a
// producer's own. The producers and the consumer can at best share it out over the cores.
double messages_alone_per_s(std::size_t size, int messages, double time_cap_s) {
  const auto numel = static_cast<std::int64_t>(size / sizeof(float));
  auto q = ferry::TensorQueue::create({kCapacity});
  std::vector<at::Tensor> pool;
  for (int k = 0; k < kPool; ++k) {
    pool.push_back(ferry::empty_shared({numel}, at::TensorOptions().dtype(at::kFloat)).zero_());
  }
  Streams streams(1, numel);
  float sum = 0;
  std::uint64_t seq = 0;
  auto one = [&] {
    const at::Tensor& t = pool[seq % kPool];
    write_message(t, Kind::data, 0, seq++);
    q.send({t}, kTimeout);
    Tensors msg = q.recv(kTimeout);
    streams.check(msg);
    sum += touch_pages(msg[0]);
  };
  for (int i = 0; i < kWarmup; ++i) one();
  const std::int64_t t0 = monotonic_ns();
  const double cpu0 = cpu_seconds();
  int n = 0;
  for (; n < messages; ++n) {
    if (n >= kMinMessages && monotonic_ns() - t0 > static_cast<std::int64_t>(time_cap_s * 1e9))
      break;
    one();
  }
  // CPU time: the work alone, whatever else the machine runs meanwhile.
  const double elapsed = cpu_seconds() - cpu0;
  g_sink = sum;
  return n / elapsed;
}

json measure_limits(std::size_t size, const Config& cfg) {
  const int n = cfg.quick ? kQuickBudget : kBudget / 10;
  const WakeFloor floor = wake_floor(n, cfg.time_cap_s);
  json j = wake_floor_json(floor);
  j["messages_alone_per_s"] = messages_alone_per_s(size, n, cfg.time_cap_s);
  return j;
}

// The consumer's rate against the compute ceiling of P producers and one consumer; its
// one-way latency against half the wake-up floor.
std::vector<Limit> row_limits(const json& e, const json& measured) {
  const int producers = e["producers"].get<int>();
  const Ceiling c = compute_ceiling("a message's stamp, send, receive, checks and page reads",
                                    producers + 1, "processes");
  const json& f = e["ferry"];
  std::vector<Limit> out = {rate_limit("ferry msgs/s", c.name, "msgs/s",
                                       measured["messages_alone_per_s"].get<double>() * c.factor,
                                       f["messages_per_s"].get<double>())};
  const double floor = std::min(measured["pipe_1byte_us"]["p50"].get<double>(),
                                measured["shared_word_us"]["p50"].get<double>());
  for (const char* pct : {"p50", "p99"}) {
    out.push_back(time_limit(std::string("ferry latency ") + pct, kWakeFloorOneWayName, "us",
                             floor / 2, f["latency_us"][pct].get<double>()));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The machine, sizes and formatting.

std::optional<int> parse_producers(const std::string& s) {
  if (s.empty() || s.size() > 3 ||
      !std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return std::nullopt;
  }
  const int n = std::stoi(s);
  if (n < 1 || n > kMaxProducers) return std::nullopt;
  return n;
}

json to_json(const Figures& f) {
  return {{"messages_per_s", f.messages_per_s},
          {"gb_per_s", f.gb_per_s},
          {"latency_us", {{"p50", f.p50_us}, {"p99", f.p99_us}}},
          {"consumer_cpu_us_per_message", f.consumer_cpu_us},
          {"producer_cpu_us_per_message", f.producer_cpu_us},
          {"n", f.n},
          {"tensors_copied", f.tensors_copied}};
}

// ---------------------------------------------------------------------------------------------
// The torch.multiprocessing side, run as a subprocess by the system interpreter.

// {"status": "ok", ...peer output} or {"status": "skipped"|"failed", "reason": ...}.
json run_torch_peer(const Config& cfg, const std::vector<Point>& points) {
  if (cfg.torch.skip) return {{"status", "skipped"}, {"reason", "--no-torch"}};
  std::vector<int> messages;
  for (const Point& p : points) messages.push_back(p.messages_per_producer);
  // The peer runs the points in the same order: sizes outer, producer counts inner.
  json peer = run_python_peer(cfg.torch.python, cfg.torch.script,
                              "--producers " + join(cfg.producers) + " --sizes " + join(cfg.sizes) +
                                  " --messages " + join(messages) + " --time-cap " +
                                  fmt("%g", cfg.time_cap_s) + (cfg.quick ? " --quick" : ""));
  if (peer["status"] != "ok") return peer;
  if (!peer.contains("results") || !peer["results"].is_array() ||
      peer["results"].size() != points.size()) {
    return {{"status", "failed"}, {"reason", "fanin_peer.py answered for other points"}};
  }
  for (std::size_t k = 0; k < points.size(); ++k) {
    const json& r = peer["results"][k];
    if (r.value("producers", 0) != points[k].producers ||
        r.value("size_bytes", std::size_t{0}) != points[k].size) {
      return {{"status", "failed"}, {"reason", "fanin_peer.py answered for other points"}};
    }
  }
  return peer;
}

// ---------------------------------------------------------------------------------------------
// Report.

std::string cell_rate(const json& e, const char* impl) {
  return e.contains(impl) ? rate_cell(e[impl]) : "-";
}

std::string cell_latency(const json& e, const char* impl) {
  return e.contains(impl) ? latency_cell(e[impl]["latency_us"]) : "-";
}

std::string cell_cpu(const json& e, const char* impl) {
  if (!e.contains(impl)) return "-";
  return num(e[impl]["consumer_cpu_us_per_message"].get<double>()) + " / " +
         num(e[impl]["producer_cpu_us_per_message"].get<double>());
}

void print_report(const json& report) {
  print_report_head("ferry-fanin-bench", report, "side");

  std::printf(
      "\nP producers -> one consumer through one queue of capacity %u; messages/s (GB/s) into the "
      "consumer, one-way latency p50 / p99 in microseconds, CPU microseconds per message "
      "(consumer / all producers)\n",
      kCapacity);
  const std::size_t wp = 4, ws = 9, wr = 17, wl = 15, wx = 13, wc = 16, wm = 15, wh = 7;
  std::printf("%s%s%s%s%s%s%s%s%s%s%s%s\n", pad("P", wp).c_str(), pad("size", ws).c_str(),
              pad("ferry msgs/s", wr).c_str(), pad("ferry p50/p99", wl).c_str(),
              pad("torch msgs/s", wr).c_str(), pad("torch p50/p99", wl).c_str(),
              pad("ferry/torch", wx).c_str(), pad("limit", wm).c_str(), pad("share", wh).c_str(),
              pad("p50/p99 share", wl).c_str(), pad("ferry CPU c/p", wc).c_str(), "torch CPU c/p");
  for (const json& e : report["results"]) {
    std::string ratio = "-";
    if (e.contains("ferry") && e.contains("torch")) {
      const double t = e["torch"]["messages_per_s"].get<double>();
      if (t > 0) ratio = num(e["ferry"]["messages_per_s"].get<double>() / t) + "x";
    }
    // The rate's limit, then the latency's shares of their floor.
    const json& l = e["limit"];
    std::printf(
        "%s%s%s%s%s%s%s%s%s%s%s%s\n", pad(std::to_string(e["producers"].get<int>()), wp).c_str(),
        pad(e["size"].get<std::string>(), ws).c_str(), pad(cell_rate(e, "ferry"), wr).c_str(),
        pad(cell_latency(e, "ferry"), wl).c_str(), pad(cell_rate(e, "torch"), wr).c_str(),
        pad(cell_latency(e, "torch"), wl).c_str(), pad(ratio, wx).c_str(),
        pad(limit_cell(l[0]), wm).c_str(), pad(share_cell(l[0]), wh).c_str(),
        pad(share_cell(l[1]) + " / " + share_cell(l[2]), wl).c_str(),
        pad(cell_cpu(e, "ferry"), wc).c_str(), cell_cpu(e, "torch").c_str());
  }
  std::printf(
      "limit: the compute ceiling, one message's work alone in one thread x min(P + 1, %d cores); "
      "p50/p99 share: of the %s\n",
      usable_cores(), kWakeFloorOneWayName.c_str());
}

int run(const Config& cfg) {
  // One intra-op thread: the producers and the consumer share a small machine, and the numbers
  // should measure the transport. It also keeps OpenMP's pool from starting before fork, which a
  // forked child could not use.
  at::set_num_threads(1);

  std::vector<Point> points;
  for (std::size_t s : cfg.sizes) {
    for (int p : cfg.producers) points.push_back({p, s, messages_per_producer(cfg, p)});
  }

  json report = open_report("ferry-fanin-bench", "none used (CPU tensors only)");
  const CpuSample cpu_start = sample_cpu();
  report["config"] = {
      {"quick", cfg.quick},
      {"producers", cfg.producers},
      {"sizes", cfg.sizes},
      {"messages_per_producer", cfg.messages > 0 ? json(cfg.messages) : json("budget / producers")},
      {"messages_budget", cfg.messages > 0 ? json(nullptr)
                          : cfg.quick      ? json(kQuickBudget)
                                           : json(kBudget)},
      {"time_cap_s", cfg.time_cap_s},
      {"queue_capacity", kCapacity},
      {"producer_pool", kPool},
      {"warmup_per_producer", kWarmup},
      {"intra_op_threads", 1},
      {"dtype", "float32"},
      {"gb", "1e9 bytes"},
      {"rate", "messages received over the time from the start barrier to the last one"},
      {"latency",
       "CLOCK_MONOTONIC from just before the producer's send (time blocked on a full queue "
       "included) to just after the consumer's receive"},
      {"cpu",
       "getrusage(RUSAGE_SELF) user+system, consumer over its receive loop, each producer "
       "from the start barrier until the consumer has received everything"},
      {"consumer", "checks header, sequence and last element, reads one float per 4 KiB page"},
  };

  json results = json::array();
  json limits = json::array();
  for (const Point& pt : points) {
    if (limits.empty() || limits.back()["size_bytes"] != pt.size) {
      std::fprintf(stderr, "ferry-fanin-bench: limits, %s\n", size_name(pt.size).c_str());
      json measured = measure_limits(pt.size, cfg);
      measured["size_bytes"] = pt.size;
      limits.push_back(measured);
    }
    std::fprintf(stderr, "ferry-fanin-bench: ferry, %d producers, %s, %d messages each\n",
                 pt.producers, size_name(pt.size).c_str(), pt.messages_per_producer);
    json e;
    e["name"] = "P=" + std::to_string(pt.producers) + ", " + size_name(pt.size);
    e["producers"] = pt.producers;
    e["size_bytes"] = pt.size;
    e["size"] = size_name(pt.size);
    e["messages"] = pt.producers * pt.messages_per_producer;
    e["ferry"] = to_json(ferry_fanin(pt, cfg.time_cap_s));
    e["limit"] = limits_json(row_limits(e, limits.back()));
    results.push_back(e);
  }
  report["limits_measured"] = limits;

  bool ok = true;
  std::fprintf(stderr, "ferry-fanin-bench: torch.multiprocessing (%s)\n", cfg.torch.python.c_str());
  json torch = run_torch_peer(cfg, points);
  if (torch["status"] == "ok") {
    for (std::size_t k = 0; k < results.size(); ++k) {
      json t = torch["results"][k];
      t.erase("producers");
      t.erase("size_bytes");
      results[k]["torch"] = t;
    }
    torch.erase("results");
  } else if (!explain_missing_peer("ferry-fanin-bench", "side", torch)) {
    ok = false;
  }
  report["results"] = results;
  report["torch"] = torch;
  report["machine_activity"] = activity(cpu_start, sample_cpu());

  print_report(report);
  write_report(report, cfg.json_path);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ferry-fanin-bench: many producers into one consumer, ferry against "
      "torch.multiprocessing"};
  Config cfg;
  std::vector<std::string> producers = {"1", "2", "4", "8"};
  std::vector<std::string> sizes = {"4KiB", "1MiB"};
  double time_cap = 0;
  app.add_option("--json", cfg.json_path, "write every number to this JSON file");
  app.add_option("--producers", producers, "producer counts, e.g. 1,2,4,8 (the default)")
      ->delimiter(',');
  app.add_option("--sizes", sizes,
                 "message sizes, e.g. 4KiB,1MiB (the default; float32 tensors of that size)")
      ->delimiter(',');
  app.add_option("--messages", cfg.messages,
                 "messages per producer (default: 200000, --quick 2000, shared among the "
                 "producers)");
  app.add_flag("--quick", cfg.quick, "few messages and a short time cap (smoke test)");
  app.add_option("--time-cap", time_cap,
                 "seconds after which producers stop early (default 2, --quick 0.25)");
  add_torch_peer_options(app, cfg.torch, "side", "fanin_peer.py");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  for (const std::string& s : producers) {
    const auto n = parse_producers(s);
    if (!n) {
      std::fprintf(stderr,
                   "ferry-fanin-bench: bad producer count '%s' (a whole number from 1 to %d)\n",
                   s.c_str(), kMaxProducers);
      return 2;
    }
    cfg.producers.push_back(*n);
  }
  for (const std::string& s : sizes) {
    const auto bytes = parse_size(s);
    if (!bytes || *bytes < kMinSize || *bytes % sizeof(float) != 0) {
      std::fprintf(stderr,
                   "ferry-fanin-bench: bad size '%s' (a multiple of 4 bytes, at least %zu)\n",
                   s.c_str(), kMinSize);
      return 2;
    }
    cfg.sizes.push_back(*bytes);
  }
  if (cfg.producers.empty() || cfg.sizes.empty()) {
    std::fprintf(stderr, "ferry-fanin-bench: --producers and --sizes need at least one value\n");
    return 2;
  }
  if (cfg.messages < 0 || time_cap < 0) {
    std::fprintf(stderr, "ferry-fanin-bench: --messages and --time-cap must be positive\n");
    return 2;
  }
  cfg.time_cap_s = time_cap > 0 ? time_cap : cfg.quick ? 0.25 : 2.0;
  if (cfg.torch.script.empty())
    cfg.torch.script = peer_script("fanin_peer.py", FERRY_FANIN_PEER_SOURCE);

  try {
    return run(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-fanin-bench: %s\n", e.what());
    return 1;
  }
}
