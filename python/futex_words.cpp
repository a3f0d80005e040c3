#include "python/futex_words.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "ipc/error.hpp"
#include "ipc/futex.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

std::atomic<std::uint32_t>* word_at(std::uintptr_t address) {
  // The caller owns the word; all that can be checked here is what a futex itself requires.
  if (address == 0 || address % alignof(std::uint32_t) != 0)
    throw Error(Errc::invalid_argument,
                "futex word at " + std::to_string(address) + ": not a 4-byte aligned address");
  return reinterpret_cast<std::atomic<std::uint32_t>*>(address);
}

}  // namespace

void bind_futex_words(py::module_& m) {
  m.def(
      "wait_word",
      [](std::uintptr_t address, std::uint32_t expected, double seconds) {
        auto* word = word_at(address);
        const auto ns =
            std::chrono::nanoseconds(static_cast<std::int64_t>(seconds > 0 ? seconds * 1e9 : 0));
        py::gil_scoped_release unlocked;
        return futex_wait(word, expected, ns);
      },
      py::arg("address"), py::arg("expected"), py::arg("seconds"),
      "sleeps while the word at `address` holds `expected`, at most `seconds`; true if woken");
  m.def(
      "wake_word", [](std::uintptr_t address) { return futex_wake_all(word_at(address)); },
      py::arg("address"), "wakes every process waiting on the word at `address`; how many");
}

}  // namespace ferry::python
