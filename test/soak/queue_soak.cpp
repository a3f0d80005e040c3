// queue_soak: a TensorQueue stream between two forked processes, broken on purpose, many times.
//
//   queue_soak kills --iterations N   one of the pair is SIGKILLed at a random instant; the
//                                     survivor must see Errc::peer_dead within its timeout, and a
//                                     surviving sender must get every block and lease back
//   queue_soak fill --rounds N        the shm directory (FERRY_SHM_DIR, a small tmpfs) is filled
//                                     by another file mid-stream; the sender must get
//                                     Errc::shm_exhausted naming the sizes and the remedy, never
//                                     SIGBUS, and the receiver every message sent before it
//
// Prints one JSON document of outcome counts on stdout; exits 0 when every outcome is a pass.
// Every wait is bounded: a process that outlives its deadline is killed and counted as a hang.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../fill_filesystem.hpp"
#include "ipc/error.hpp"
#include "message_pattern.hpp"
#include "runtime/shared_tensor.hpp"
#include "runtime/tensor_queue.hpp"

namespace {

using ferry::Errc;
using ferry::TensorQueue;
using ferry::Tensors;
using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// How a child of the pair ended, as its exit code.
enum Code : int {
  kPass = 0,      // saw what it had to (peer_dead, or shm_exhausted with a clear message)
  kHang = 20,     // its own bounded wait ran out (Errc::timeout)
  kError = 21,    // another ferry::Error, or the right code with an unclear message
  kCorrupt = 22,  // a message did not hold what was sent
  kLeak = 23,     // a surviving sender's blocks or leases did not come back
  kNoError = 24,  // the shm never filled up for the sender
  kThrown = 25,   // anything else thrown
};

std::string outcome_name(int status) {
  if (WIFSIGNALED(status)) return std::string("crash:") + ::sigabbrev_np(WTERMSIG(status));
  switch (WEXITSTATUS(status)) {
    case kPass:
      return "pass";
    case kHang:
      return "hang";
    case kError:
      return "wrong_error";
    case kCorrupt:
      return "corrupt";
    case kLeak:
      return "leak";
    case kNoError:
      return "no_error";
    default:
      return "exit:" + std::to_string(WEXITSTATUS(status));
  }
}

void write_all(int fd, const void* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p = static_cast<const char*>(p) + w;
    n -= static_cast<std::size_t>(w);
  }
}

// Forks a child that dies with this process and exits with what `fn` returns.
pid_t fork_child(const std::function<int()>& fn) {
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(kThrown);
  at::set_num_threads(1);
  int code = kThrown;
  try {
    code = fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "queue_soak: child %d: %s\n", int(::getpid()), e.what());
  }
  std::fflush(nullptr);
  ::_exit(code);
}

// Waits for `pid` until `deadline`; kills it past that. Returns its wait status, and whether it
// had to be killed.
std::pair<int, bool> wait_until(pid_t pid, Clock::time_point deadline) {
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return {status, false};
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return {status, true};
    }
    std::this_thread::sleep_for(Ms(1));
  }
}

