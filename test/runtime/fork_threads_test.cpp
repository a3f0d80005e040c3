// The intra-op threads of a forked child (runtime/fork_threads.hpp): after the parent ran a
// parallel region with two threads, a child forked by that same thread must not wait for ever on
// the parent's OpenMP team at its first parallel op. These run in a process that really has such
// a team (at::set_num_threads(2) and a parallel sum), as every pip user's process has.
#include "runtime/fork_threads.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>

#include "../catch.hpp"

#include "../test_util.hpp"
#include "ipc/error.hpp"

namespace {

using namespace std::chrono_literals;

// Big enough that at::parallel_for splits it across the threads (its grain is 32768).
constexpr std::int64_t kElements = 4'000'000;

// A parallel reduction, checked: the op a forked child hung at.
void parallel_sum() {
  const double s = (at::ones({kElements}) * 2).sum().item<double>();
  if (s != 2.0 * kElements) throw std::runtime_error("sum " + std::to_string(s));
}

// This thread's OpenMP team now has two threads, as the parent's has in every case below.
void make_team() {
  at::set_num_threads(2);
  REQUIRE(at::get_num_threads() == 2);
  parallel_sum();
}

// Runs `fn` in a forked child and requires it to succeed within 30 s: a hang is the failure.
void in_child(const std::function<void()>& fn) {
  REQUIRE(ferry::test::wait_child(ferry::test::fork_child(fn), 30s) == 0);
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { ::setenv(n, value, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
};

TEST_CASE("a child forked after a parallel region with 2 threads runs one thread and does not hang",
          "[fork]") {
  make_team();
  in_child([] {
    if (at::get_num_threads() != 1) {
      throw std::runtime_error("the child has " + std::to_string(at::get_num_threads()) +
                               " intra-op threads");
    }
    parallel_sum();
  });
  // The parent keeps its own.
  CHECK(at::get_num_threads() == 2);
  parallel_sum();
  at::set_num_threads(1);
}

TEST_CASE("FERRY_FORK_THREADS sets a forked child's threads, 0 leaves them, a bad value is named",
          "[fork]") {
  make_team();
  SECTION("N threads") {
    const ScopedEnv env("FERRY_FORK_THREADS", "3");
    CHECK(ferry::fork_child_threads() == 3);
    in_child([] {
      if (at::get_num_threads() != 3) throw std::runtime_error("not 3 threads");
    });
  }
  SECTION("0: as inherited (no parallel op in the child: with the parent's team it would hang)") {
    const ScopedEnv env("FERRY_FORK_THREADS", "0");
    in_child([] {
      if (at::get_num_threads() != 2) throw std::runtime_error("not the parent's 2 threads");
    });
  }
  SECTION("a bad value: the call says which, and a child still gets one thread") {
    const ScopedEnv env("FERRY_FORK_THREADS", "many");
    CHECK_THROWS_WITH(ferry::fork_child_threads(),
                      Catch::Contains("FERRY_FORK_THREADS") && Catch::Contains("many"));
    in_child([] {
      if (at::get_num_threads() != 1) throw std::runtime_error("not 1 thread");
      parallel_sum();
    });
  }
  at::set_num_threads(1);
}

}  // namespace
