// queue_soak: a TensorQueue stream between two forked processes, broken on purpose, many times.
//
//   queue_soak kills --iterations N   one of the pair is SIGKILLed at a random instant; the
//                                     survivor must see Errc::peer_dead within its timeout, and a
//                                     surviving sender must get every block and lease back
//   queue_soak fill --rounds N        the shm directory (FERRY_SHM_DIR, a small tmpfs) is filled
//                                     by another file mid-stream; the sender must get
//                                     Errc::shm_exhausted naming the sizes and the remedy, never
//                                     SIGBUS, and the receiver every message sent before it
//   queue_soak chaos --messages N     producers and consumers on shared queues, any of them
//                                     SIGKILLed at random (and replaced) --kills times; every
//                                     message sent and not taken by a consumer that died is
//                                     received exactly once, and nothing is left behind
//
// Prints one JSON document of outcome counts on stdout; exits 0 when every outcome is a pass.
// Every wait is bounded: a process that outlives its deadline is killed and counted as a hang.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
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
#include "ipc/stats.hpp"
#include "message_pattern.hpp"
#include "runtime/receive_witness.hpp"
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

// ---- chaos ---------------------------------------------------------------------------------

struct ChaosOptions {
  std::int64_t messages = 100000;
  int kills = 500;
  int producers = 4;
  int consumers = 3;
  int queues = 2;
  int kill_every_ms = 10;
  // Chance that a producer kills itself the instant a send returned, and that a consumer does
  // inside its pop (before the message leaves the queue), per message: the worst moments.
  double self_kill = 0.002;
  std::uint64_t seed = 1;
  int timeout_ms = 30000;
};

// What every process of the run writes and the harness reads, in one shared mapping made before
// the first fork: per message, whether its send returned and how often it was received; per
// consumer (each one started, a fresh index), the message it is taking now.
struct Board {
  std::atomic<std::int64_t> next_id;
  std::atomic<int> stop;     // producers send no more
  std::atomic<int> drained;  // every queue is closed and empty: producers check and leave
  std::atomic<std::int64_t> corrupt;
  std::atomic<std::int64_t> errors;
  std::atomic<std::int64_t> fds_left;  // producers: fds still open that they should have closed
  std::atomic<std::int64_t> leaks;     // producers: blocks or leases that never came back
  std::int64_t limit;                  // ids < limit
  std::int32_t max_consumers;
  std::atomic<std::uint8_t>* sent;
  std::atomic<std::uint32_t>* received;
  std::atomic<std::int64_t>* in_hand;  // consumer -> id + 1 of the message in its pop; 0 none
};

Board* g_board = nullptr;
int g_consumer = -1;  // this consumer's index
double g_self_kill = 0;
std::mt19937_64 g_rng;

template <typename T>
T* shared_array(std::size_t n) {
  void* p =
      ::mmap(nullptr, sizeof(T) * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap of the board failed");
  return static_cast<T*>(p);
}

int open_fd_count() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n - 1;  // the directory's own
}

// Inside the pop, before the message leaves the queue: which one this consumer is taking. Its
// header travels inside its first record.
void note_in_hand(const ferry::wire::Record* records, std::uint32_t count) noexcept {
  if (count == 0 || !(records[0].flags & ferry::wire::kFlagInline)) return;
  std::int64_t id;
  std::memcpy(&id, ferry::wire::inline_bytes(records[0]), sizeof id);
  g_board->in_hand[g_consumer].store(id + 1);
  if (std::uniform_real_distribution<double>(0, 1)(g_rng) < g_self_kill) ::raise(SIGKILL);
}

