// ferry-hosts-bench: the link between two hosts (hosts/host_link) against a plain Gloo
// send/recv and a raw TCP socket on the same link, in one run: round trip and one-way bandwidth
// from 4 KiB to 64 MiB. The "hosts" are two processes; the link is the loopback, or the address
// given (run it across two network namespaces for a veth link, docs/benchmarks.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "hosts/host_link.hpp"
#include "test/bench/bench_limits.hpp"
#include "test/bench/bench_support.hpp"

namespace {

using namespace ferry::bench;
using ferry::hosts::FrameKind;
using ferry::hosts::HostLink;
using Store = c10::intrusive_ptr<c10d::Store>;

constexpr std::chrono::milliseconds kTimeout{60'000};

struct Config {
  std::vector<std::size_t> sizes = {4 * kKiB, 64 * kKiB, kMiB, 16 * kMiB, 64 * kMiB};
  int iterations = 200;                   // round trips up to 1 MiB; a tenth above
  std::size_t stream_bytes = 512 * kMiB;  // one-way bytes per size (at least 8 messages)
  std::string address = "127.0.0.1";
  std::string json_path;
};

struct Figures {
  std::vector<double> rtt_us;
  double gb_per_s = 0;
};

// One transport between the parent ("head") and a forked child ("host"), each side's whole part:
// the rendezvous over the pipe, the timed round trips (the child echoes what came), then the
// one-way stream, whose end the child signals over the pipe.
struct Transport {
  const char* name;
  std::function<void(Link&, std::size_t bytes, int round_trips, int messages)> child;
  std::function<Figures(Link&, std::size_t bytes, int round_trips, int messages)> parent;
};

using SteadyClock = std::chrono::steady_clock;
double us_since(SteadyClock::time_point t) {
  return std::chrono::duration<double, std::micro>(SteadyClock::now() - t).count();
}

at::Tensor payload(std::size_t bytes) {
  return at::ones({static_cast<std::int64_t>(bytes / sizeof(float))}, at::kFloat);
}

// ---- ferry's link: a frame, then the tensor --------------------------------------------------

ferry::hosts::LinkOptions link_options(const Config& cfg) {
  ferry::hosts::LinkOptions o;
  o.address = cfg.address;
  o.timeout = kTimeout;
  o.join_timeout = kTimeout;
  return o;
}

Transport ferry_link(const Config& cfg) {
  return {"ferry link",
          [&cfg](Link& pipe, std::size_t, int round_trips, int messages) {
            const auto port = pipe.recv<std::uint16_t>();
            Store store = ferry::hosts::connect_store(cfg.address, port, kTimeout);
            HostLink link(store, "bench", 1, link_options(cfg));
            for (int i = 0; i < round_trips; ++i) {
              ferry::hosts::Message m = link.recv(kTimeout);
              link.send(FrameKind::result, m.frame.seq, "", m.tensors);
            }
            for (int i = 0; i < messages; ++i) link.recv(kTimeout);
            pipe.send('d');
          },
          [&cfg](Link& pipe, std::size_t bytes, int round_trips, int messages) {
            Store store = ferry::hosts::listen_store(cfg.address, 0, kTimeout);
            pipe.send(ferry::hosts::store_port(store));
            HostLink link(store, "bench", 0, link_options(cfg));
            const at::Tensor t = payload(bytes);
            Figures f;
            for (int i = 0; i < round_trips; ++i) {
              const auto t0 = SteadyClock::now();
              link.send(FrameKind::task, static_cast<std::uint64_t>(i), "", {t});
              link.recv(kTimeout);
              f.rtt_us.push_back(us_since(t0));
            }
            const auto t0 = SteadyClock::now();
            for (int i = 0; i < messages; ++i) link.send(FrameKind::task, 0, "", {t});
            pipe.expect('d', "ferry link stream");
            f.gb_per_s = static_cast<double>(bytes) * messages / us_since(t0) / 1e3;
            return f;
          }};
}

// ---- plain Gloo: c10d's ProcessGroupGloo send/recv of the tensor alone -----------------------

c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_pair(const Store& store, int rank,
                                                     const Config& cfg) {
  auto opts = c10d::ProcessGroupGloo::Options::create(kTimeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(cfg.address));
  opts->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, 2, opts);
}

Transport plain_gloo(const Config& cfg) {
  return {"plain Gloo",
          [&cfg](Link& pipe, std::size_t bytes, int round_trips, int messages) {
            const auto port = pipe.recv<std::uint16_t>();
            Store store = ferry::hosts::connect_store(cfg.address, port, kTimeout);
            auto pg = gloo_pair(store, 1, cfg);
            std::vector<at::Tensor> t = {payload(bytes)};
            for (int i = 0; i < round_trips; ++i) {
              pg->recv(t, 0, 0)->wait(kTimeout);
              pg->send(t, 0, 0)->wait(kTimeout);
            }
            for (int i = 0; i < messages; ++i) pg->recv(t, 0, 0)->wait(kTimeout);
            pipe.send('d');
          },
          [&cfg](Link& pipe, std::size_t bytes, int round_trips, int messages) {
            Store store = ferry::hosts::listen_store(cfg.address, 0, kTimeout);
            pipe.send(ferry::hosts::store_port(store));
            auto pg = gloo_pair(store, 0, cfg);
            std::vector<at::Tensor> t = {payload(bytes)};
            std::vector<at::Tensor> back = {payload(bytes)};
            Figures f;
            for (int i = 0; i < round_trips; ++i) {
              const auto t0 = SteadyClock::now();
              pg->send(t, 1, 0)->wait(kTimeout);
              pg->recv(back, 1, 0)->wait(kTimeout);
              f.rtt_us.push_back(us_since(t0));
            }
            const auto t0 = SteadyClock::now();
            for (int i = 0; i < messages; ++i) pg->send(t, 1, 0)->wait(kTimeout);
            pipe.expect('d', "plain Gloo stream");
            f.gb_per_s = static_cast<double>(bytes) * messages / us_since(t0) / 1e3;
            return f;
          }};
}

// ---- a raw TCP socket, TCP_NODELAY, the bytes alone ------------------------------------------

void io_all(int fd, void* p, std::size_t n, bool writing) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = writing ? ::send(fd, c, n, MSG_NOSIGNAL) : ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail_errno(writing ? "tcp send" : "tcp recv (peer gone)");
    c += r;
    n -= static_cast<std::size_t>(r);
  }
}

