// The examples of docs/embedding.md, run by the embedding_consumer test against an installed
// ferry: a parent hands a shared-memory tensor to a forked child, which checks it and answers;
// then a pool spawns the user's own worker executable (my_worker.cpp) and runs its task.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include "runtime/ferry.hpp"

namespace {

using namespace std::chrono_literals;

// Bounded so that a broken queue fails the test instead of hanging it.
constexpr auto kWait = 30s;

at::Tensor expected() {
  return at::arange(16, at::kFloat).view({4, 4});
}

// The child: receive the tensor, check it, send back twice its values.
int child(ferry::TensorQueue& requests, ferry::TensorQueue& replies) {
  ferry::Tensors msg = requests.recv(kWait);
  if (msg.size() != 1 || msg[0].sizes() != at::IntArrayRef{4, 4} ||
      msg[0].scalar_type() != at::kFloat || !at::equal(msg[0], expected())) {
    std::fprintf(stderr, "child: received the wrong tensor\n");
    return 1;
  }
  replies.send({msg[0] * 2}, kWait);
  msg.clear();
  // The reply lives in this process's arena: stay alive until the parent has taken it.
  try {
    requests.recv(kWait);
  } catch (const ferry::Error& e) {
    if (e.code() == ferry::Errc::closed) return 0;
    throw;
  }
  std::fprintf(stderr, "child: expected the parent to close the queue\n");
  return 1;
}

int parent(ferry::TensorQueue& requests, ferry::TensorQueue& replies, pid_t pid) {
  at::Tensor t = ferry::empty_shared({4, 4}, at::kFloat);
  t.copy_(expected());
  if (!ferry::is_shared(t)) {
    std::fprintf(stderr, "parent: empty_shared() returned a tensor outside the arena\n");
    return 1;
  }
  requests.send({t}, kWait);

  ferry::Tensors reply = replies.recv(kWait);
  bool ok = reply.size() == 1 && at::equal(reply[0], expected() * 2);
  reply.clear();
  requests.close();

  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "parent: child failed (wait status %d)\n", status);
    return 1;
  }
  if (!ok) {
    std::fprintf(stderr, "parent: wrong reply\n");
    return 1;
  }
  std::printf("ferry_consumer: queue ok\n");
  return 0;
}

// A pool of the user's own worker, started by spawn, runs the user's task.
int own_worker() {
  ferry::PoolOptions o;
  o.devices = {"cpu"};
  o.start = ferry::Start::Spawn;
  o.worker_executable = MY_WORKER;
  ferry::Pool pool(o);
  const at::Tensor x = at::arange(1, 101, at::kFloat);
  ferry::Tensors out = pool.submit("normalise", {x}).get();
  const at::Tensor want = (x - x.mean()) / x.std();
  if (out.size() != 1 || !at::allclose(out[0], want)) {
    std::fprintf(stderr, "parent: the worker's normalise gave a wrong result\n");
    return 1;
  }
  // The same through call(), whose waiting thread takes the result itself.
  ferry::Pool::Call c = pool.call("normalise", {x});
  std::optional<ferry::Tensors> called = c.wait(std::chrono::seconds(60));
  if (!called || called->size() != 1 || !at::allclose((*called)[0], want)) {
    std::fprintf(stderr, "parent: call() of the worker's normalise gave a wrong result\n");
    return 1;
  }
  std::printf("ferry_consumer: own worker ok\n");
  return 0;
}

}  // namespace

int main() {
  try {
    // Created before fork, so both processes hold them.
    ferry::TensorQueue requests = ferry::TensorQueue::create();
    ferry::TensorQueue replies = ferry::TensorQueue::create();
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      int rc = 1;
      try {
        rc = child(requests, replies);
      } catch (const ferry::Error& e) {
        std::fprintf(stderr, "child: %s (code %s)\n", e.what(), ferry::errc_name(e.code()));
      }
      // Skip the parent's atexit handlers and static destructors: they are the parent's to run.
      _exit(rc);
    }
    if (const int rc = parent(requests, replies, pid); rc != 0) return rc;
    return own_worker();
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "parent: %s (code %s)\n", e.what(), ferry::errc_name(e.code()));
    return 1;
  }
}
