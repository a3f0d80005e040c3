// Channel tests with real processes: every peer is a fork()ed child sharing the segment, and the
// crash tests SIGKILL them at random instants, including inside the ring's critical section.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "../catch.hpp"

#include "ipc/channel.hpp"
#include "ipc/error.hpp"
#include "ipc/segment.hpp"

using namespace std::chrono_literals;
using ferry::Channel;
using ferry::Errc;

namespace {

// The head of every record: identity of its message, its place in it, and a checksum of both.
// The rest of a record (channels with records larger than Rec) is filled with words derived
// from the same identity, so a torn, mixed or partial message is caught by whoever pops it.
struct Rec {
  std::uint64_t msg;
  std::uint32_t index;
  std::uint32_t count;
  std::uint64_t payload;
  std::uint64_t sum;
};
static_assert(sizeof(Rec) == 32);

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

std::uint64_t checksum(const Rec& r) {
  return mix(r.msg ^ mix(r.index + (std::uint64_t{r.count} << 32)) ^ mix(r.payload + 1));
}

constexpr std::uint64_t kFillStep = 0x9e3779b97f4a7c15ull;

std::vector<std::byte> make_message(std::uint64_t msg, std::uint32_t count,
                                    std::uint32_t record_size = sizeof(Rec)) {
  std::vector<std::byte> data(std::size_t{count} * record_size);
  const std::size_t words = (record_size - sizeof(Rec)) / 8;
  std::vector<std::uint64_t> fill(words);
  for (std::uint32_t i = 0; i < count; ++i) {
    Rec r{msg, i, count, mix(msg * 31 + i), 0};
    r.sum = checksum(r);
    std::byte* at = data.data() + std::size_t{i} * record_size;
    std::memcpy(at, &r, sizeof r);
    for (std::size_t k = 0; k < words; ++k) fill[k] = r.payload + k * kFillStep;
    if (words != 0) std::memcpy(at + sizeof r, fill.data(), words * 8);
  }
  return data;
}

// True when `count` records form exactly one whole, intact message; its id goes to *msg.
bool valid_message(const std::vector<std::byte>& data, std::uint32_t count, std::uint64_t* msg,
                   std::uint32_t record_size = sizeof(Rec)) {
  if (count == 0 || data.size() != std::size_t{count} * record_size) return false;
  const std::size_t words = (record_size - sizeof(Rec)) / 8;
  std::vector<std::uint64_t> fill(words);
  Rec first{};
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::byte* at = data.data() + std::size_t{i} * record_size;
    Rec r;
    std::memcpy(&r, at, sizeof r);
    if (i == 0) first = r;
    if (r.sum != checksum(r) || r.index != i || r.count != count || r.msg != first.msg ||
        r.payload != mix(r.msg * 31 + i)) {
      return false;
    }
    if (words != 0) std::memcpy(fill.data(), at + sizeof r, words * 8);
    for (std::size_t k = 0; k < words; ++k) {
      if (fill[k] != r.payload + k * kFillStep) return false;
    }
  }
  *msg = first.msg;
  return true;
}

std::shared_ptr<Channel> make_channel(std::uint32_t capacity,
                                      std::uint32_t record_size = sizeof(Rec)) {
  return Channel::create({capacity, record_size});
}

std::uint64_t push_message(Channel& ch, std::uint64_t msg, std::uint32_t count,
                           std::chrono::milliseconds timeout = 5s) {
  auto data = make_message(msg, count, ch.record_size());
  return ch.push(data.data(), count, timeout);
}

// Pops one message and checks it is whole; returns its id.
std::uint64_t pop_message(Channel& ch, std::uint32_t* count_out = nullptr,
                          std::chrono::milliseconds timeout = 5s) {
  std::vector<std::byte> out;
  std::uint32_t count = ch.pop(out, timeout);
  std::uint64_t msg = 0;
  INFO("popped " << count << " records");
  REQUIRE(valid_message(out, count, &msg, ch.record_size()));
  if (count_out) *count_out = count;
  return msg;
}

template <class F>
Errc error_code(F&& f) {
  try {
    f();
  } catch (const ferry::Error& e) {
    return e.code();
  }
  FAIL("expected a ferry::Error");
  return Errc::system;
}

// The children of one test: killed and reaped on the way out whatever happens, so a failing
// test never leaves a process behind.
class Children {
 public:
  ~Children() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  // Runs `body` in a child, which exits with its return value (99 on an exception). _exit keeps
  // the child from running the parent's atexit handlers and flushing its stdio buffers.
  pid_t spawn(const std::function<int()>& body) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 99;
      try {
        rc = body();
      } catch (...) {
      }
      ::_exit(rc);
    }
    pids_.push_back(pid);
    return pid;
  }

  // Reaps `pid`, killing it and failing if it has not exited within `limit`.
  int wait(pid_t pid, std::chrono::milliseconds limit = 10s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    int status = 0;
    for (;;) {
      pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      REQUIRE(r == 0);
      if (std::chrono::steady_clock::now() > end) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        forget(pid);
        FAIL("child " << pid << " did not exit within " << limit.count() << " ms");
      }
      std::this_thread::sleep_for(1ms);
    }
    forget(pid);
    return status;
  }

  // Reaps `pid` and requires that it exited with status 0.
  void expect_success(pid_t pid, std::chrono::milliseconds limit = 10s) {
    int status = wait(pid, limit);
    INFO("child " << pid << " status " << status);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }

  void kill_and_reap(pid_t pid) {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    forget(pid);
    // A child may also have exited on its own (0) or reported corruption (nonzero exit).
    INFO("child " << pid << " status " << status);
    REQUIRE(((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
             (WIFEXITED(status) && WEXITSTATUS(status) == 0)));
  }

  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  void forget(pid_t pid) {
    for (auto it = pids_.begin(); it != pids_.end(); ++it) {
      if (*it == pid) {
        pids_.erase(it);
        return;
      }
    }
  }
  std::vector<pid_t> pids_;
};