// Reads `n` bytes from `fd` before `deadline`; false if they did not come.
bool read_bytes(int fd, char* out, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t r = ::read(fd, out, n);
    if (r <= 0) return false;
    out += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

int code_of(const ferry::Error& e) {
  return e.code() == Errc::timeout ? kHang : kError;
}

// Polls arena_stats() (which reclaims the leases of dead holders) until nothing is in use.
bool blocks_come_back(Ms timeout) {
  const auto deadline = Clock::now() + timeout;
  ferry::ArenaStats s = ferry::arena_stats();
  while ((s.blocks_in_use != 0 || s.leases_outstanding != 0) && Clock::now() < deadline) {
    std::this_thread::sleep_for(Ms(5));
    s = ferry::arena_stats();
  }
  if (s.blocks_in_use == 0 && s.leases_outstanding == 0) return true;
  std::fprintf(stderr,
               "queue_soak: sender %d: %llu blocks (%llu bytes) and %llu leases still out %lld "
               "ms after its receiver died\n",
               int(::getpid()), (unsigned long long)s.blocks_in_use,
               (unsigned long long)s.bytes_in_use, (unsigned long long)s.leases_outstanding,
               (long long)timeout.count());
  return false;
}

// ---- kills ---------------------------------------------------------------------------------

struct KillOptions {
  int iterations = 1000;
  std::uint64_t seed = 1;
  int max_delay_ms = 30;
  int timeout_ms = 5000;
};

// Sends until the receiver is gone, then takes back what it left: the messages still queued,
// and the leases it held when it died.
int sender(TensorQueue& q, std::uint64_t seed, int ready_fd, int result_fd, Ms timeout) {
  std::mt19937_64 rng(seed);
  std::int64_t seq = 0;
  for (;; ++seq) {
    try {
      q.send(ferry::soak::make_message(seq, rng, {}), timeout);
    } catch (const ferry::Error& e) {
      if (e.code() != Errc::peer_dead) {
        std::fprintf(stderr, "queue_soak: sender: %s\n", e.what());
        return code_of(e);
      }
      break;
    }
    if (seq == 0) write_all(ready_fd, "s", 1);
  }
  write_all(result_fd, &seq, sizeof seq);
  q.close();
  for (;;) {  // what no receiver will take, taken here so its leases end
    try {
      q.recv(Ms(0));
    } catch (const ferry::Error&) {
      if (q.size() == 0) break;
    }
  }
  return blocks_come_back(timeout) ? kPass : kLeak;
}

// Receives and checks every message until the sender is gone; keeps some of them, and checks
// those again once the sender is dead (their memory must outlive it).
int receiver(TensorQueue& q, int ready_fd, int result_fd, Ms timeout) {
  std::deque<std::pair<std::int64_t, Tensors>> kept;
  std::int64_t seq = 0;
  for (;; ++seq) {
    Tensors m;
    try {
      m = q.recv(timeout);
    } catch (const ferry::Error& e) {
      if (e.code() != Errc::peer_dead) {
        std::fprintf(stderr, "queue_soak: receiver: %s\n", e.what());
        return code_of(e);
      }
      break;
    }
    if (const std::string bad = ferry::soak::check_message(m, seq); !bad.empty()) {
      std::fprintf(stderr, "queue_soak: receiver: %s\n", bad.c_str());
      return kCorrupt;
    }
    if (seq == 0) write_all(ready_fd, "r", 1);
    if (seq % 8 == 0) kept.emplace_back(seq, std::move(m));
    if (kept.size() > 32) kept.pop_front();
  }
  for (const auto& [s, m] : kept) {
    if (const std::string bad = ferry::soak::check_message(m, s); !bad.empty()) {
      std::fprintf(stderr, "queue_soak: receiver, after its sender died: %s\n", bad.c_str());
      return kCorrupt;
    }
  }
  write_all(result_fd, &seq, sizeof seq);
  return kPass;
}

int run_kills(const KillOptions& o) {
  std::map<std::string, std::map<std::string, int>> outcomes;  // victim -> outcome -> count
  std::vector<double> detect_ms;
  std::int64_t sent = 0, received = 0;
  int failures = 0;
  const Ms timeout(o.timeout_ms);
  for (int i = 0; i < o.iterations; ++i) {
    std::mt19937_64 rng(o.seed * 1000003 + std::uint64_t(i));
    const bool kill_sender = rng() % 2 == 0;
    const auto delay =
        std::chrono::microseconds(rng() % (std::uint64_t(o.max_delay_ms) * 1000 + 1));
    const std::uint32_t capacity = std::array<std::uint32_t, 3>{4, 16, 64}[rng() % 3];
    auto q = TensorQueue::create({capacity});
    int ready[2], result[2];
    if (::pipe(ready) != 0 || ::pipe(result) != 0) throw std::runtime_error("pipe failed");
    const std::uint64_t stream_seed = rng();
    const pid_t rx = fork_child([&] {
      ::close(ready[0]);
      ::close(result[0]);
      return receiver(q, ready[1], result[1], timeout);
    });
    const pid_t tx = fork_child([&] {
      ::close(ready[0]);
      ::close(result[0]);
      return sender(q, stream_seed, ready[1], result[1], timeout);
    });
    ::close(ready[1]);
    ::close(result[1]);
    const pid_t victim = kill_sender ? tx : rx, survivor = kill_sender ? rx : tx;
    std::string outcome;
    char both[2];
    // Both have done their first operation, so each is registered where the other looks.
    if (!read_bytes(ready[0], both, 2, Clock::now() + Ms(30000))) {
      ::kill(tx, SIGKILL);
      ::kill(rx, SIGKILL);
      outcome = "no_start";
    } else {
      std::this_thread::sleep_for(delay);
    }
    ::kill(victim, SIGKILL);
    const auto killed_at = Clock::now();
    const auto [vstatus, vhung] = wait_until(victim, killed_at + Ms(10000));
    if (outcome.empty() && !(WIFSIGNALED(vstatus) && WTERMSIG(vstatus) == SIGKILL)) {
      outcome = "victim_ended_first:" + outcome_name(vstatus);  // it died before the kill
    }
    const auto [status, hung] = wait_until(survivor, killed_at + timeout + Ms(3000));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count();
    if (outcome.empty()) outcome = hung ? "hang" : outcome_name(status);
    std::int64_t count = 0;
    if (outcome == "pass" && read_bytes(result[0], reinterpret_cast<char*>(&count), sizeof count,
                                        Clock::now() + Ms(1000))) {
      (kill_sender ? received : sent) += count;
      detect_ms.push_back(ms);
    }
    ::close(ready[0]);
    ::close(result[0]);
    if (outcome != "pass") {
      ++failures;
      std::fprintf(stderr, "queue_soak: iteration %d (killed the %s after %lld us): %s\n", i,
                   kill_sender ? "sender" : "receiver", (long long)delay.count(), outcome.c_str());
    }
    ++outcomes[kill_sender ? "sender_killed" : "receiver_killed"][outcome];
  }
  const nlohmann::json j = {{"iterations", o.iterations},
                            {"seed", o.seed},
                            {"max_delay_ms", o.max_delay_ms},
                            {"timeout_ms", o.timeout_ms},
                            {"outcomes", outcomes},
                            {"failures", failures},
                            {"messages_verified_by_surviving_receivers", received},
                            {"messages_sent_by_surviving_senders", sent},
                            // From the kill until the survivor, having seen peer_dead and
                            // checked what it holds, exited; one entry per passing iteration.
                            {"survivor_done_ms_after_kill", detect_ms}};
  std::printf("%s\n", j.dump().c_str());
  return failures == 0 ? 0 : 1;
}

// ---- fill ----------------------------------------------------------------------------------

struct FillOptions {
  int rounds = 5;
  std::uint64_t seed = 1;
  int timeout_ms = 10000;
};

// Sends until the shm is full; the error must name the sizes and the remedy.
int fill_sender(TensorQueue& q, std::uint64_t seed, int result_fd, Ms timeout) {
  std::mt19937_64 rng(seed);
  std::int64_t seq = 0;
  int code = kNoError;
  for (; seq < 100000; ++seq) {
    try {
      q.send(ferry::soak::make_message(seq, rng, {2, 1 << 18}), timeout);
    } catch (const ferry::Error& e) {
      const std::string w = e.what();
      const bool clear = w.find("bytes") != std::string::npos &&
                         w.find("free of") != std::string::npos &&
                         w.find("Remedy") != std::string::npos;
      std::fprintf(stderr, "queue_soak: sender stopped after %lld messages: %s\n", (long long)seq,
                   w.c_str());
      code = e.code() == Errc::shm_exhausted && clear ? kPass : code_of(e);
      break;
    }
  }
  write_all(result_fd, &seq, sizeof seq);
  // Everything sent must reach the receiver before this process (its memory) goes.
  if (ferry::flush(timeout) != 0) return kHang;
  return code;
}

// Receives, checks and keeps everything (so the sender's arena has to grow) until the sender
// is gone; then checks it all again. `progress_fd` gets a byte per message.
int fill_receiver(TensorQueue& q, int progress_fd, int result_fd, Ms timeout) {
  std::vector<Tensors> kept;
  std::int64_t seq = 0;
  for (;; ++seq) {
    Tensors m;
    try {
      m = q.recv(timeout);
    } catch (const ferry::Error& e) {
      if (e.code() == Errc::peer_dead) break;
      std::fprintf(stderr, "queue_soak: receiver: %s\n", e.what());
      return code_of(e);
    }
    if (const std::string bad = ferry::soak::check_message(m, seq); !bad.empty()) {
      std::fprintf(stderr, "queue_soak: receiver: %s\n", bad.c_str());
      return kCorrupt;
    }
    kept.push_back(std::move(m));
    write_all(progress_fd, "m", 1);
  }
  for (std::size_t s = 0; s < kept.size(); ++s) {
    if (const std::string bad = ferry::soak::check_message(kept[s], std::int64_t(s));
        !bad.empty()) {
      std::fprintf(stderr, "queue_soak: receiver, at the end: %s\n", bad.c_str());
      return kCorrupt;
    }
  }
  write_all(result_fd, &seq, sizeof seq);
  return kPass;
}

int run_fill(const FillOptions& o) {
  const char* env = std::getenv("FERRY_SHM_DIR");
  if (!env || !*env) {
    std::fprintf(stderr, "queue_soak fill: set FERRY_SHM_DIR to a small tmpfs of its own\n");
    return 2;
  }
  const std::string dir = env;
  std::map<std::string, int> outcomes;
  std::int64_t sent_total = 0, received_total = 0;
  int failures = 0;
  const Ms timeout(o.timeout_ms);
  for (int r = 0; r < o.rounds; ++r) {
    std::mt19937_64 rng(o.seed * 1000003 + std::uint64_t(r));
    const std::uint64_t stream_seed = rng();
    const int fill_after = 1 + int(rng() % 16);  // messages received before the shm fills
    auto q = TensorQueue::create({8});
    int progress[2], sent_pipe[2], got_pipe[2];
    if (::pipe(progress) != 0 || ::pipe(sent_pipe) != 0 || ::pipe(got_pipe) != 0) {
      throw std::runtime_error("pipe failed");
    }
    const pid_t rx = fork_child([&] {
      ::close(progress[0]);
      return fill_receiver(q, progress[1], got_pipe[1], timeout);
    });
    const pid_t tx = fork_child([&] { return fill_sender(q, stream_seed, sent_pipe[1], timeout); });
    for (int* p : {progress, sent_pipe, got_pipe}) ::close(p[1]);
    std::vector<char> seen(std::size_t(fill_after), 0);
    const bool started = read_bytes(progress[0], seen.data(), seen.size(), Clock::now() + timeout);
    const std::string filler = ferry::test::fill_filesystem(dir, "soak-filler");
    // The receiver must not block on its progress pipe while the sender drains into it.
    std::thread drain([fd = progress[0]] {
      char buf[4096];
      while (::read(fd, buf, sizeof buf) > 0) {
      }
    });
    const auto deadline = Clock::now() + 3 * timeout;
    const auto [tstatus, thung] = wait_until(tx, deadline);
    const auto [rstatus, rhung] = wait_until(rx, deadline);
    drain.join();
    ::unlink(filler.c_str());
    std::int64_t sent = -1, got = -1;
    read_bytes(sent_pipe[0], reinterpret_cast<char*>(&sent), sizeof sent, Clock::now() + Ms(100));
    read_bytes(got_pipe[0], reinterpret_cast<char*>(&got), sizeof got, Clock::now() + Ms(100));
    for (int fd : {progress[0], sent_pipe[0], got_pipe[0]}) ::close(fd);
    std::string outcome;
    if (!started) {
      outcome = "no_start";
    } else if (thung || rhung) {
      outcome = "hang";
    } else if (outcome_name(tstatus) != "pass") {
      outcome = "sender:" + outcome_name(tstatus);
    } else if (outcome_name(rstatus) != "pass") {
      outcome = "receiver:" + outcome_name(rstatus);
    } else if (sent != got) {
      outcome = "lost";  // sent successfully, never received
    } else {
      outcome = "pass";
      sent_total += sent;
      received_total += got;
    }
    if (outcome != "pass") {
      ++failures;
      std::fprintf(stderr, "queue_soak fill: round %d: %s (sent %lld, received %lld)\n", r,
                   outcome.c_str(), (long long)sent, (long long)got);
    }
    ++outcomes[outcome];
  }
  const nlohmann::json j = {{"rounds", o.rounds},          {"seed", o.seed},
                            {"outcomes", outcomes},        {"failures", failures},
                            {"messages_sent", sent_total}, {"messages_received", received_total}};
  std::printf("%s\n", j.dump().c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"queue_soak: break TensorQueue streams on purpose and count the outcomes"};
  app.require_subcommand(1);
  KillOptions k;
  auto* kills = app.add_subcommand("kills", "SIGKILL the sender or the receiver at random");
  kills->add_option("--iterations", k.iterations, "pairs to start and break");
  kills->add_option("--seed", k.seed, "makes a run repeatable (up to the scheduler)");
  kills->add_option("--max-delay-ms", k.max_delay_ms,
                    "the kill lands up to this long after the "
                    "pair's first message");
  kills->add_option("--timeout-ms", k.timeout_ms, "every wait's bound");
  FillOptions f;
  auto* fill = app.add_subcommand("fill", "fill FERRY_SHM_DIR mid-stream");
  fill->add_option("--rounds", f.rounds, "streams to start and starve");
  fill->add_option("--seed", f.seed, "makes a run repeatable (up to the scheduler)");
  fill->add_option("--timeout-ms", f.timeout_ms, "every wait's bound");
  CLI11_PARSE(app, argc, argv);
  try {
    return kills->parsed() ? run_kills(k) : run_fill(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "queue_soak: %s\n", e.what());
    return 2;
  }
}
