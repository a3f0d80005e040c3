#include "runtime/prelude.hpp"

#include <atomic>
#include <string>

#include "ipc/error.hpp"

namespace ferry {

PreludePtr make_prelude(Tensors tensors) {
  if (tensors.size() > kMaxPreludeTensors) {
    throw Error(Errc::invalid_argument,
                "a prelude of " + std::to_string(tensors.size()) + " tensors; it holds at most " +
                    std::to_string(kMaxPreludeTensors) + " (join them into one)");
  }
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.device().is_cpu()) {
      throw Error(Errc::invalid_argument,
                  std::string("a prelude holds CPU tensors only, not ") +
                      (t.defined() ? "one on " + t.device().str() : "an undefined one") +
                      "; a worker keeps a copy of it in its own memory");
    }
  }
  // Ids are never reused in this process, so a worker never mistakes one prelude for another.
  static std::atomic<std::uint64_t> next{1};
  auto p = std::make_shared<Prelude>();
  p->id = next.fetch_add(1, std::memory_order_relaxed);
  p->tensors = std::move(tensors);
  return p;
}

}  // namespace ferry