// A pipe a child writes one byte to once it is in position.
struct ReadyPipe {
  int fds[2] = {-1, -1};
  ReadyPipe() { REQUIRE(::pipe(fds) == 0); }
  ~ReadyPipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  void signal() const {
    char c = 1;
    (void)!::write(fds[1], &c, 1);
  }
  void wait() const {
    char c = 0;
    REQUIRE(::read(fds[0], &c, 1) == 1);
  }
};

// Kills the test (rather than letting it hang) if a kForever wait never returns.
struct Watchdog {
  explicit Watchdog(unsigned seconds) { ::alarm(seconds); }
  ~Watchdog() { ::alarm(0); }
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("channel keeps FIFO order, whole messages and its capacity in one process", "[channel]") {
  auto ch = make_channel(8);
  REQUIRE(ch->capacity() == 8);
  REQUIRE(ch->record_size() == sizeof(Rec));
  REQUIRE(ch->size() == 0);
  REQUIRE_FALSE(ch->closed());

  SECTION("messages of several records come out whole and in order") {
    REQUIRE(push_message(*ch, 100, 1) == 0);
    REQUIRE(push_message(*ch, 101, 2) == 1);
    REQUIRE(push_message(*ch, 102, 3) == 3);
    REQUIRE(ch->size() == 6);
    REQUIRE_FALSE(ch->consumed(0));
    std::uint32_t count = 0;
    REQUIRE(pop_message(*ch, &count) == 100);
    REQUIRE(count == 1);
    REQUIRE(ch->consumed(0));
    REQUIRE_FALSE(ch->consumed(1));
    REQUIRE(pop_message(*ch, &count) == 101);
    REQUIRE(count == 2);
    REQUIRE(pop_message(*ch, &count) == 102);
    REQUIRE(count == 3);
    REQUIRE(ch->consumed(3));
    REQUIRE(ch->size() == 0);
  }

  SECTION("messages stay whole when they wrap around the end of the ring") {
    std::uint64_t next_pop = 0;
    for (std::uint64_t m = 0; m < 200; ++m) {
      push_message(*ch, m, 1 + m % 3);
      if (ch->size() >= 5) {
        std::uint32_t count = 0;
        REQUIRE(pop_message(*ch, &count) == next_pop);
        REQUIRE(count == 1 + next_pop % 3);
        ++next_pop;
      }
    }
    while (ch->size() > 0) REQUIRE(pop_message(*ch) == next_pop++);
    REQUIRE(next_pop == 200);
  }

  SECTION("a full ring times out a push; an empty one times out a pop") {
    push_message(*ch, 1, 3);
    push_message(*ch, 2, 3);
    push_message(*ch, 3, 2);
    REQUIRE(ch->size() == 8);
    REQUIRE(error_code([&] { push_message(*ch, 4, 1, 20ms); }) == Errc::timeout);
    REQUIRE(error_code([&] { push_message(*ch, 4, 1, 0ms); }) == Errc::timeout);
    try {
      push_message(*ch, 4, 1, 10ms);
    } catch (const ferry::Error& e) {
      REQUIRE_THAT(e.what(), Catch::Contains("capacity 8") && Catch::Contains("10 ms"));
    }
    REQUIRE(pop_message(*ch) == 1);
    // Three records free now: room for a message of 3 but not of 4.
    REQUIRE(error_code([&] { push_message(*ch, 5, 4, 10ms); }) == Errc::timeout);
    push_message(*ch, 5, 3);
    REQUIRE(pop_message(*ch) == 2);
    REQUIRE(pop_message(*ch) == 3);
    REQUIRE(pop_message(*ch) == 5);
    std::vector<std::byte> out;
    REQUIRE(error_code([&] { ch->pop(out, 0ms); }) == Errc::timeout);
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(error_code([&] { ch->pop(out, 30ms); }) == Errc::timeout);
    REQUIRE(seconds_since(t0) >= 0.025);
  }

  SECTION("counts of 0 or beyond capacity are rejected") {
    auto recs = make_message(1, 9);
    REQUIRE(error_code([&] { ch->push(recs.data(), 0, 10ms); }) == Errc::invalid_argument);
    REQUIRE(error_code([&] { ch->push(recs.data(), 9, 10ms); }) == Errc::invalid_argument);
    try {
      ch->push(recs.data(), 9, 10ms);
    } catch (const ferry::Error& e) {
      REQUIRE_THAT(e.what(), Catch::Contains("9") && Catch::Contains("8"));
    }
    REQUIRE(ch->push(recs.data(), 8, 10ms) == 0);  // exactly capacity is fine
  }

  SECTION("a claim sees the message before it leaves; a throwing claim leaves it queued") {
    const std::uint64_t seq0 = push_message(*ch, 7, 2);
    const std::uint64_t seq1 = push_message(*ch, 8, 1);
    std::vector<std::byte> out;
    REQUIRE_THROWS_AS(ch->pop(out, 1s,
                              [](const std::byte*, std::uint32_t, std::uint64_t) {
                                throw std::runtime_error("lease table full");
                              }),
                      std::runtime_error);
    REQUIRE(ch->size() == 3);
    REQUIRE_FALSE(ch->consumed(seq0));
    std::uint64_t claimed_seq = 99;
    std::uint32_t claimed_count = 0;
    bool consumed_during_claim = true;
    REQUIRE(ch->pop(out, 1s, [&](const std::byte* recs, std::uint32_t count, std::uint64_t seq) {
      claimed_seq = seq;
      claimed_count = count;
      consumed_during_claim = ch->consumed(seq);
      Rec first;
      std::memcpy(&first, recs, sizeof first);
      REQUIRE(first.msg == 7);
    }) == 2);
    REQUIRE(claimed_seq == seq0);
    REQUIRE(claimed_count == 2);
    REQUIRE_FALSE(consumed_during_claim);
    REQUIRE(ch->consumed(seq0));
    REQUIRE(pop_message(*ch) == 8);
    REQUIRE(ch->consumed(seq1));
  }
}

TEST_CASE("channel bounds messages by max_messages, whatever their size", "[channel]") {
  auto ch = Channel::create({64, sizeof(Rec), 3});
  REQUIRE(ch->max_messages() == 3);
  push_message(*ch, 1, 5);
  push_message(*ch, 2, 1);
  push_message(*ch, 3, 7);
  REQUIRE(ch->messages() == 3);
  REQUIRE(ch->size() == 13);
  // 51 records free, but no room for a fourth message.
  REQUIRE(error_code([&] { push_message(*ch, 4, 1, 20ms); }) == Errc::timeout);
  try {
    push_message(*ch, 4, 1, 0ms);
  } catch (const ferry::Error& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("3 messages"));
  }
  // A producer blocked on the bound is let through by a pop from another process.
  if (const pid_t child = ::fork(); child == 0) {
    std::this_thread::sleep_for(50ms);
    std::vector<std::byte> out;
    ::_exit(ch->pop(out, 5s) == 5 ? 0 : 1);
  } else {
    push_message(*ch, 4, 2, 5s);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  REQUIRE(ch->messages() == 3);
  REQUIRE(pop_message(*ch) == 2);
  REQUIRE(pop_message(*ch) == 3);
  REQUIRE(pop_message(*ch) == 4);
  REQUIRE(ch->messages() == 0);
  // Unbounded (0) channels count messages too.
  auto plain = make_channel(8);
  REQUIRE(plain->max_messages() == 0);
  push_message(*plain, 1, 2);
  REQUIRE(plain->messages() == 1);
}

TEST_CASE("channel options and attach are validated", "[channel]") {
  REQUIRE(error_code([] { Channel::create({0, 8}); }) == Errc::invalid_argument);
  REQUIRE(error_code([] { Channel::create({8, 0}); }) == Errc::invalid_argument);
  REQUIRE(Channel::create({4, 5})->record_size() == 8);

  auto ch = make_channel(64);
  REQUIRE(ch->fd() >= 0);

  SECTION("attaching by fd shares the ring") {
    auto other = Channel::attach(ferry::UniqueFd(::dup(ch->fd())));
    REQUIRE(other->capacity() == 64);
    REQUIRE(other->record_size() == sizeof(Rec));
    REQUIRE(other->fd() >= 0);
    push_message(*ch, 42, 3);
    REQUIRE(other->size() == 3);
    REQUIRE(pop_message(*other) == 42);
    REQUIRE(ch->size() == 0);
  }

  SECTION("a segment that is not a channel is rejected") {
    auto seg = ferry::Segment::create(4096);
    REQUIRE(error_code([&] { Channel::attach(ferry::UniqueFd(::dup(seg->fd()))); }) ==
            Errc::invalid_argument);
    auto tiny = ferry::Segment::create(16);
    REQUIRE(error_code([&] { Channel::attach(ferry::UniqueFd(::dup(tiny->fd()))); }) ==
            Errc::invalid_argument);
  }

  SECTION("a channel header in a segment too small for its slots is rejected") {
    void* view = ::mmap(nullptr, 1024, PROT_READ, MAP_SHARED, ch->fd(), 0);
    REQUIRE(view != MAP_FAILED);
    auto truncated = ferry::Segment::create(1024);
    std::memcpy(truncated->data(), view, 1024);
    ::munmap(view, 1024);
    try {
      Channel::attach(ferry::UniqueFd(::dup(truncated->fd())));
      FAIL("attach accepted a truncated channel");
    } catch (const ferry::Error& e) {
      REQUIRE(e.code() == Errc::invalid_argument);
      REQUIRE_THAT(e.what(), Catch::Contains("capacity 64"));
    }
  }
}

TEST_CASE("channel carries messages in order from a child process", "[channel]") {
  auto ch = make_channel(16);
  Children children;
  constexpr std::uint64_t kMessages = 5000;
  pid_t producer = children.spawn([&] {
    for (std::uint64_t m = 0; m < kMessages; ++m) push_message(*ch, m, 1 + m % 3);
    return 0;
  });
  for (std::uint64_t m = 0; m < kMessages; ++m) {
    std::uint32_t count = 0;
    REQUIRE(pop_message(*ch, &count) == m);
    REQUIRE(count == 1 + m % 3);
  }
  children.expect_success(producer);
  REQUIRE(ch->size() == 0);
}

TEST_CASE("channel delivers every message exactly once with 3 producers and 3 consumers",
          "[channel]") {
  constexpr std::uint32_t kProducers = 3;
  constexpr std::uint32_t kConsumers = 3;
  constexpr std::uint32_t kPerProducer = 3000;
  struct Results {
    std::atomic<std::uint32_t> seen[kProducers][kPerProducer];
    std::atomic<std::uint32_t> bad;
    std::atomic<std::uint32_t> popped[kConsumers];
  };
  auto seg = ferry::Segment::create(sizeof(Results));
  auto* results = new (seg->data()) Results{};
  auto ch = make_channel(32);
  Children children;

  std::vector<pid_t> consumers;
  for (std::uint32_t c = 0; c < kConsumers; ++c) {
    consumers.push_back(children.spawn([&, c] {
      std::vector<std::byte> out;
      std::int64_t last[kProducers] = {-1, -1, -1};
      for (;;) {
        std::uint32_t count = 0;
        try {
          count = ch->pop(out, 10s);
        } catch (const ferry::Error& e) {
          // Closed, or every producer already exited and the ring is drained: done either way.
          if (e.code() == Errc::closed || e.code() == Errc::peer_dead) return 0;
          return 5;
        }
        std::uint64_t msg = 0;
        if (!valid_message(out, count, &msg) || (msg >> 32) >= kProducers) {
          results->bad.fetch_add(1);
          return 3;
        }
        const std::uint32_t producer = static_cast<std::uint32_t>(msg >> 32);
        const auto index = static_cast<std::uint32_t>(msg);
        // One consumer's pops are ordered, so it sees each producer's messages ascending.
        if (index >= kPerProducer || static_cast<std::int64_t>(index) <= last[producer] ||
            count != 1 + (index + producer) % 3) {
          results->bad.fetch_add(1);
          return 4;
        }
        last[producer] = index;
        results->seen[producer][index].fetch_add(1);
        results->popped[c].fetch_add(1);
      }
    }));
  }
  std::vector<pid_t> producers;
  for (std::uint32_t p = 0; p < kProducers; ++p) {
    producers.push_back(children.spawn([&, p] {
      for (std::uint32_t i = 0; i < kPerProducer; ++i) {
        push_message(*ch, (std::uint64_t{p} << 32) | i, 1 + (i + p) % 3, 10s);
      }
      return 0;
    }));
  }
  for (pid_t pid : producers) children.expect_success(pid, 60s);
  const auto t0 = std::chrono::steady_clock::now();
  while (ch->size() > 0 && seconds_since(t0) < 10) std::this_thread::sleep_for(1ms);
  REQUIRE(ch->size() == 0);
  ch->close();
  for (pid_t pid : consumers) children.expect_success(pid, 10s);

  REQUIRE(results->bad.load() == 0);
  std::uint32_t missing = 0, duplicated = 0;
  for (std::uint32_t p = 0; p < kProducers; ++p) {
    for (std::uint32_t i = 0; i < kPerProducer; ++i) {
      const std::uint32_t n = results->seen[p][i].load();
      missing += n == 0;
      duplicated += n > 1;
    }
  }
  REQUIRE(missing == 0);
  REQUIRE(duplicated == 0);
  std::uint32_t total = 0;
  for (auto& n : results->popped) total += n.load();
  REQUIRE(total == kProducers * kPerProducer);
}

// A pop wakes only as many producers as the records it freed: a producer whose message needs more
// room sleeps again, and every message must still get through, in each producer's order.
TEST_CASE("channel delivers everything from 8 producers of mixed sizes into a ring of 4 records",
          "[channel]") {
  constexpr std::uint32_t kProducers = 8;
  constexpr std::uint32_t kPerProducer = 1000;
  auto ch = make_channel(4);
  Children children;
  std::vector<pid_t> producers;
  for (std::uint32_t p = 0; p < kProducers; ++p) {
    producers.push_back(children.spawn([&, p] {
      for (std::uint32_t i = 0; i < kPerProducer; ++i) {
        push_message(*ch, (std::uint64_t{p} << 32) | i, 1 + (i + p) % 3, 20s);
      }
      return 0;
    }));
  }
  std::vector<std::byte> out;
  std::int64_t last[kProducers];
  std::fill(std::begin(last), std::end(last), -1);
  for (std::uint32_t n = 0; n < kProducers * kPerProducer; ++n) {
    const std::uint32_t count = ch->pop(out, 20s);
    std::uint64_t msg = 0;
    REQUIRE(valid_message(out, count, &msg));
    const auto producer = static_cast<std::uint32_t>(msg >> 32);
    const auto index = static_cast<std::uint32_t>(msg);
    REQUIRE(producer < kProducers);
    REQUIRE(static_cast<std::int64_t>(index) == last[producer] + 1);
    REQUIRE(count == 1 + (index + producer) % 3);
    last[producer] = index;
  }
  for (pid_t pid : producers) children.expect_success(pid, 20s);
  CHECK(ch->size() == 0);
}

TEST_CASE("channel close wakes blocked peers, refuses pushes and drains pops", "[channel]") {
  Children children;

  SECTION("a pop blocked in another process wakes with closed") {
    auto ch = make_channel(8);
    ReadyPipe ready;
    pid_t child = children.spawn([&] {
      ready.signal();
      std::vector<std::byte> out;
      try {
        ch->pop(out, ferry::kForever);
      } catch (const ferry::Error& e) {
        return e.code() == Errc::closed ? 0 : 2;
      }
      return 1;
    });
    ready.wait();
    std::this_thread::sleep_for(100ms);  // let it reach its futex wait
    const auto t0 = std::chrono::steady_clock::now();
    ch->close();
    children.expect_success(child, 10s);
    REQUIRE(seconds_since(t0) < 5);
    REQUIRE(ch->closed());
    REQUIRE(error_code([&] { push_message(*ch, 1, 1); }) == Errc::closed);
  }

  SECTION("a push blocked on a full ring in another process wakes with closed") {
    auto ch = make_channel(2);
    push_message(*ch, 1, 2);
    ReadyPipe ready;
    pid_t child = children.spawn([&] {
      ready.signal();
      try {
        push_message(*ch, 2, 1, ferry::kForever);
      } catch (const ferry::Error& e) {
        return e.code() == Errc::closed ? 0 : 2;
      }
      return 1;
    });
    ready.wait();
    std::this_thread::sleep_for(100ms);
    ch->close();
    children.expect_success(child, 10s);
  }

  SECTION("pops drain what was queued before failing") {
    auto ch = make_channel(8);
    push_message(*ch, 10, 2);
    push_message(*ch, 11, 3);
    ch->close();
    ch->close();  // idempotent
    REQUIRE(error_code([&] { push_message(*ch, 12, 1); }) == Errc::closed);
    REQUIRE(pop_message(*ch) == 10);
    REQUIRE(pop_message(*ch) == 11);
    std::vector<std::byte> out;
    REQUIRE(error_code([&] { ch->pop(out, 0ms); }) == Errc::closed);
    REQUIRE(error_code([&] { ch->pop(out, ferry::kForever); }) == Errc::closed);
  }
}

TEST_CASE("channel reports peer_dead when the only peer on the other side is killed", "[channel]") {
  Children children;
  Watchdog watchdog(60);

  SECTION("a pop waiting forever sees its only producer die") {
    auto ch = make_channel(8);
    ReadyPipe ready;
    pid_t producer = children.spawn([&] {
      push_message(*ch, 1, 2);  // registers it as a producer
      ready.signal();
      ::pause();
      return 0;
    });
    ready.wait();
    REQUIRE(pop_message(*ch) == 1);
    std::thread killer([producer] {
      std::this_thread::sleep_for(200ms);
      ::kill(producer, SIGKILL);
    });
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::byte> out;
    const Errc code = error_code([&] { ch->pop(out, ferry::kForever); });
    killer.join();
    REQUIRE(code == Errc::peer_dead);
    REQUIRE(seconds_since(t0) < 10);
    children.kill_and_reap(producer);
  }

  SECTION("a push waiting forever on a full ring sees its only consumer die") {
    auto ch = make_channel(4);
    push_message(*ch, 1, 1);
    push_message(*ch, 2, 3);
    ReadyPipe ready;
    pid_t consumer = children.spawn([&] {
      std::vector<std::byte> out;
      ch->pop(out, 5s);  // registers it as a consumer
      ready.signal();
      ::pause();
      return 0;
    });
    ready.wait();
    push_message(*ch, 3, 1);
    REQUIRE(ch->size() == 4);
    // A consumer that is alive but slow is not a dead one.
    REQUIRE(error_code([&] { push_message(*ch, 4, 1, 300ms); }) == Errc::timeout);
    std::thread killer([consumer] {
      std::this_thread::sleep_for(200ms);
      ::kill(consumer, SIGKILL);
    });
    const auto t0 = std::chrono::steady_clock::now();
    const Errc code = error_code([&] { push_message(*ch, 4, 1, ferry::kForever); });
    killer.join();
    REQUIRE(code == Errc::peer_dead);
    REQUIRE(seconds_since(t0) < 10);
    children.kill_and_reap(consumer);
    // The ring itself is untouched.
    REQUIRE(pop_message(*ch) == 2);
    REQUIRE(pop_message(*ch) == 3);
  }
}

TEST_CASE("channel waits for a holder or an announced child before reporting peer_dead",
          "[channel]") {
  Children children;
  Watchdog watchdog(60);
  auto ch = make_channel(8);
  std::vector<std::byte> out;

  SECTION("a holder that has not pushed yet keeps a pop waiting after the only producer exits") {
    ReadyPipe held;
    pid_t holder = children.spawn([&] {
      ch->hold();  // a late producer: it has the channel but has not pushed yet
      held.signal();
      ::pause();
      return 0;
    });
    held.wait();
    pid_t early = children.spawn([&] {
      push_message(*ch, 1, 2);
      return 0;
    });
    children.expect_success(early);
    REQUIRE(pop_message(*ch) == 1);
    REQUIRE(error_code([&] { ch->pop(out, 400ms); }) == Errc::timeout);
    // Once the holder dies, nobody can push: the pop ends in peer_dead, not a hang.
    ::kill(holder, SIGKILL);
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(error_code([&] { ch->pop(out, ferry::kForever); }) == Errc::peer_dead);
    REQUIRE(seconds_since(t0) < 10);
    children.kill_and_reap(holder);
  }

  SECTION("an announced child keeps a pop waiting until it arrives, and counts from then on") {
    ch->announce();
    pid_t early = children.spawn([&] {
      push_message(*ch, 1, 1);
      return 0;
    });
    children.expect_success(early);
    REQUIRE(pop_message(*ch) == 1);
    REQUIRE(error_code([&] { ch->pop(out, 400ms); }) == Errc::timeout);
    ReadyPipe go;
    pid_t late = children.spawn([&] {
      ch->hold(/*announced=*/true);
      go.wait();
      push_message(*ch, 2, 3);
      return 0;
    });
    // Arrived and holding, not pushed yet: still waited for.
    REQUIRE(error_code([&] { ch->pop(out, 400ms); }) == Errc::timeout);
    go.signal();
    REQUIRE(pop_message(*ch) == 2);
    children.expect_success(late);
    REQUIRE(error_code([&] { ch->pop(out, 5s); }) == Errc::peer_dead);
  }

  SECTION("a holder that dies before its first push ends the wait, named with how it ended") {
    ReadyPipe held;
    pid_t doomed = children.spawn([&] {
      ch->hold();  // a producer that dies before it puts anything
      held.signal();
      return 3;
    });
    held.wait();
    // Not reaped yet: the error can tell how it ended.
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      ch->pop(out, ferry::kForever);
    } catch (const ferry::Error& e) {
      REQUIRE(e.code() == Errc::peer_dead);
      what = e.what();
    }
    REQUIRE(seconds_since(t0) < 10);
    INFO(what);
    REQUIRE(what.find("pid " + std::to_string(doomed) + " (held it; exited with code 3)") !=
            std::string::npos);
    REQUIRE(children.wait(doomed) != 0);
  }