sockaddr_in tcp_address(const std::string& address, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
    throw std::runtime_error("raw TCP needs an IPv4 address, not " + address);
  }
  return a;
}

void no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Transport raw_tcp(const Config& cfg) {
  return {"raw TCP",
          [&cfg](Link& pipe, std::size_t bytes, int round_trips, int messages) {
            const auto port = pipe.recv<std::uint16_t>();
            const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            sockaddr_in a = tcp_address(cfg.address, port);
            if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
              fail_errno("connect");
            no_delay(fd);
            std::vector<char> buf(bytes);
            for (int i = 0; i < round_trips; ++i) {
              io_all(fd, buf.data(), bytes, false);
              io_all(fd, buf.data(), bytes, true);
            }
            for (int i = 0; i < messages; ++i) io_all(fd, buf.data(), bytes, false);
            pipe.send('d');
            ::close(fd);
          },
          [&cfg](Link& pipe, std::size_t bytes, int round_trips, int messages) {
            const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            sockaddr_in a = tcp_address(cfg.address, 0);
            socklen_t len = sizeof a;
            if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
                ::listen(ls, 1) != 0 ||
                ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
              fail_errno("listen on " + cfg.address);
            }
            pipe.send(static_cast<std::uint16_t>(ntohs(a.sin_port)));
            const int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) fail_errno("accept");
            ::close(ls);
            no_delay(fd);
            std::vector<char> buf(bytes, 1);
            Figures f;
            for (int i = 0; i < round_trips; ++i) {
              const auto t0 = SteadyClock::now();
              io_all(fd, buf.data(), bytes, true);
              io_all(fd, buf.data(), bytes, false);
              f.rtt_us.push_back(us_since(t0));
            }
            const auto t0 = SteadyClock::now();
            for (int i = 0; i < messages; ++i) io_all(fd, buf.data(), bytes, true);
            pipe.expect('d', "raw TCP stream");
            f.gb_per_s = static_cast<double>(bytes) * messages / us_since(t0) / 1e3;
            ::close(fd);
            return f;
          }};
}

json measure(const Transport& t, std::size_t bytes, int round_trips, int messages) {
  Link pipe;
  Child child(
      [&] {
        pipe.child_side();
        t.child(pipe, bytes, round_trips, messages);
      },
      std::string("ferry-hosts-bench ") + t.name + " host");
  pipe.parent_side();
  Figures f = t.parent(pipe, bytes, round_trips, messages);
  child.wait();
  std::sort(f.rtt_us.begin(), f.rtt_us.end());
  return {{"round_trip_us", {{"p50", percentile(f.rtt_us, 50)}, {"p99", percentile(f.rtt_us, 99)}}},
          {"round_trips", f.rtt_us.size()},
          {"gb_per_s", f.gb_per_s},
          {"messages", messages}};
}

