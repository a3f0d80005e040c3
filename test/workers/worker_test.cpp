// The task registry, the worker executable's own command line, and how a failed task's reply
// carries its error.
#include "workers/task_registry.hpp"

#include <cstdio>
#include <string>

#include "../test_util.hpp"
#include "ipc/wire.hpp"
#include "runtime/worker_protocol.hpp"
#include "workers/worker_loop.hpp"

namespace ferry {
namespace {

std::string run(const std::string& cmd, int* code) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = ::pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST_CASE("the registry holds the built-in and the program's own tasks, sorted") {
  const auto names = task_names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  for (const char* n : {"echo", "square", "mlp", "torchscript", "sleep_echo"}) {
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
    CHECK(find_task(n) != nullptr);
  }
  CHECK(find_task("no_such_task") == nullptr);
}

TEST_CASE("registering a task name twice is an error naming it") {
  register_task("registered_once_in_this_test", [](TaskContext&, Tensors in) { return in; });
  CHECK_THROWS_WITH(
      register_task("registered_once_in_this_test", [](TaskContext&, Tensors in) { return in; }),
      Catch::Contains("'registered_once_in_this_test'") && Catch::Contains("twice"));
  CHECK_THROWS_AS(register_task("", [](TaskContext&, Tensors in) { return in; }), Error);
}

TEST_CASE("a worker executable lists its tasks, and refuses to be run by hand") {
  int code = 0;
  const std::string tasks = run(std::string(FERRY_TEST_WORKER) + " --list-tasks", &code);
  CHECK(code == 0);
  CHECK_THAT(tasks, Catch::Contains("sleep_echo\n") && Catch::Contains("mlp\n"));
  const std::string usage = run(FERRY_TEST_WORKER, &code);
  CHECK(code == kWorkerUsage);
  CHECK_THAT(usage, Catch::Contains("not run by hand"));
  // A control fd that is not a socket from a supervisor: a clear failure, not a hang.
  run(std::string(FERRY_TEST_WORKER) + " --ferry-control-fd 0 < /dev/null", &code);
  CHECK(code != 0);
}

TEST_CASE("an error's text travels in pieces that fit in their records, and joins back whole") {
  const std::size_t piece = wire::kInlineBytes;
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, piece, piece + 1, 5 * piece + 3}) {
    std::string text(n, 'x');
    for (std::size_t i = 0; i < n; ++i) text[i] = static_cast<char>('a' + i % 26);
    const std::vector<at::Tensor> m = protocol::text_tensors(text);
    CHECK(m.size() == std::max<std::size_t>(1, (n + piece - 1) / piece));
    for (const at::Tensor& t : m) {
      CHECK(t.scalar_type() == at::kByte);
      CHECK(static_cast<std::size_t>(t.nbytes()) <= piece);
    }
    std::vector<at::Tensor> message{at::zeros({9}, at::kLong)};  // the envelope comes first
    message.insert(message.end(), m.begin(), m.end());
    CHECK(protocol::tensors_text(message, 1) == text);
  }
  // Past a message's tensors, the text is cut and says how much went.
  const std::string huge(piece * protocol::kMaxTensorsPerTask + 1000, 'y');
  const std::vector<at::Tensor> m = protocol::text_tensors(huge);
  CHECK(m.size() == protocol::kMaxTensorsPerTask);
  const std::string back = protocol::tensors_text(m, 0);
  CHECK_THAT(back, Catch::EndsWith(" more bytes cut)"));
  CHECK_THAT(back, Catch::Contains(std::to_string(piece + 1000)));
  CHECK(back.rfind(std::string(piece * (protocol::kMaxTensorsPerTask - 1), 'y'), 0) == 0);
  // Anything else where the text should be is a bad record, not a crash.
  CHECK_THROWS_WITH(protocol::tensors_text({at::zeros({2}, at::kFloat)}, 0),
                    Catch::Contains("uint8"));
  // With less room (a detail takes the rest), the cut comes sooner.
  const std::vector<at::Tensor> less = protocol::text_tensors(huge, 10);
  CHECK(less.size() == 10);
  CHECK_THAT(protocol::tensors_text(less, 0), Catch::EndsWith(" more bytes cut)"));
  CHECK(protocol::tensors_text(less, 0, 3) == std::string(3 * piece, 'y'));
}

TEST_CASE(
    "a failure's detail travels whole, in records while it fits, and its envelope says "
    "how long") {
  const std::size_t piece = wire::kInlineBytes;
  const std::size_t most = piece * protocol::kMaxDetailPieces;
  CHECK(protocol::detail_tensors("").empty());
  for (const std::size_t n : {std::size_t{1}, piece, piece + 1, most}) {
    const std::string detail(n, static_cast<char>(n % 200));
    const std::vector<at::Tensor> m = protocol::detail_tensors(detail);
    CHECK(m.size() == (n + piece - 1) / piece);
    CHECK(protocol::tensors_text(m, 0) == detail);
    CHECK_FALSE(protocol::detail_needs_shared_memory(detail));
  }
  // Past the records' room: one tensor of it all, which shared memory carries.
  for (const std::size_t n : {most + 1, std::size_t{3} << 20}) {
    std::string detail(n, 'd');
    detail.back() = 'e';
    const std::vector<at::Tensor> m = protocol::detail_tensors(detail);
    CHECK(m.size() == 1);
    CHECK(protocol::tensors_text(m, 0) == detail);
    CHECK(protocol::detail_needs_shared_memory(detail));
  }
  protocol::ResultEnvelope e;
  e.task_id = 7;
  e.ok = false;
  e.detail_pieces = 5;
  const protocol::ResultEnvelope back = protocol::unpack_result(protocol::pack(e));
  CHECK(back.detail_pieces == 5);
  CHECK_FALSE(back.ok);
  // An envelope that claims more than a detail may take is a bad record.
  at::Tensor bad = protocol::pack(e);
  bad[8] = static_cast<std::int64_t>(protocol::kMaxDetailPieces + 1);
  CHECK_THROWS_WITH(protocol::unpack_result(bad), Catch::Contains("detail"));
  // An envelope still held is never written again by the next pack.
  protocol::ResultEnvelope other;
  other.task_id = 8;
  const at::Tensor second = protocol::pack(other);
  CHECK(protocol::unpack_result(second).task_id == 8);
  CHECK(bad.data_ptr() != second.data_ptr());
  CHECK(bad[2].item<std::int64_t>() == 7);
  const at::Tensor view = protocol::pack(e).slice(0, 0, 3);  // its storage held, not its tensor
  CHECK(protocol::unpack_result(protocol::pack(other)).task_id == 8);
  CHECK(view[2].item<std::int64_t>() == 7);
}

}  // namespace
}  // namespace ferry