  SECTION("an announced child that dies before arriving ends its announcement once expired") {
    ch->announce();
    pid_t never = children.spawn([&] { return 0; });  // dies before it holds the channel
    children.expect_success(never);
    REQUIRE(error_code([&] { ch->pop(out, 300ms); }) == Errc::timeout);
    REQUIRE(ch->expire_announced(never));
    REQUIRE_FALSE(ch->expire_announced(never));  // one announcement, ended once
    // It never arrived, but it was handed the channel: its death ends the wait, named.
    try {
      ch->pop(out, 5s);
      FAIL("the pop returned");
    } catch (const ferry::Error& e) {
      REQUIRE(e.code() == Errc::peer_dead);
      REQUIRE_THAT(e.what(), Catch::Contains("pid " + std::to_string(never) + " (held it"));
    }

    ch->announce();
    ReadyPipe arrived;
    pid_t came = children.spawn([&] {
      ch->hold(/*announced=*/true);
      arrived.signal();
      ::pause();
      return 0;
    });
    arrived.wait();
    REQUIRE_FALSE(ch->expire_announced(came));  // alive
    ::kill(came, SIGKILL);
    REQUIRE(children.wait(came) != 0);
    REQUIRE_FALSE(ch->expire_announced(came));  // it arrived: its hold ended the announcement
    REQUIRE(error_code([&] { ch->pop(out, 5s); }) == Errc::peer_dead);
  }