int chaos_producer(std::vector<TensorQueue> queues, std::uint64_t seed, const ChaosOptions& o) {
  Board& b = *g_board;
  std::mt19937_64 rng(seed);
  const Ms timeout(o.timeout_ms);
  // Each message is a header inside its record and one or two tensors: in the arena (zero-copy)
  // or copied on send, up to 64 KiB, so the custody holds blocks of both kinds.
  const ferry::soak::MessageShape shape{2, 1 << 16};
  for (;;) {
    if (b.stop.load()) break;
    const std::int64_t id = b.next_id.fetch_add(1);
    if (id >= b.limit) break;
    TensorQueue& q = queues[std::size_t(id) % queues.size()];
    try {
      q.send(ferry::soak::make_message(id, rng, shape), timeout);
    } catch (const ferry::Error& e) {
      if (e.code() == Errc::closed) break;
      std::fprintf(stderr, "queue_soak chaos: producer %d: %s\n", int(::getpid()), e.what());
      b.errors.fetch_add(1);
      return code_of(e);
    }
    b.sent[id].store(1);
    if (std::uniform_real_distribution<double>(0, 1)(rng) < o.self_kill) ::raise(SIGKILL);
  }
  // Until every queue is empty and closed: what it sent is all taken by then.
  const auto deadline = Clock::now() + 4 * timeout;
  while (!b.drained.load() && Clock::now() < deadline) std::this_thread::sleep_for(Ms(5));
  if (!b.drained.load()) return kHang;
  // Once its queues are dropped it holds its arena, ledger and server, and nothing it held for
  // the consumers (a dead one's pidfd goes with it): each queue's ring and socket close here.
  const int expected = open_fd_count() - 2 * int(queues.size());
  queues.clear();
  if (!blocks_come_back(timeout)) {
    b.leaks.fetch_add(1);
    return kLeak;
  }
  const auto until = Clock::now() + Ms(2000);
  int now = open_fd_count();
  while (now > expected && Clock::now() < until) {
    std::this_thread::sleep_for(Ms(10));
    now = open_fd_count();
  }
  if (now > expected) {
    std::fprintf(stderr, "queue_soak chaos: producer %d: %d fds open, %d expected\n",
                 int(::getpid()), now, expected);

    b.fds_left.fetch_add(now - expected);
    return kLeak;
  }
  return kPass;
}

int chaos_consumer(std::vector<TensorQueue> queues, int index, std::uint64_t seed,
                   const ChaosOptions& o) {
  Board& b = *g_board;
  g_consumer = index;
  g_self_kill = o.self_kill;
  g_rng.seed(seed);
  ferry::detail::set_receive_witness(&note_in_hand);
  std::mt19937_64 rng(seed ^ 0x5eed);
  // Some of what it receives it holds a while, so that a kill often finds it holding views.
  std::deque<Tensors> held;
  const std::size_t hold = rng() % 17;
  std::size_t open = queues.size();
  std::vector<bool> done(queues.size(), false);
  for (std::size_t turn = 0; open > 0; ++turn) {
    const std::size_t k = (std::size_t(index) + turn) % queues.size();
    if (done[k]) continue;
    Tensors m;
    try {
      m = queues[k].recv(Ms(20));
    } catch (const ferry::Error& e) {
      if (e.code() == Errc::timeout) continue;
      if (e.code() == Errc::closed) {
        done[k] = true;
        --open;
        continue;
      }
      std::fprintf(stderr, "queue_soak chaos: consumer %d: %s\n", int(::getpid()), e.what());
      b.errors.fetch_add(1);
      b.in_hand[index].store(0);
      continue;
    }
    const std::int64_t id = m.empty() || m[0].numel() < 1 ? -1 : m[0][0].item<std::int64_t>();
    if (id < 0 || id >= b.limit) {
      b.corrupt.fetch_add(1);
    } else {
      if (const std::string bad = ferry::soak::check_message(m, id); !bad.empty()) {
        std::fprintf(stderr, "queue_soak chaos: consumer %d: %s\n", int(::getpid()), bad.c_str());
        b.corrupt.fetch_add(1);
      }
      b.received[id].fetch_add(1);
    }
    b.in_hand[index].store(0);
    held.push_back(std::move(m));
    if (held.size() > hold) held.pop_front();
  }
  return kPass;
}

