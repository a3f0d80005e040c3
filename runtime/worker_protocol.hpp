// What a supervisor and its workers say to each other (internal to ferry).
//
// Start-up is a handshake on the control socket: the supervisor sends a Hello (JSON) with the
// fds of the worker's two queues; the worker checks it, takes the pool's shared tensors from the
// head of its task queue, and answers a Welcome listing its tasks, or an error. After that
// everything moves through the queues as ordinary tensor messages whose first tensor is a small
// int64 envelope (which task, which attempt, and on the way back, how it went), so tasks and their
// tensors share one zero-copy path and one crash-safe ring.
#pragma once

#include <ATen/ATen.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ipc/stats.hpp"

namespace ferry::protocol {

// Bumped whenever any message below changes shape or meaning (3: a failure's detail; 4: the
// hello's shared_allocations; 5: a task's prelude; 6: the hello's third fd, the results queue's
// custody).
inline constexpr int kVersion = 6;
// Tensors one task may take or return (the queues are sized so in-flight work always fits).
inline constexpr std::size_t kMaxTensorsPerTask = 64;

struct Hello {
  int version = kVersion;
  pid_t supervisor_pid = 0;
  int worker_id = 0;
  std::string device;              // "cpu", "cuda:1"
  int threads = 1;                 // intra-op threads the worker should use
  bool shared_allocations = true;  // PoolOptions::shared_allocations
  std::map<std::string, std::string> config;
  // PoolOptions::shared, by name: its tensors are the first messages on the task queue, in this
  // order, kMaxTensorsPerTask to a message (shared_messages() of them).
  std::vector<std::string> shared;
};

// Messages that carry `n` shared tensors.
inline std::size_t shared_messages(std::size_t n) {
  return (n + kMaxTensorsPerTask - 1) / kMaxTensorsPerTask;
}

struct Welcome {
  int version = kVersion;
  pid_t pid = 0;
  std::string device;
  std::vector<std::string> tasks;
  std::string error;  // non-empty: the worker refuses to start, and says why
};

std::string encode(const Hello& h);
std::string encode(const Welcome& w);
// Throw Error(handshake) on a message that is not valid JSON of the right shape.
Hello decode_hello(const std::string& bytes);
Welcome decode_welcome(const std::string& bytes);

// First tensor of a message on a worker's task queue. A task with a prelude
// (runtime/prelude.hpp) names it; its `prelude_tensors` tensors follow the envelope when the
// worker lacks it (0: it holds it already), then the task's inputs. `forget` names a prelude the
// worker drops before this task (supervisor/prelude_book.hpp), 0 none.
struct TaskEnvelope {
  std::uint64_t task_id = 0;
  std::uint32_t attempt = 0;
  std::uint32_t task_index = 0;  // position in the Welcome's task list
  std::uint64_t prelude = 0;
  std::uint32_t prelude_tensors = 0;
  std::uint64_t forget = 0;
};

// First tensor of a message on a worker's result queue. On failure the tensors after it hold the
// task's error message (see text_tensors()), then `detail_pieces` pieces of its detail
// (TaskFailure). The worker's transport counters ride along so the supervisor can report
// per-worker zero-copy and copied bytes without another channel.
struct ResultEnvelope {
  std::uint64_t task_id = 0;
  std::uint32_t attempt = 0;
  bool ok = true;
  std::uint32_t detail_pieces = 0;
  std::uint64_t tensors_zero_copy = 0, bytes_zero_copy = 0;
  std::uint64_t tensors_copied = 0, bytes_copied = 0;
};

// The tensors may be this thread's own, written again by its next pack once nobody holds them.
at::Tensor pack(const TaskEnvelope& e);
at::Tensor pack(const ResultEnvelope& e);
// Throw Error(bad_record) when the tensor is not an envelope of that kind.
TaskEnvelope unpack_task(const at::Tensor& t);
ResultEnvelope unpack_result(const at::Tensor& t);

// A message as 1-d uint8 tensors of at most wire::kInlineBytes each, which travel inside their
// records (runtime/transport/in_record): a failed task's reply needs no shared memory, so a worker
// whose arena is full can still say why. Past `room` pieces (at most kMaxTensorsPerTask) the
// text is cut, and the last piece says how much was left out.
std::vector<at::Tensor> text_tensors(const std::string& text,
                                     std::size_t room = kMaxTensorsPerTask);
// Pieces a failure's detail may take, so its text keeps at least half of the reply.
inline constexpr std::size_t kMaxDetailPieces = kMaxTensorsPerTask / 2;
// A failure's detail, never cut: none when it is empty; pieces like text_tensors() while it fits
// in kMaxDetailPieces of them; past that, one tensor of it all, which travels in shared memory
// (a task's large exception arrives as itself), so the sender must be ready to fail without it.
std::vector<at::Tensor> detail_tensors(const std::string& detail);
// Whether detail_tensors(detail) needs shared memory to travel.
bool detail_needs_shared_memory(const std::string& detail) noexcept;
// The bytes of message[from], message[from + 1]... before message[to], joined;
// Error(bad_record) when one is not text.
std::string tensors_text(const std::vector<at::Tensor>& message, std::size_t from,
                         std::size_t to = static_cast<std::size_t>(-1));

}  // namespace ferry::protocol