  SECTION("a holder that has only popped does not keep a pop waiting") {
    ReadyPipe popped;
    pid_t other = children.spawn([&] {
      ch->hold();
      pop_message(*ch);  // a consumer, not a producer-to-be
      popped.signal();
      ::pause();
      return 0;
    });
    pid_t early = children.spawn([&] {
      push_message(*ch, 1, 1);
      push_message(*ch, 2, 1);
      return 0;
    });
    popped.wait();
    children.expect_success(early);
    REQUIRE(pop_message(*ch) == 2);
    REQUIRE(error_code([&] { ch->pop(out, 5s); }) == Errc::peer_dead);
    children.kill_and_reap(other);
  }
}

TEST_CASE("channel survives producers and consumers SIGKILLed at random instants",
          "[channel][kill]") {
  constexpr int kIterations = 200;
  constexpr std::uint32_t kProducers = 2;
  constexpr std::uint32_t kConsumers = 2;
  struct Results {
    std::atomic<std::uint64_t> bad;
    std::atomic<std::uint64_t> popped;
    std::atomic<std::uint32_t> started;
  };
  auto seg = ferry::Segment::create(sizeof(Results));
  auto* results = new (seg->data()) Results{};
  auto ch = make_channel(16, 65536);
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::uint64_t parent_popped = 0;
  std::uint64_t next_parent_msg = 0;
  const std::uint64_t parent_tag = std::uint64_t{0xffff} << 48;

  for (int iter = 0; iter < kIterations; ++iter) {
    INFO("iteration " << iter);
    Children children;
    for (std::uint32_t p = 0; p < kProducers; ++p) {
      children.spawn([&, iter, p] {
        results->started.fetch_add(1);
        for (std::uint64_t i = 0;; ++i) {
          const std::uint64_t msg = (std::uint64_t(iter) << 32) | (std::uint64_t{p} << 24) | i;
          try {
            push_message(*ch, msg, 1 + (i + p) % 3, 200ms);
          } catch (const ferry::Error& e) {
            if (e.code() == Errc::closed) return 0;
          }
        }
      });
    }
    for (std::uint32_t c = 0; c < kConsumers; ++c) {
      children.spawn([&] {
        results->started.fetch_add(1);
        std::vector<std::byte> out;
        for (;;) {
          std::uint32_t count = 0;
          try {
            count = ch->pop(out, 200ms);
          } catch (const ferry::Error& e) {
            if (e.code() == Errc::closed) return 0;
            continue;
          }
          std::uint64_t msg = 0;
          if (!valid_message(out, count, &msg, ch->record_size())) {
            results->bad.fetch_add(1);
            return 3;
          }
          results->popped.fetch_add(1);
        }
      });
    }

    // Kill one child at a random instant once all run: often it holds the ring lock.
    const auto t0 = std::chrono::steady_clock::now();
    while (results->started.load() < (iter + 1) * (kProducers + kConsumers) &&
           seconds_since(t0) < 5) {
      std::this_thread::yield();
    }
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, 2000)(rng)));
    const std::vector<pid_t> pids = children.pids();
    const pid_t victim = pids[std::uniform_int_distribution<std::size_t>(0, pids.size() - 1)(rng)];
    children.kill_and_reap(victim);

    // The survivors and the parent still get through: any deadlock shows up as a timeout.
    push_message(*ch, parent_tag | next_parent_msg++, 1 + iter % 3, 5s);
    pop_message(*ch, nullptr, 5s);
    ++parent_popped;

    // Then the rest, each at its own random instant.
    const std::vector<pid_t> rest = children.pids();
    for (pid_t pid : rest) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::uniform_int_distribution<int>(0, 500)(rng)));
      children.kill_and_reap(pid);
    }
    REQUIRE(children.pids().empty());
    REQUIRE(results->bad.load() == 0);

    // Alone now: whatever the dead left in the ring is whole, and the ring still works.
    while (ch->size() > 0) {
      pop_message(*ch, nullptr, 5s);
      ++parent_popped;
    }
    // The message count agrees with the ring, even if a death fell between its store and the
    // commit (the next locker recounts).
    REQUIRE(ch->messages() == 0);
    const std::uint64_t msg = parent_tag | next_parent_msg++;
    const std::uint64_t seq = push_message(*ch, msg, 3, 5s);
    REQUIRE(pop_message(*ch, nullptr, 5s) == msg);
    REQUIRE(ch->consumed(seq));
    REQUIRE(ch->size() == 0);
  }
  REQUIRE(results->bad.load() == 0);
  // The children really hammered the ring.
  REQUIRE(results->popped.load() + parent_popped > kIterations * 2);
}

