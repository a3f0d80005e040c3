// A collector's batch, taken from a real queue that another process filled.
#include "runtime/supervisor/result_batch.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include "../../catch.hpp"

#include "ipc/error.hpp"

namespace ferry::supervisor {
namespace {

using namespace std::chrono_literals;

std::vector<std::int64_t> firsts(const std::vector<Tensors>& messages) {
  std::vector<std::int64_t> out;
  for (const Tensors& m : messages) out.push_back(m.at(0)[0].item<std::int64_t>());
  return out;
}

Errc code_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.code();
  }
}

}  // namespace

TEST_CASE("result batch: what is queued comes at once, in order, at most `most`, then it waits") {
  auto q = TensorQueue::create({64});
  // The sender is another process, gone before anything is taken: its messages are still there.
  const pid_t child = ::fork();
  if (child == 0) {
    for (std::int64_t i = 0; i < 5; ++i) q.send({at::full({2}, i, at::kLong)}, 5s);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);

  ResultBatch a = take_results(q, 3, 5s);
  CHECK_FALSE(a.failed);
  CHECK(firsts(a.messages) == std::vector<std::int64_t>{0, 1, 2});
  ResultBatch b = take_results(q, 64, 5s);
  CHECK_FALSE(b.failed);
  CHECK(firsts(b.messages) == std::vector<std::int64_t>{3, 4});
  CHECK(b.messages.at(1).at(0).sizes() == at::IntArrayRef{2});
  // Nothing queued: the wait runs out, and says so rather than throwing.
  ResultBatch c = take_results(q, 64, 0ms);
  CHECK(c.messages.empty());
  REQUIRE(c.failed);
  CHECK(code_of(c.failed) == Errc::timeout);
}

TEST_CASE("result batch: a closed queue gives what it held, then the close") {
  auto q = TensorQueue::create({64});
  q.send({at::full({1}, 7, at::kLong)}, 5s);
  q.send({at::full({1}, 8, at::kLong)}, 5s);
  q.close();
  ResultBatch a = take_results(q, 1, 5s);  // at most one, as asked
  CHECK(firsts(a.messages) == std::vector<std::int64_t>{7});
  ResultBatch b = take_results(q, 0, 5s);  // 0 still takes the one it waited for
  CHECK(firsts(b.messages) == std::vector<std::int64_t>{8});
  ResultBatch c = take_results(q, 64, 5s);
  CHECK(c.messages.empty());
  REQUIRE(c.failed);
  CHECK(code_of(c.failed) == Errc::closed);
}

}  // namespace ferry::supervisor
