// TensorQueue: a bounded queue of tensor messages between processes that share a parent.
//
// Create it before fork (or pass fd() to a spawned child and attach there); any process and any
// thread may send and receive. A message is a list of CPU and CUDA tensors. Tensors allocated
// with ferry::empty_shared() travel zero-copy: the receiver gets a view on the sender's block, and
// the block returns to the sender's allocator when the last receiver drops its view. Any other
// CPU tensor is copied once into shared memory on send (counted in transport_stats()); the
// receiver gets a view of that copy too, except below FERRY_COPY_ON_RECEIPT_BELOW (64 KiB), where
// it copies the bytes into its own memory at once and the sender has its block back.
//
// What a receiver keeps never pins a dead sender's memory: when a sender exits, the CPU tensors
// received from it move into the receiver's own memory (runtime/peer_exit.hpp); recv() looks
// for such senders at most every 100 ms.
//
// A message outlives its sender from the moment send() returns: before it pushes the first message
// that names one of its segments, a sender hands that segment to the queue's custody
// (ipc/channel.hpp), which every process holding the queue holds and the kernel keeps whatever
// happens to the sender. So a message is delivered after its sender has gone, SIGKILL and
// _exit() included, as the receiver's own copy. When a queue is held by no process any more
// (every handle on it dropped, its other holders dead), what its queued messages kept is taken
// back by their sender within a second.
//
// A CUDA tensor travels by CUDA IPC: the receiver gets a view on the sender's allocation, opened
// once per process, after its current stream waited for the sender's last write. Where that is
// not safe (see docs/cuda.md) it is copied, and the reason counted.
#pragma once

#include <ATen/ATen.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ipc/channel.hpp"
#include "ipc/error.hpp"
#include "ipc/stats.hpp"

namespace ferry {

using Tensors = std::vector<at::Tensor>;
// Tensors by name: a pool's shared state (PoolOptions::shared), a module's parameters.
using NamedTensors = std::map<std::string, at::Tensor>;

class TensorQueue {
 public:
  struct Options {
    std::uint32_t capacity = 64;     // tensors in flight (a message of n tensors takes n places)
    std::uint32_t max_messages = 0;  // messages queued at most, whatever their size; 0: no bound
  };

  // A new queue. Share it with children by fork, or by fd() (and custody_fd()) and attach()
  // across exec.
  static TensorQueue create(const Options& options);
  static TensorQueue create() { return create(Options{}); }
  // Attaches to a queue from fds inherited across exec (fd() and custody_fd() in the parent; both
  // are duplicated). The process counts as one that may send or receive (hold()); `announced`:
  // the parent called announce() for it. Without `custody_fd` the queue works the same, but what
  // this process sends is delivered only while it lives (or, at a normal exit, if it is claimed
  // while the process waits, FERRY_EXIT_LINGER_MS), and it cannot take what dead senders left in
  // the custody.
  static TensorQueue attach(int fd, bool announced = false, int custody_fd = -1);

  // Who may still send or receive decides when a wait ends in peer_dead: a recv() on an empty
  // queue fails once every other process that held the queue and could have sent has exited
  // (whether it sent or not), and no child is announced. A process takes a role by sending or
  // receiving; until then one that attached, or called hold(), counts on both sides
  // (ipc/peer_roles.hpp). The error names each of them and how it ended.
  // announce(): one more child is on its way (call it before fork, or before handing fd() to a
  // process that will attach); the child's hold(true) or attach(fd, true) ends it, and so does
  // expire_announced(pid) once that child has exited without arriving.
  void announce() noexcept;
  void hold(bool announced = false);
  bool expire_announced(pid_t child);

  struct SendOptions {
    // Copy every tensor instead of sharing it, so the receiver's view is independent of the
    // sender's tensor (counted as CopyReason::detached).
    bool detached = false;
    std::chrono::milliseconds timeout = kForever;
  };