TEST_CASE("channel keeps a message whose consumer is SIGKILLed inside the critical section",
          "[channel][kill]") {
  auto ch = make_channel(8);
  for (std::uint32_t round = 0; round < 20; ++round) {
    INFO("round " << round);
    Children children;
    const std::uint32_t count = 1 + round % 3;
    const std::uint64_t msg = 1000 + round;
    const std::uint64_t seq = push_message(*ch, msg, count);
    pid_t child = children.spawn([&] {
      std::vector<std::byte> out;
      // Dies holding the ring lock, after copying the message and before the pop commits.
      ch->pop(out, 5s, [](const std::byte*, std::uint32_t, std::uint64_t) { ::raise(SIGKILL); });
      return 7;
    });
    const int status = children.wait(child, 10s);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);

    REQUIRE(ch->size() == count);
    REQUIRE_FALSE(ch->consumed(seq));
    std::uint32_t popped_count = 0;
    REQUIRE(pop_message(*ch, &popped_count, 5s) == msg);
    REQUIRE(popped_count == count);
    REQUIRE(ch->consumed(seq));
    REQUIRE(ch->size() == 0);
  }
  // The lock recovered every time: a round trip still works.
  push_message(*ch, 1, 2, 1s);
  REQUIRE(pop_message(*ch, nullptr, 1s) == 1);
}