int run_chaos(const ChaosOptions& o) {
  const Ms timeout(o.timeout_ms);
  const int fds_before = open_fd_count();
  Board* b = shared_array<Board>(1);
  b->limit = o.messages;
  // Every kill may be a consumer's, and so may each self-kill (about messages x self_kill).
  b->max_consumers = o.consumers + o.kills + int(double(o.messages) * o.self_kill * 4) + 64;
  b->sent = shared_array<std::atomic<std::uint8_t>>(std::size_t(b->limit));
  b->received = shared_array<std::atomic<std::uint32_t>>(std::size_t(b->limit));
  b->in_hand = shared_array<std::atomic<std::int64_t>>(std::size_t(b->max_consumers));
  g_board = b;
  std::mt19937_64 rng(o.seed);
  std::vector<TensorQueue> queues;
  for (int i = 0; i < o.queues; ++i) {
    queues.push_back(TensorQueue::create({std::array<std::uint32_t, 3>{16, 64, 256}[rng() % 3]}));
    // The harness may push and pop (it never does): consumers wait for the producers it starts
    // instead of taking an instant with none alive for their end.
    queues.back().hold();
  }
  struct Child {
    bool producer;
    int consumer;  // its index among consumers started, or -1
  };
  std::map<pid_t, Child> live;
  int consumers_started = 0;
  const auto start = [&](bool producer) {
    const std::uint64_t seed = rng();
    // A child takes the queues it inherited out of the harness's vector, so that its own are
    // the only handles it has and dropping them closes their fds.
    if (producer) {
      live[fork_child([&] { return chaos_producer(std::move(queues), seed, o); })] = {true, -1};
    } else if (consumers_started < b->max_consumers) {
      const int index = consumers_started++;
      live[fork_child([&] { return chaos_consumer(std::move(queues), index, seed, o); })] = {false,
                                                                                             index};
    }
  };
  for (int i = 0; i < o.producers; ++i) start(true);
  for (int i = 0; i < o.consumers; ++i) start(false);
  std::vector<int> dead_consumers;
  std::map<std::string, int> kills;  // producer, consumer, producer_self, consumer_self
  std::map<std::string, int> exits;  // how the others ended
  int kills_total = 0;               // the harness's
  int self_kills = 0;
  const auto t0 = Clock::now();
  const auto give_up = t0 + std::chrono::seconds(3600);
  // Reaps whatever ended; a SIGKILL it gave itself is a kill too, replaced while the run goes on.
  const auto reap = [&](bool replace) {
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      const auto it = live.find(pid);
      if (it == live.end()) continue;
      const Child c = it->second;
      live.erase(it);
      if (c.consumer >= 0 && WIFSIGNALED(status)) dead_consumers.push_back(c.consumer);
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
        ++kills[std::string(c.producer ? "producer" : "consumer") + "_self"];
        ++self_kills;
      } else {
        ++exits[std::string(c.producer ? "producer:" : "consumer:") + outcome_name(status)];
      }
      if (replace) start(c.producer);
    }
  };
  // The kills are spread over the run: kill i comes once i / kills of the messages are handed
  // out, at least kill_every_ms after the last, at a random instant within that pace.
  auto next_kill = Clock::now();
  while (Clock::now() < give_up && (kills_total < o.kills || b->next_id.load() < b->limit)) {
    reap(true);
    const std::int64_t due = std::int64_t(kills_total) * b->limit / std::max(1, o.kills);
    if (kills_total < o.kills && b->next_id.load() >= due && Clock::now() >= next_kill &&
        !live.empty()) {
      auto it = live.begin();
      std::advance(it, std::ptrdiff_t(rng() % live.size()));
      const pid_t victim = it->first;
      const Child c = it->second;
      ::kill(victim, SIGKILL);
      int status = 0;
      ::waitpid(victim, &status, 0);
      live.erase(victim);
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
        ++kills[c.producer ? "producer" : "consumer"];
        ++kills_total;
      } else {
        ++exits[std::string(c.producer ? "producer:" : "consumer:") + outcome_name(status)];
      }
      if (c.consumer >= 0) dead_consumers.push_back(c.consumer);
      start(c.producer);
      next_kill = Clock::now() + Ms(o.kill_every_ms) +
                  std::chrono::microseconds(rng() % (std::uint64_t(o.kill_every_ms) * 1000 + 1));
    }
    std::this_thread::sleep_for(Ms(1));
  }
  b->stop.store(1);
  // Drain: the consumers take everything; a producer inside a send when told to stop finishes it
  // (or is refused once the queues close). Empty for half a second: nothing more is coming.
  const auto drain_by = Clock::now() + 4 * timeout;
  auto empty_since = Clock::now();
  while (Clock::now() < drain_by) {
    reap(true);
    bool empty = true;
    for (auto& q : queues) empty = empty && q.messages() == 0;
    if (!empty) empty_since = Clock::now();
    if (Clock::now() - empty_since > Ms(500)) break;
    std::this_thread::sleep_for(Ms(5));
  }
  const double run_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& q : queues) q.close();
  // Consumers leave on the closed, empty queues; then producers check and leave.
  const auto consumers_by = Clock::now() + timeout;
  for (;;) {
    reap(false);
    bool any = false;
    for (const auto& [pid, c] : live) any = any || !c.producer;
    if (!any || Clock::now() > consumers_by) break;
    std::this_thread::sleep_for(Ms(5));
  }
  b->drained.store(1);
  const auto all_by = Clock::now() + 2 * timeout;
  while (!live.empty() && Clock::now() < all_by) {
    reap(false);
    std::this_thread::sleep_for(Ms(5));
  }
  int hung = 0;
  for (const auto& [pid, c] : live) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ++hung;
  }
  queues.clear();
  // The harness never sent: once its queues are dropped, it holds what it held before.
  int fds_after = open_fd_count();
  for (int i = 0; i < 200 && fds_after > fds_before; ++i) {
    std::this_thread::sleep_for(Ms(10));
    fds_after = open_fd_count();
  }
  // The books.
  std::int64_t sent = 0, received = 0, duplicated = 0, unnoted = 0, lost = 0, taken_by_dead = 0;
  std::vector<std::int64_t> lost_ids;
  std::vector<bool> dead_holds(std::size_t(b->limit), false);
  for (int c : dead_consumers) {
    const std::int64_t v = b->in_hand[c].load();
    if (v > 0 && v - 1 < b->limit) dead_holds[std::size_t(v - 1)] = true;
  }
  for (std::int64_t id = 0; id < b->limit; ++id) {
    const bool s = b->sent[id].load() != 0;
    const std::uint32_t r = b->received[id].load();
    sent += s;
    received += r >= 1;
    duplicated += r >= 2;
    if (!s && r >= 1) ++unnoted;  // delivered; its producer died before noting the send
    if (s && r == 0) {
      if (dead_holds[std::size_t(id)]) {
        ++taken_by_dead;
      } else {
        ++lost;
        if (lost_ids.size() < 10) lost_ids.push_back(id);
      }
    }
  }
  const std::int64_t producer_leaks = b->leaks.load(), fds_left_producers = b->fds_left.load();
  const int fds_left_harness = std::max(0, fds_after - fds_before);
  int bad_exits = 0;
  for (const auto& [how, n] : exits) {
    if (how.size() < 5 || how.compare(how.size() - 5, 5, ":pass") != 0) bad_exits += n;
  }
  const bool passed = lost == 0 && duplicated == 0 && b->corrupt.load() == 0 &&
                      b->errors.load() == 0 && hung == 0 && bad_exits == 0 && producer_leaks == 0 &&
                      fds_left_producers == 0 && fds_left_harness == 0 && kills_total >= o.kills;
  const nlohmann::json j = {{"messages", o.messages},
                            {"producers", o.producers},
                            {"consumers", o.consumers},
                            {"queues", o.queues},
                            {"seed", o.seed},
                            {"kills", kills_total},
                            {"self_kills", self_kills},
                            {"kills_by_kind", kills},
                            {"other_exits", exits},
                            {"sent", sent},
                            {"received", received},
                            {"delivered_unnoted", unnoted},
                            {"taken_by_dead_consumers", taken_by_dead},
                            {"lost", lost},
                            {"lost_ids", lost_ids},
                            {"duplicated", duplicated},
                            {"corrupt", b->corrupt.load()},
                            {"errors", b->errors.load()},
                            {"hung", hung},
                            {"producer_leaks", producer_leaks},
                            {"fds_left_producers", fds_left_producers},
                            {"fds_left_harness", fds_left_harness},
                            {"seconds", run_seconds},
                            {"passed", passed}};
  std::printf("%s\n", j.dump().c_str());
  return passed ? 0 : 1;
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
  ChaosOptions c;
  auto* chaos = app.add_subcommand("chaos", "producers and consumers SIGKILLed at random");
  chaos->add_option("--messages", c.messages, "messages sent in all");
  chaos->add_option("--kills", c.kills, "SIGKILLs the harness lands (self-kills come on top)");
  chaos->add_option("--producers", c.producers, "producers alive at once");
  chaos->add_option("--consumers", c.consumers, "consumers alive at once");
  chaos->add_option("--queues", c.queues, "queues they share");
  chaos->add_option("--kill-every-ms", c.kill_every_ms, "the pace of the kills");
  chaos->add_option("--self-kill", c.self_kill,
                    "chance per message that a producer dies right after its send, a consumer "
                    "inside its pop");
  chaos->add_option("--seed", c.seed, "makes a run repeatable (up to the scheduler)");
  chaos->add_option("--timeout-ms", c.timeout_ms, "every wait's bound");
  CLI11_PARSE(app, argc, argv);
  try {
    if (chaos->parsed()) return run_chaos(c);
    return kills->parsed() ? run_kills(k) : run_fill(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "queue_soak: %s\n", e.what());
    return 2;
  }
}
