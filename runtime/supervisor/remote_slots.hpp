// The remote slots: the pool's side of RemoteWorkers (runtime/remote_workers.hpp), the hosts of
// a job spread over several machines, each one slot of the pool while it lasts.
//
// Runs on the remote side's threads (RemoteEvents). A host that joins becomes a RemoteSlot on
// the board, closed until ready(); its results go to the result collector like a worker's; its
// loss hands its tasks back for a retry, like a worker's death, and retires the slot for good.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/remote_workers.hpp"
#include "runtime/supervisor/board.hpp"
#include "runtime/supervisor/dispatcher.hpp"
#include "runtime/supervisor/result_collector.hpp"

namespace ferry::supervisor {

// A host's slot: its hand-overs go through RemoteWorkers::send. A link that fails is gone (the
// remote side reports lost(), which hands the task back); inputs the link cannot carry
// (Error(invalid_argument)) are refused.
class RemoteSlot : public Slot {
 public:
  RemoteSlot(WorkerStats stats, RemoteWorkers& remote) : Slot(std::move(stats)), remote_(remote) {}
  Delivery send(const HandOver& h, std::unique_lock<std::mutex>& lock) override;

 private:
  RemoteWorkers& remote_;
};

class RemoteSlots : public RemoteEvents {
 public:
  RemoteSlots(Board& board, Dispatcher& dispatcher, ResultCollector& collector,
              RemoteWorkers& remote)
      : board_(board), dispatcher_(dispatcher), collector_(collector), remote_(remote) {}

  int joined(const std::string& name, const std::vector<std::string>& devices,
             std::size_t room) override;
  void ready(int slot) override;
  void finished(int slot, std::uint64_t task, std::uint32_t attempt, bool ok, Tensors outputs,
                const std::string& error) override;
  void lost(int slot, const std::string& why) override;

 private:
  Board& board_;
  Dispatcher& dispatcher_;
  ResultCollector& collector_;
  RemoteWorkers& remote_;
};

}  // namespace ferry::supervisor
