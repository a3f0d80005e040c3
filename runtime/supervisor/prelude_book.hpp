// PreludeBook: which preludes (runtime/prelude.hpp) one worker holds, as its supervisor knows it.
//
// The worker keeps what the supervisor's sends tell it to, and nothing else: a send attaches a
// prelude it lacks, or names one it holds, and may tell it to forget one, so that it never holds
// more than the book's capacity. Both sides see the same sends in the same order (one queue, sent
// one at a time under the slot's send lock, local_slot.cpp), so the book is the worker's table.
// plan() decides what a send carries; sent() records it once the send went through, so a send
// that failed changes nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::supervisor {

class PreludeBook {
 public:
  explicit PreludeBook(std::size_t capacity);

  struct Plan {
    bool attach = false;       // the prelude's tensors go with this send: the worker lacks it
    std::uint64_t forget = 0;  // the worker drops this one first (0: none), to make room
  };
  // What a send of a task naming prelude `id` (not 0) carries.
  Plan plan(std::uint64_t id) const;
  // A send of `plan` for `id` went through: the worker holds `id`, most recently used.
  void sent(std::uint64_t id, const Plan& plan);
  // A new process in the slot: it holds nothing.
  void clear() { held_.clear(); }

  bool holds(std::uint64_t id) const;
  std::size_t size() const noexcept { return held_.size(); }

 private:
  std::size_t capacity_;
  std::vector<std::uint64_t> held_;  // least recently used first; a few dozen, so a scan
};

}  // namespace ferry::supervisor
