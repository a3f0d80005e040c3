// ferry-demo: the main job until the supervisor lands. A parent and a forked child stream
// tensors both ways through two TensorQueues and report what moved, how fast, and how much of
// it was zero-copy. Every reply is checked, so a wrong byte fails the run.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "ipc/units.hpp"
#include "runtime/ferry.hpp"
#include "workers/serve_loop.hpp"

namespace {

using Seconds = std::chrono::duration<double>;

// The child doubles every tensor into fresh shared memory, so replies travel zero-copy too.
// An empty message asks for its counters instead.
ferry::Tensors child_work(const ferry::Tensors& in) {
  if (in.empty()) {
    const ferry::TransportStats s = ferry::transport_stats();
    auto t = ferry::empty_shared({4}, at::kLong);
    t[0] = static_cast<std::int64_t>(s.tensors_zero_copy);
    t[1] = static_cast<std::int64_t>(s.bytes_zero_copy);
    t[2] = static_cast<std::int64_t>(s.tensors_copied);
    t[3] = static_cast<std::int64_t>(s.bytes_copied);
    return {t};
  }
  // The transposed grid must arrive as the same strided view, not silently made contiguous.
  if (in.size() > 1 && (in[1].is_contiguous() || in[1].stride(0) != 1)) {
    throw std::runtime_error("the strided view arrived with strides " + c10::str(in[1].strides()));
  }
  ferry::Tensors out;
  for (const auto& t : in) {
    auto r = ferry::empty_shared(t.sizes(), t.options());
    at::mul_out(r, t, 2);
    out.push_back(r);
  }
  return out;
}

struct Row {
  const char* direction;
  std::uint64_t tensors_zc, bytes_zc, tensors_cp, bytes_cp;
};

void print_row(const Row& r) {
  const std::uint64_t total = r.bytes_zc + r.bytes_cp;
  std::printf(
      "  %-16s %8llu %12s %8llu %12s %7.1f%%\n", r.direction,
      static_cast<unsigned long long>(r.tensors_zc), ferry::format_bytes(r.bytes_zc).c_str(),
      static_cast<unsigned long long>(r.tensors_cp), ferry::format_bytes(r.bytes_cp).c_str(),
      total ? 100.0 * static_cast<double>(r.bytes_zc) / static_cast<double>(total) : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-demo: stream tensors between a parent and a child process"};
  int messages = 200;
  double megabytes = 4.0;
  int copy_every = 4;
  app.add_option("-n,--messages", messages, "messages each way")->check(CLI::Range(1, 1000000));
  app.add_option("-s,--size-mb", megabytes, "size of the large tensor in each message (MiB)")
      ->check(CLI::Range(0.001, 4096.0));
  app.add_option("--copy-every", copy_every,
                 "every Nth message is an ordinary tensor, copied on send (0: never)")
      ->check(CLI::Range(0, 1000000));
  CLI11_PARSE(app, argc, argv);

  try {
    auto to_child = ferry::TensorQueue::create({8});
    auto to_parent = ferry::TensorQueue::create({8});
    const pid_t parent = ::getpid();
    const pid_t child = ::fork();
    if (child < 0) throw ferry::Error(ferry::Errc::system, "fork failed");
    if (child == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ferry::serve(to_child, to_parent, child_work);
      ::_exit(0);
    }

    const auto elems = std::max<std::int64_t>(1, static_cast<std::int64_t>(megabytes * 262144.0));
    std::vector<double> round_trips;
    std::uint64_t bytes_each_way = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < messages; ++i) {
      // A large float tensor, a strided view and a small int tensor, to show layouts survive.
      const bool copy = copy_every > 0 && i % copy_every == copy_every - 1;
      at::Tensor big = copy ? at::empty({elems}) : ferry::empty_shared({elems}, at::kFloat);
      big.fill_(static_cast<float>(i));
      at::Tensor grid = ferry::empty_shared({64, 48}, at::kDouble).uniform_().t();
      at::Tensor ids = at::arange(i, i + 16, at::kInt);
      const auto t0 = std::chrono::steady_clock::now();
      to_child.send({big, grid, ids});
      ferry::Tensors reply = to_parent.recv(std::chrono::seconds(60));
      round_trips.push_back(Seconds(std::chrono::steady_clock::now() - t0).count());
      if (reply.size() != 3 || !reply[0].equal(big * 2) || !reply[1].equal(grid * 2) ||
          !reply[2].equal(ids * 2)) {
        std::fprintf(stderr, "ferry-demo: reply %d is wrong\n", i);
        ::kill(child, SIGKILL);
        return 1;
      }
      bytes_each_way += big.nbytes() + grid.nbytes() + ids.nbytes();
    }
    const double elapsed = Seconds(std::chrono::steady_clock::now() - start).count();

    to_child.send({});  // ask the child for its counters
    at::Tensor child_stats = to_parent.recv(std::chrono::seconds(60))[0];
    to_child.close();
    int status = 0;
    ::waitpid(child, &status, 0);

    const ferry::TransportStats s = ferry::transport_stats();
    std::sort(round_trips.begin(), round_trips.end());
    auto pct = [&](double p) {
      return round_trips[std::min(
          round_trips.size() - 1,
          static_cast<std::size_t>(p * static_cast<double>(round_trips.size())))];
    };
    std::printf("ferry demo: parent %d <-> child %d, %d messages each way (3 tensors each)\n",
                static_cast<int>(parent), static_cast<int>(child), messages);
    std::printf("  moved %s each way in %.2f s: %.2f GB/s each way, %.0f round trips/s\n",
                ferry::format_bytes(bytes_each_way).c_str(), elapsed,
                static_cast<double>(bytes_each_way) / elapsed / 1e9,
                static_cast<double>(messages) / elapsed);
    std::printf("  round trip (send, child doubles, reply): p50 %.0f us, p99 %.0f us\n",
                pct(0.50) * 1e6, pct(0.99) * 1e6);
    std::printf("  %-16s %8s %12s %8s %12s %8s\n", "direction", "shared", "bytes", "copied",
                "bytes", "zero-copy");
    print_row({"parent -> child", s.tensors_zero_copy, s.bytes_zero_copy, s.tensors_copied,
               s.bytes_copied});
    print_row({"child -> parent", static_cast<std::uint64_t>(child_stats[0].item<std::int64_t>()),
               static_cast<std::uint64_t>(child_stats[1].item<std::int64_t>()),
               static_cast<std::uint64_t>(child_stats[2].item<std::int64_t>()),
               static_cast<std::uint64_t>(child_stats[3].item<std::int64_t>())});
    std::printf("  copied on send: %llu ordinary tensors (every %dth message and the small ids)\n",
                static_cast<unsigned long long>(
                    s.copies_by_reason[static_cast<int>(ferry::CopyReason::not_shared)]),
                copy_every);
    const ferry::ArenaStats a = ferry::arena_stats();
    std::printf("  parent arena: %llu segment(s), %s reserved, %s in use after the run\n",
                static_cast<unsigned long long>(a.segments),
                ferry::format_bytes(a.bytes_reserved).c_str(),
                ferry::format_bytes(a.bytes_in_use).c_str());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "ferry-demo: the child did not exit cleanly (status %d)\n", status);
      return 1;
    }
    return 0;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