TEST_CASE("deposit fate: a live owner's deposit is kept, queued or not", "[channel][custody]") {
  CHECK(ferry::deposit_fate(true, true) == ferry::DepositFate::keep);
  CHECK(ferry::deposit_fate(true, false) == ferry::DepositFate::keep);
}

TEST_CASE("deposit fate: a dead owner's deposit is kept while a message it pushed is queued",
          "[channel][custody]") {
  CHECK(ferry::deposit_fate(false, true) == ferry::DepositFate::keep);
}

TEST_CASE("deposit fate: a dead owner with nothing queued has its deposit dropped",
          "[channel][custody]") {
  CHECK(ferry::deposit_fate(false, false) == ferry::DepositFate::drop);
}

namespace {

// A child that reads a pipe until every write end is closed, those in a custody included, and
// exits 0 when what it read is `expect`: its exit says the custody let go of them.
pid_t pipe_witness(Children& children, int fds[2], const std::string& expect) {
  REQUIRE(::pipe(fds) == 0);
  const pid_t reader = children.spawn([fds, expect] {
    ::close(fds[1]);
    std::string got;
    char c;
    for (;;) {
      const ssize_t n = ::read(fds[0], &c, 1);
      if (n != 1) return n == 0 && got == expect ? 0 : 1;
      got += c;
    }
  });
  ::close(fds[0]);
  return reader;
}

bool still_running(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == 0;
}

}  // namespace

