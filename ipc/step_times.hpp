// Where a hand-off's time goes: an opt-in tally, per process, of named steps (every CUDA call
// ferry makes, and the transport's own steps on both sides), for `ferry-cuda-bench --breakdown`.
//
// Off (the default), a step costs one relaxed atomic load and records nothing. On, it reads the
// clock twice and adds to its slot with relaxed atomics: no lock, no allocation, so a step may
// sit on the hot path and in any thread. A step is named by a string literal and the role of the
// thread it ran on ("caller" unless the thread said otherwise: the importer's closer, the
// sender's reaper), so a breakdown tells the hand-off's own path from the work behind it.
// Steps nest: an outer step's time includes its inner ones'.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::steps {

// Turns the tally on or off for this process (a forked child starts with its parent's setting).
void enable(bool on) noexcept;
bool enabled() noexcept;

// Names the calling thread's role in the tally, a string literal ("closer"); "caller" until then.
void set_thread_role(const char* role) noexcept;

// Times its scope as step `name` (a string literal) when the tally is on.
class Timed {
 public:
  explicit Timed(const char* name) noexcept : name_(enabled() ? name : nullptr) {
    if (name_ != nullptr) start_ = std::chrono::steady_clock::now();
  }
  ~Timed();
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point start_{};
};

struct Tally {
  std::string step, thread;
  std::uint64_t calls = 0;
  std::uint64_t ns = 0;  // wall time inside the step, summed over its calls
};
// Every step recorded since the last reset, in the order each was first seen.
std::vector<Tally> snapshot();
// Forgets every figure (not the steps' names): the next measurement starts from zero.
void reset() noexcept;
// How many distinct (step, thread) pairs the tally holds; one beyond is counted under "other".
constexpr int kCapacity = 128;

}  // namespace ferry::steps
