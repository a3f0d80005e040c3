// The dispatcher: admits tasks into the book and hands them to slots.
//
// Runs on any thread: submitters, and every room after a change that may free room or open a
// slot (a result, a start, a host's arrival). Each hand-over is decided under the board's lock
// and sent outside it, through the slot's own send() (slot.hpp), so local workers and hosts go
// the same way. What a send says is carried out here: a stuck slot is killed, a refused one
// fails that task only, a slot that is going hands its tasks back through its loss.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "ipc/error.hpp"
#include "runtime/supervisor/board.hpp"

namespace ferry::supervisor {

class Dispatcher {
 public:
  explicit Dispatcher(Board& board) : board_(board) {}

  // Admits `task` (its name, inputs and done set) once the book has room, up to `timeout`
  // (negative: for ever), numbering it `index` or by submission, then dispatches. Throws
  // Error: invalid_argument (too many tensors, an unknown task), timeout (the pool stayed full),
  // closed, worker_lost (no worker can run: Board::fatal).
  void submit(const TaskPtr& task, std::optional<std::size_t> index,
              std::chrono::milliseconds timeout);

  // Sends whatever the book hands over until it hands over nothing.
  void dispatch();

 private:
  // The task of `h` fails: its inputs could not be handed to `device`.
  void hand_over_failed(const HandOver& h, const Error& e, const std::string& device);

  Board& board_;
};

}  // namespace ferry::supervisor
