// Each row of a benchmark held against what bounds it (docs/benchmarks.md, "Every row against its
// limit"): the JSON of a figure's limit and its cells in a printed table, and the limits the C++
// benchmarks measure beside their rows: a wake-up floor between two processes, and the cores a
// compute ceiling scales by.
#pragma once

#include <sched.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "test/bench/bench_support.hpp"

namespace ferry::bench {

inline const std::string kMeasuredHere = "measured in this run";

// One figure of a row and its limit. A rate reaches row / limit of its limit, a time limit / row.
struct Limit {
  std::string figure;             // which of the row's figures; "" where the row has one
  std::string name;               // what bounds the figure, in words
  std::string unit;               // the figure's unit, which the limit is in too
  std::optional<double> value;    // the limit; nullopt where it could not be measured
  std::optional<double> reached;  // the row's figure; nullopt where the row has none
  bool rate = true;               // false: a time, where lower is better
  std::string source = kMeasuredHere;
  std::string why;  // why there is no share, where the default does not say
};

// The limit of a rate (higher is better) or of a time (lower is better), measured in this run.
inline Limit make_limit(bool rate, std::string figure, std::string name, std::string unit,
                        std::optional<double> value, std::optional<double> reached) {
  Limit l;
  l.figure = std::move(figure);
  l.name = std::move(name);
  l.unit = std::move(unit);
  l.value = value;
  l.reached = reached;
  l.rate = rate;
  return l;
}
inline Limit rate_limit(std::string figure, std::string name, std::string unit,
                        std::optional<double> value, std::optional<double> reached) {
  return make_limit(true, std::move(figure), std::move(name), std::move(unit), value, reached);
}
inline Limit time_limit(std::string figure, std::string name, std::string unit,
                        std::optional<double> value, std::optional<double> reached) {
  return make_limit(false, std::move(figure), std::move(name), std::move(unit), value, reached);
}

inline std::optional<double> share(const Limit& l) {
  if (!l.value || !l.reached || *l.value <= 0 || *l.reached <= 0) return std::nullopt;
  return l.rate ? *l.reached / *l.value : *l.value / *l.reached;
}

inline json limit_json(const Limit& l) {
  json j;
  if (!l.figure.empty()) j["figure"] = l.figure;
  j["name"] = l.name;
  j["unit"] = l.unit;
  j["value"] = l.value ? json(*l.value) : json(nullptr);
  const auto s = share(l);
  j["share"] = s ? json(*s) : json(nullptr);
  j["source"] = l.source;
  if (!s) {
    j["why"] = !l.why.empty() ? l.why
               : !l.value     ? "the limit was not measured"
                              : "the row has no figure";
  }
  return j;
}

// A row of several figures carries one limit per figure, each naming its figure.
inline json limits_json(const std::vector<Limit>& limits) {
  json out = json::array();
  for (const Limit& l : limits) out.push_back(limit_json(l));
  return out;
}

// A limit's cells in a printed table, from its JSON (a report printed again reads nothing else):
// "value unit" and the share, "-" where either is null.
template <class Json>
std::string limit_cell(const Json& l) {
  if (!l["value"].is_number()) return "-";
  return num(l["value"].template get<double>()) + " " + l["unit"].template get<std::string>();
}
template <class Json>
std::string share_cell(const Json& l) {
  return l["share"].is_number() ? fmt("%.3f", l["share"].template get<double>()) : "-";
}

// `cell` of a row's one limit, or of each of its limits joined by " / ".
template <class Json, class Cell>
std::string joined_cells(const Json& limit, Cell cell) {
  if (!limit.is_array()) return cell(limit);
  std::string out;
  for (const auto& l : limit) out += (out.empty() ? "" : " / ") + cell(l);
  return out;
}
template <class Json>
std::string limit_cells(const Json& limit) {
  return joined_cells(limit, [](const Json& l) { return limit_cell(l); });
}
template <class Json>
std::string share_cells(const Json& limit) {
  return joined_cells(limit, [](const Json& l) { return share_cell(l); });
}

// The names of the limits of every row, once each, in the order they first come: what a printed
// table's limit columns are, said once below it.
template <class Json>
std::vector<std::string> limit_names(const Json& rows) {
  std::vector<std::string> names;
  auto add = [&](const Json& l) {
    const auto name = l["name"].template get<std::string>();
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (const auto& row : rows) {
    const Json& l = row["limit"];
    if (l.is_array()) {
      for (const auto& one : l) add(one);
    } else {
      add(l);
    }
  }
  return names;
}

// CPU time of this process, all threads, in seconds: what a task done alone costs, whatever else
// the machine runs meanwhile (its wall time would count what others took from it too).
inline double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// The cores this process may run on: what a compute ceiling multiplies by, at most.
inline int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// "compute ceiling: <task> alone, one thread, x min(N <who>, C cores)", with the factor it names.
struct Ceiling {
  std::string name;
  int factor;
};
inline Ceiling compute_ceiling(const std::string& task, int workers, const std::string& who) {
  const int cores = usable_cores();
  return {"compute ceiling: " + task + " alone, one thread, x min(" + std::to_string(workers) +
              " " + who + ", " + std::to_string(cores) + " cores)",
          std::min(workers, cores)};
}

// ---------------------------------------------------------------------------------------------
// The wake-up floor: the fastest a process can learn that another has answered, as a round trip.
// A waiter either sleeps and is woken (a 1-byte pipe round trip) or polls (a round trip through
// one shared word, both sides spinning); ferry's waiters poll before they sleep, so the floor is
// the faster of the two, at its median. A p99 is held to that median too: the floor's own tail is
// the machine's noise, which no transport has to pay, and a noisy tail is no bound.

inline const std::string kWakeFloorName =
    "wake-up floor: the faster of a 1-byte pipe and a shared-word round trip between two "
    "processes, p50";

// A one-way hand-off wakes one side: half the round trip's floor.
inline const std::string kWakeFloorOneWayName =
    "wake-up floor, one way: half the faster of a 1-byte pipe and a shared-word round trip "
    "between two processes, p50";

struct RoundTripUs {
  double p50 = 0, p99 = 0;
  std::size_t n = 0;
};

struct WakeFloor {
  RoundTripUs pipe, word;
  double us() const { return std::min(pipe.p50, word.p50); }
};

// Times `trip()` after a warm-up of a tenth (at least 5): `iterations` times, or fewer once
// `time_cap_s` has passed (at least 5 samples). Microseconds.
template <class Trip>
RoundTripUs time_trips(int iterations, double time_cap_s, Trip trip) {
  const int warmup = std::max(5, iterations / 10);
  for (int i = 0; i < warmup; ++i) trip();
  std::vector<double> us;
  const std::int64_t start = monotonic_ns();
  const auto cap_ns = static_cast<std::int64_t>(time_cap_s * 1e9);
  for (int i = 0; i < iterations; ++i) {
    if (us.size() >= 5 && monotonic_ns() - start > cap_ns) break;
    const std::int64_t t0 = monotonic_ns();
    trip();
    us.push_back(static_cast<double>(monotonic_ns() - t0) / 1e3);
  }
  std::sort(us.begin(), us.end());
  return {percentile(us, 50), percentile(us, 99), us.size()};
}

inline RoundTripUs pipe_round_trip_us(int iterations, double time_cap_s) {
  Link link;
  Child child(
      [&] {
        link.child_side();
        for (char c; (c = link.recv<char>()) != 'q';) link.send(c);
      },
      "wake-up floor, pipe");
  link.parent_side();
  const RoundTripUs r = time_trips(iterations, time_cap_s, [&] {
    link.send('p');
    if (link.recv<char>() != 'p') throw std::runtime_error("pipe round trip: wrong byte");
  });
  link.send('q');
  child.wait();
  return r;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Polls until `word` holds `want` (true), or `stop`, or 10 s have passed (false: the peer is gone
// or stuck). After 50 us it yields the core at each poll, so that two processes given one core
// still take turns.
inline bool await_word(const std::atomic<std::uint64_t>& word, std::uint64_t want,
                       std::uint64_t stop) {
  const std::int64_t start = monotonic_ns();
  for (std::uint64_t polls = 0;; ++polls) {
    const std::uint64_t now = word.load(std::memory_order_acquire);
    if (now == want) return true;
    if (now == stop) return false;
    cpu_relax();
    if (polls % 64 != 0) continue;
    const std::int64_t waited = monotonic_ns() - start;
    if (waited > 10'000'000'000) return false;
    if (waited > 50'000) ::sched_yield();
  }
}

// The parent writes an odd number into a shared word, the child answers with the next even one.
inline RoundTripUs word_round_trip_us(int iterations, double time_cap_s) {
  void* page = ::mmap(nullptr, sizeof(std::atomic<std::uint64_t>), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) fail_errno("mmap");
  auto* word = new (page) std::atomic<std::uint64_t>(0);
  constexpr std::uint64_t kQuit = ~std::uint64_t{0};
  RoundTripUs r;
  try {
    Child child(
        [&] {
          for (std::uint64_t next = 1; await_word(*word, next, kQuit); next += 2) {
            word->store(next + 1, std::memory_order_release);
          }
        },
        "wake-up floor, shared word");
    std::uint64_t next = 1;
    r = time_trips(iterations, time_cap_s, [&] {
      word->store(next, std::memory_order_release);
      if (!await_word(*word, next + 1, kQuit))
        throw std::runtime_error("shared word: no answer in 10 s");
      next += 2;
    });
    word->store(kQuit, std::memory_order_release);
    child.wait();
  } catch (...) {
    ::munmap(page, sizeof(std::atomic<std::uint64_t>));
    throw;
  }
  ::munmap(page, sizeof(std::atomic<std::uint64_t>));
  return r;
}

inline WakeFloor wake_floor(int iterations, double time_cap_s) {
  return {pipe_round_trip_us(iterations, time_cap_s), word_round_trip_us(iterations, time_cap_s)};
}

inline json wake_floor_json(const WakeFloor& f) {
  auto one = [](const RoundTripUs& r) { return json{{"p50", r.p50}, {"p99", r.p99}, {"n", r.n}}; };
  return {{"pipe_1byte_us", one(f.pipe)}, {"shared_word_us", one(f.word)}};
}

}  // namespace ferry::bench
