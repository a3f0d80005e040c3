#include "runtime/supervisor/result_batch.hpp"

#include <algorithm>

namespace ferry::supervisor {

ResultBatch take_results(TensorQueue& q, std::size_t most,
                         std::chrono::milliseconds timeout) noexcept {
  ResultBatch b;
  try {
    b.messages.push_back(q.recv(timeout));
    // size() counts records already pushed whole: a message seen here is there to take, and a
    // queue seen empty ends the batch without the cost of a wait that times out.
    while (b.messages.size() < std::max<std::size_t>(most, 1) && q.size() > 0) {
      b.messages.push_back(q.recv(std::chrono::milliseconds(0)));
    }
  } catch (...) {
    b.failed = std::current_exception();
  }
  return b;
}

}  // namespace ferry::supervisor