TEST_CASE(
    "channel custody holds a sender's fds from its first push, through its SIGKILL, until its "
    "last message is consumed",
    "[channel][custody]") {
  Watchdog watchdog(60);
  auto ch = make_channel(16);
  REQUIRE(ch->custody_fd() >= 0);
  Children children;
  int pipe_fds[2];
  const pid_t reader = pipe_witness(children, pipe_fds, "a");
  constexpr std::uint64_t kOwner = 0x5eed;
  const int write_end = pipe_fds[1];
  const pid_t sender = children.spawn([&] {
    const auto fd_of = [write_end](std::uint32_t segment) {
      return segment == 0 || segment == 3 ? write_end : -1;
    };
    const std::uint32_t segments[] = {0, 3};
    if (!ch->entrust(kOwner, segments, 2, fd_of, 5s)) return 1;
    push_message(*ch, 1, 1);
    if (!ch->entrust(
            kOwner, segments, 2, [](std::uint32_t) { return -1; }, 5s))
      return 2;
    push_message(*ch, 2, 2);
    ::raise(SIGKILL);  // the instant after the push: nothing runs at its exit
    return 3;
  });
  const int status = children.wait(sender, 10s);
  REQUIRE(WIFSIGNALED(status));
  ::close(write_end);  // from here on the custody holds the only write ends

  // A consumer forked after the sender has died takes the segments inside its pop's claim.
  const pid_t first = children.spawn([&] {
    std::vector<std::byte> out;
    bool ok = false;
    ch->pop(out, 5s, [&](const std::byte*, std::uint32_t, std::uint64_t) {
      ferry::UniqueFd data = ch->from_custody(kOwner, 3);
      ferry::UniqueFd ledger = ch->from_custody(kOwner, 0);
      const char mark = 'a';
      ok = data && ledger && !ch->from_custody(kOwner + 1, 3) && !ch->from_custody(kOwner, 4) &&
           ::write(data.get(), &mark, 1) == 1;
    });
    return ok ? 0 : 1;
  });
  children.expect_success(first);
  ch->sweep_custody(true);
  std::this_thread::sleep_for(200ms);
  REQUIRE(still_running(reader));  // message 2 still needs the deposit
  REQUIRE(pop_message(*ch) == 2);
  // The next sweep (a pop, push or wait finds it due) drops it: its owner is dead and nothing
  // of it is queued.
  ch->sweep_custody(true);
  children.expect_success(reader);
  REQUIRE(ch->size() == 0);
}

