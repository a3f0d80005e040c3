#include "ipc/step_times.hpp"

#include <array>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"

using namespace std::chrono_literals;
namespace steps = ferry::steps;

namespace {

const steps::Tally* find(const std::vector<steps::Tally>& all, const std::string& step,
                         const std::string& thread = "caller") {
  for (const auto& t : all)
    if (t.step == step && t.thread == thread) return &t;
  return nullptr;
}

}  // namespace

TEST_CASE("step tally: off by default, a step then records nothing", "[steps]") {
  REQUIRE_FALSE(steps::enabled());
  { const steps::Timed t("off"); }
  CHECK(find(steps::snapshot(), "off") == nullptr);
}

TEST_CASE("step tally: on, each step counts its calls and its time, per thread role", "[steps]") {
  steps::enable(true);
  for (int i = 0; i < 3; ++i) {
    const steps::Timed t("sleep");
    std::this_thread::sleep_for(2ms);
  }
  std::thread([] {
    steps::set_thread_role("closer");
    const steps::Timed t("sleep");
  }).join();
  const auto all = steps::snapshot();
  const steps::Tally* mine = find(all, "sleep");
  REQUIRE(mine != nullptr);
  CHECK(mine->calls == 3);
  CHECK(mine->ns >= 6'000'000);
  const steps::Tally* closer = find(all, "sleep", "closer");
  REQUIRE(closer != nullptr);
  CHECK(closer->calls == 1);
  REQUIRE(all.front().step == "sleep");  // first seen, first listed
  CHECK(all.front().thread == "caller");
  steps::enable(false);
}

TEST_CASE("step tally: an outer step's time includes its inner steps'", "[steps]") {
  steps::enable(true);
  {
    const steps::Timed outer("outer");
    const steps::Timed inner("inner");
    std::this_thread::sleep_for(1ms);
  }
  const auto all = steps::snapshot();
  REQUIRE(find(all, "outer") != nullptr);
  REQUIRE(find(all, "inner") != nullptr);
  CHECK(find(all, "outer")->ns >= find(all, "inner")->ns);
  steps::enable(false);
}

TEST_CASE("step tally: reset forgets the figures, and the next measurement starts from zero",
          "[steps]") {
  steps::enable(true);
  { const steps::Timed t("before"); }
  steps::reset();
  CHECK(find(steps::snapshot(), "before") == nullptr);
  { const steps::Timed t("before"); }
  REQUIRE(find(steps::snapshot(), "before") != nullptr);
  CHECK(find(steps::snapshot(), "before")->calls == 1);
  steps::enable(false);
}

TEST_CASE("step tally: threads recording at once lose no call", "[steps]") {
  steps::enable(true);
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([] {
      for (int j = 0; j < kEach; ++j) {
        const steps::Timed a("shared");
        const steps::Timed b(j % 2 ? "odd" : "even");
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto all = steps::snapshot();
  REQUIRE(find(all, "shared") != nullptr);
  CHECK(find(all, "shared")->calls == kThreads * kEach);
  CHECK(find(all, "odd")->calls == kThreads * kEach / 2);
  CHECK(find(all, "even")->calls == kThreads * kEach / 2);
  steps::enable(false);
}

TEST_CASE("step tally: steps beyond its capacity are counted under other", "[steps]") {
  static std::array<std::string, steps::kCapacity + 5> names;
  steps::enable(true);
  for (std::size_t i = 0; i < names.size(); ++i) {
    names[i] = "step " + std::to_string(i);
    const steps::Timed t(names[i].c_str());
  }
  const auto all = steps::snapshot();
  CHECK(all.size() == steps::kCapacity + 1);
  REQUIRE(find(all, "other", "any") != nullptr);
  CHECK(find(all, "other", "any")->calls == 5);
  steps::enable(false);
}