// The link carries a frame and a tensor over TCP: what bounds it is a raw TCP socket moving the
// same bytes alone on the same link, measured in this run (docs/benchmarks.md, "Every row against
// its limit"). A p99 is held to the socket's median too: a tail of a few samples is noise.
json row_limits(const json& e) {
  const std::string tcp = "a raw TCP socket on the same link, the bytes alone (TCP_NODELAY)";
  const json& link = e["ferry link"];
  const json& raw = e["raw TCP"];
  std::vector<Limit> out;
  for (const char* pct : {"p50", "p99"}) {
    out.push_back(time_limit(std::string("link round trip ") + pct, tcp + ", p50", "us",
                             raw["round_trip_us"]["p50"].get<double>(),
                             link["round_trip_us"][pct].get<double>()));
  }
  out.push_back(rate_limit("link bandwidth", tcp, "GB/s", raw["gb_per_s"].get<double>(),
                           link["gb_per_s"].get<double>()));
  return limits_json(out);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool quick = false;
  std::vector<std::string> sizes;
  CLI::App app{"ferry-hosts-bench: the link between hosts against plain Gloo and raw TCP"};
  app.add_option("--json", cfg.json_path, "write every number to this JSON file");
  app.add_option("--sizes", sizes, "message sizes (default 4KiB,64KiB,1MiB,16MiB,64MiB)")
      ->delimiter(',');
  app.add_option("--iterations", cfg.iterations, "round trips up to 1 MiB (default 200)");
  app.add_option("--address", cfg.address,
                 "this side's IPv4 address, where the other process reaches it "
                 "(default 127.0.0.1)");
  app.add_flag("--quick", quick, "a few round trips and 16 MiB per stream: a smoke run");
  CLI11_PARSE(app, argc, argv);
  if (!sizes.empty()) {
    cfg.sizes.clear();
    for (const std::string& s : sizes) {
      const auto v = parse_size(s);
      if (!v || *v < 4) {
        std::fprintf(stderr, "ferry-hosts-bench: bad size '%s' (e.g. 4KiB, 1MiB)\n", s.c_str());
        return 2;
      }
      cfg.sizes.push_back(*v / 4 * 4);
    }
  }
  if (quick) {
    cfg.iterations = 10;
    cfg.stream_bytes = 16 * kMiB;
  }

  const CpuSample before = sample_cpu();
  json results = json::array();
  const Transport transports[] = {ferry_link(cfg), plain_gloo(cfg), raw_tcp(cfg)};
  try {
    for (std::size_t bytes : cfg.sizes) {
      const int round_trips = bytes <= kMiB ? cfg.iterations : std::max(5, cfg.iterations / 10);
      const int messages =
          static_cast<int>(std::clamp<std::size_t>(cfg.stream_bytes / bytes, 8, 2000));
      std::fprintf(stderr, "ferry-hosts-bench: %s: %d round trips, %d messages one way\n",
                   size_name(bytes).c_str(), round_trips, messages);
      json e = {{"size_bytes", bytes}, {"size", size_name(bytes)}};
      for (const Transport& t : transports) e[t.name] = measure(t, bytes, round_trips, messages);
      e["limit"] = row_limits(e);
      results.push_back(e);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-hosts-bench: failed: %s\n", e.what());
    return 1;
  }
  const CpuSample after = sample_cpu();

  json report = {{"tool", "ferry-hosts-bench"},
                 {"machine", machine_info("none")},
                 {"machine_activity", activity(before, after)},
                 {"address", cfg.address},
                 {"results", results}};
  std::printf("\nferry-hosts-bench on %s, %d cores, between two processes over %s\n",
              report["machine"]["cpu_model"].get<std::string>().c_str(),
              report["machine"]["cores"].get<int>(), cfg.address.c_str());
  std::printf("%-8s %-20s %-20s %-20s %-12s %-9s %-9s %-9s %-15s %s\n", "size",
              "link RTT p50/p99 us", "Gloo RTT p50/p99", "TCP RTT p50/p99", "link/Gloo",
              "link GB/s", "Gloo GB/s", "TCP GB/s", "link/Gloo GB/s",
              "share of raw TCP: RTT p50 / p99 / GB/s");
  for (const json& e : results) {
    auto rtt = [&](const char* t) {
      return num(e[t]["round_trip_us"]["p50"].get<double>()) + " / " +
             num(e[t]["round_trip_us"]["p99"].get<double>());
    };
    const double rt_ratio = e["ferry link"]["round_trip_us"]["p50"].get<double>() /
                            e["plain Gloo"]["round_trip_us"]["p50"].get<double>();
    const double bw_ratio =
        e["ferry link"]["gb_per_s"].get<double>() / e["plain Gloo"]["gb_per_s"].get<double>();
    std::printf("%-8s %-20s %-20s %-20s %-12s %-9s %-9s %-9s %-15s %s\n",
                e["size"].get<std::string>().c_str(), rtt("ferry link").c_str(),
                rtt("plain Gloo").c_str(), rtt("raw TCP").c_str(),
                (fmt("%.2fx", rt_ratio) + (rt_ratio <= 1.5 ? " PASS" : " MISS")).c_str(),
                num(e["ferry link"]["gb_per_s"].get<double>()).c_str(),
                num(e["plain Gloo"]["gb_per_s"].get<double>()).c_str(),
                num(e["raw TCP"]["gb_per_s"].get<double>()).c_str(),
                (fmt("%.2fx", bw_ratio) + (bw_ratio >= 0.9 ? " PASS" : " MISS")).c_str(),
                share_cells(e["limit"]).c_str());
  }
  std::printf("goals: link round trip <= 1.5x plain Gloo's, link bandwidth >= 0.9x plain Gloo's\n");
  std::printf(
      "limit: the raw TCP columns, the same bytes alone on the same link; share: raw TCP's "
      "round trip / the link's, the link's GB/s / raw TCP's\n");
  if (!cfg.json_path.empty()) {
    std::ofstream(cfg.json_path) << report.dump(2) << "\n";
    std::printf("wrote %s\n", cfg.json_path.c_str());
  }
  return 0;
}