TEST_CASE(
    "channel custody: readers SIGKILLed at random moments while they sweep it lose no deposit",
    "[channel][custody]") {
  // A reader of the custody (a consumer inside its pop, any process sweeping) once took every
  // deposit out of the socket and sent back what was still needed: killed in between, it took
  // them all with it, and the messages of every dead sender were lost (the queue soak's chaos
  // scenario saw it). Here a dead sender's message waits in the queue while readers sweep in a
  // loop and are killed at random moments, each round with a deposit to drop beside it, so that
  // the sweeps rewrite the socket too; then its consumer must still find the segment.
  Watchdog watchdog(120);
  auto ch = make_channel(16);
  REQUIRE(ch->custody_fd() >= 0);
  Children children;
  int pipe_fds[2];
  const pid_t witness = pipe_witness(children, pipe_fds, "a");
  constexpr std::uint64_t kOwner = 0xdead5eed;
  const int write_end = pipe_fds[1];
  const pid_t sender = children.spawn([&] {
    const std::uint32_t segments[] = {3};
    if (!ch->entrust(
            kOwner, segments, 1, [write_end](std::uint32_t) { return write_end; }, 5s))
      return 1;
    push_message(*ch, 1, 1);
    ::raise(SIGKILL);
    return 2;
  });
  REQUIRE(WIFSIGNALED(children.wait(sender, 10s)));
  ::close(write_end);  // the custody holds the only write end now

  std::mt19937 rng(7);
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  REQUIRE(null_fd >= 0);
  for (int round = 0; round < 150; ++round) {
    // An owner that deposits and exits with nothing queued: the next sweep drops its deposit.
    const pid_t passer = children.spawn([&] {
      const std::uint32_t segments[] = {7};
      return ch->entrust(
                 kOwner + 1 + round, segments, 1, [null_fd](std::uint32_t) { return null_fd; }, 5s)
                 ? 0
                 : 1;
    });
    children.expect_success(passer);
    const pid_t sweeper = children.spawn([&] {
      for (;;) ch->sweep_custody(true);
      return 0;
    });
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    ::kill(sweeper, SIGKILL);
    children.wait(sweeper, 10s);
  }
  ::close(null_fd);

  const pid_t consumer = children.spawn([&] {
    std::vector<std::byte> out;
    bool ok = false;
    ch->pop(out, 5s, [&](const std::byte*, std::uint32_t, std::uint64_t) {
      ferry::UniqueFd data = ch->from_custody(kOwner, 3);
      const char mark = 'a';
      ok = data && ::write(data.get(), &mark, 1) == 1;
    });
    return ok ? 0 : 1;
  });
  children.expect_success(consumer);
  ch->sweep_custody(true);  // the sender's deposit goes: its last message has been taken
  children.expect_success(witness);
}

TEST_CASE(
    "channel custody keeps a live sender's deposit, takes each segment once, and needs a "
    "custody socket",
    "[channel][custody]") {
  Watchdog watchdog(60);
  Children children;
  int pipe_fds[2];
  // Forked before the channel exists, so that only the channel's processes hold its custody.
  const pid_t reader = pipe_witness(children, pipe_fds, "");
  auto ch = make_channel(8);
  const int write_end = pipe_fds[1];
  int asked = 0;
  const auto fd_of = [write_end, &asked](std::uint32_t) {
    ++asked;
    return write_end;
  };
  const std::uint32_t segments[] = {0, 1};
  REQUIRE(ch->entrust(7, segments, 2, fd_of, 5s));
  REQUIRE(ch->entrusted(0));
  REQUIRE(ch->entrusted(1));
  REQUIRE_FALSE(ch->entrusted(2));
  REQUIRE(ch->entrust(7, segments, 2, fd_of, 5s));  // kept already: nothing asked
  REQUIRE(asked == 2);
  const std::uint32_t more[] = {0, 1, 2};
  REQUIRE(ch->entrust(7, more, 3, fd_of, 5s));
  REQUIRE(asked == 3);
  push_message(*ch, 1, 1);
  REQUIRE(pop_message(*ch) == 1);
  ::close(write_end);
  ch->sweep_custody(true);
  std::this_thread::sleep_for(200ms);
  REQUIRE(still_running(reader));  // its owner, this process, lives: kept
  // A forked child entrusts its own segments, not its parent's.
  const pid_t child = children.spawn([&] {
    const std::uint32_t own[] = {0};
    return !ch->entrusted(0) && ch->entrust(
                                    9, own, 1, [](std::uint32_t) { return 0; }, 5s)
               ? 0
               : 1;
  });
  children.expect_success(child);

  auto bare = Channel::attach(ferry::UniqueFd(::dup(ch->fd())));
  REQUIRE(bare->custody_fd() == -1);
  REQUIRE_FALSE(bare->entrust(
      7, segments, 2, [](std::uint32_t) { return 0; }, 1s));

  auto with =
      Channel::attach(ferry::UniqueFd(::dup(ch->fd())), ferry::UniqueFd(::dup(ch->custody_fd())));
  REQUIRE(with->custody_fd() >= 0);
  REQUIRE(error_code([&] {
            Channel::attach(ferry::UniqueFd(::dup(ch->fd())), ferry::UniqueFd(::dup(ch->fd())));
          }) == Errc::invalid_argument);
  // The reader still waits on this process's deposit: dropping the channels (every holder of
  // the socket) lets it go.
  with.reset();
  ch.reset();
  children.expect_success(reader);
}

TEST_CASE("channel is abandoned once no process holds it: not before a forked holder dies",
          "[channel][abandoned]") {
  Watchdog watchdog(60);
  auto ch = make_channel(8);
  ch->hold_here();
  REQUIRE_FALSE(ch->abandoned());  // held here
  Children children;
  int go[2];
  REQUIRE(::pipe(go) == 0);
  const pid_t holder = children.spawn([&] {
    char c;
    return ::read(go[0], &c, 1) == 1 ? 0 : 1;  // holds the socket it inherited until told
  });
  ch->let_go_here();
  REQUIRE(ch->custody_fd() == -1);  // closed here: only the child holds it now
  REQUIRE_FALSE(ch->abandoned());
  REQUIRE(::write(go[1], "x", 1) == 1);
  children.expect_success(holder);
  REQUIRE(ch->abandoned());

  // One that attached without the socket counts by its entry in the table while it lives.
  auto shared = make_channel(8);
  shared->hold_here();
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t attacher = children.spawn([&] {
    shared->let_go_here();  // closes the socket it inherited: it holds the channel without it
    auto mine = Channel::attach(ferry::UniqueFd(::dup(shared->fd())));
    mine->hold();
    char c;
    return ::write(ready[1], "r", 1) == 1 && ::read(go[0], &c, 1) == 1 ? 0 : 1;
  });
  char c;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  shared->let_go_here();
  REQUIRE_FALSE(shared->abandoned());  // the socket is gone, but the attacher lives
  REQUIRE(::write(go[1], "x", 1) == 1);
  children.expect_success(attacher);
  REQUIRE(shared->abandoned());
  for (int fd : {ready[0], ready[1]}) ::close(fd);
  ::close(go[0]);
  ::close(go[1]);
}