  // Sends one message and reports how each of its tensors travelled (shared in place, or copied
  // and why). Blocks while the queue is full, up to `timeout` (kForever: until room, close, or
  // every receiver has exited). Throws ferry::Error: timeout, closed, peer_dead,
  // invalid_argument (a tensor not on CPU or CUDA, sparse, rank over 12, too many tensors).
  SendReport send(const Tensors& tensors, std::chrono::milliseconds timeout = kForever);
  SendReport send(const Tensors& tensors, const SendOptions& options);

  // Sends `body` behind a first tensor that `describe` makes from the report of how `body`
  // travels, so that a message can say what its own sending did (a pool worker's result
  // envelope counts its results this way). Returns the report of `body` alone.
  SendReport send_described(const std::function<at::Tensor(const SendReport&)>& describe,
                            const Tensors& body, const SendOptions& options);

  // Tells this sender who receives, when one process does (a pool and its worker): `pid`, and
  // its CUDA device, or -1 for a process that cannot use CUDA. CUDA tensors are then copied
  // where the receiver could not open them: through shared memory to a CPU-only receiver, and on
  // the device when the receiver is this process. Without it any receiver is assumed able to.
  void set_receiver(pid_t pid, int cuda_device) noexcept;

  // Receives the oldest message. Throws ferry::Error: timeout, closed (closed and drained),
  // peer_dead (the queue is empty and every other holder exited: see announce()), bad_record.
  Tensors recv(std::chrono::milliseconds timeout = kForever);

  // Like recv(), but returns nullopt when `timeout` passes with no message.
  std::optional<Tensors> try_recv(std::chrono::milliseconds timeout);

  // Closes the queue for every process: sends fail, receivers drain what is queued, then fail.
  void close() noexcept;
  bool closed() const noexcept;

  std::uint32_t capacity() const noexcept;
  std::uint32_t size() const noexcept;          // tensors queued now
  std::uint32_t messages() const noexcept;      // messages queued now
  std::uint32_t max_messages() const noexcept;  // Options::max_messages
  int fd() const noexcept;                      // pass to a spawned child (clear FD_CLOEXEC first)
  int custody_fd() const noexcept;              // pass it too; -1 when this process has none
  // This process's waits on the queue give the core away between polls: for queues among more
  // busy threads than cores, as a pool's are (ipc/spin_policy.hpp). Off by default.
  void set_yielding(bool on) noexcept;

 private:
  explicit TensorQueue(std::shared_ptr<Channel> channel);
  SendReport send_message(const Tensors& body,
                          const std::function<at::Tensor(const SendReport&)>* describe,
                          const SendOptions& options);
  std::shared_ptr<Channel> channel_;
  // This process's hold on the queue, shared by every copy of this handle: the last copy to go
  // lets go of it (Channel::let_go_here()), while the leases of queued messages keep channel_.
  std::shared_ptr<void> hold_;
  pid_t receiver_pid_ = 0;
  int receiver_device_ = -2;  // unknown
};

// Waits until every tensor this process has sent has been taken by a receiver, or `timeout`
// passes; returns how many are still waiting.
std::size_t flush(std::chrono::milliseconds timeout);

// Readies this process to exit with messages still queued: waits up to `timeout`, as flush()
// does, for the tensors that would not outlive it (on a queue attached without its custody fd,
// or whose custody refused them, and CUDA tensors); returns how many of those are still waiting.
// What its queues' custody holds needs no wait. A normal exit() calls it with
// FERRY_EXIT_LINGER_MS; calling it before _exit() is needed only for those tensors.
std::size_t flush_at_exit(std::chrono::milliseconds timeout);

// How long a normal exit waits in flush_at_exit(): FERRY_EXIT_LINGER_MS, 2 s by default. Throws
// Error(invalid_argument) for a bad value.
std::chrono::milliseconds exit_linger();

}  // namespace ferry
