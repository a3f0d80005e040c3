// RemoteWorkers: workers a pool reaches through something other than its own processes (the
// hosts of a job spread over several machines, hosts/head_hub.hpp), as the pool sees
// them. The pool keeps the one task book: a remote slot is one more worker in it, with room for
// `capacity` tasks, whose loss hands its tasks back for a retry like a worker's death.
//
// The contract, both ways:
// - the pool calls start() once its own workers run, send() from any thread, stop() once, at
//   close, after which no event comes;
// - the remote side calls its RemoteEvents from its own threads (it holds no lock of the pool's);
//   after lost() for a slot nothing new is sent there, and a finished() that races the loss is
//   stale (the task book has handed that attempt back already);
// - send() throws when the task cannot reach the slot; the slot is then lost (the remote side
//   reports lost() itself, once), and the task comes back through that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/prelude.hpp"
#include "runtime/tensor_queue.hpp"  // Tensors

namespace ferry {

class RemoteEvents {
 public:
  virtual ~RemoteEvents() = default;
  // A remote slot arrived with room for `capacity` tasks at once: its number, or -1 when the pool
  // is closing (the remote side then lets it go). It takes tasks from ready() on, so the remote
  // side can file the number before the first send() comes.
  virtual int joined(const std::string& name, const std::vector<std::string>& devices,
                     std::size_t capacity) = 0;
  virtual void ready(int slot) = 0;
  // Task `task`'s attempt `attempt` ended on `slot`: its outputs, or (ok false) the task's own
  // error in words, and as the one uint8 tensor of `outputs`, its detail (TaskError::detail())
  // when it has one.
  virtual void finished(int slot, std::uint64_t task, std::uint32_t attempt, bool ok,
                        Tensors outputs, const std::string& error) = 0;
  // `slot` is gone for good (its process died, it stopped answering, it left): its tasks are
  // retried elsewhere.
  virtual void lost(int slot, const std::string& why) = 0;
};

class RemoteWorkers {
 public:
  virtual ~RemoteWorkers() = default;
  // Starts taking slots; `events` outlives stop().
  virtual void start(RemoteEvents& events) = 0;
  // Hands `name` with `inputs` to `slot` as attempt `attempt` of task `task`, with the task's
  // `prelude` (null: none), which the remote side gives its own workers once each.
  virtual void send(int slot, std::uint64_t task, std::uint32_t attempt, const std::string& name,
                    const Tensors& inputs, const Prelude* prelude) = 0;
  // Tells every slot the pool is closing and waits for the remote side's threads to end.
  virtual void stop() = 0;
};

}  // namespace ferry
