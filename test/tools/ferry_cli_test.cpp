// `ferry run` as a user runs it: real processes, files written and read back by Python's torch,
// signals from outside. [fork]: ferry run starts its workers by fork (its default on a CPU), which
// ThreadSanitizer cannot follow from a process with threads, so `make tsan` leaves these out.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../test_util.hpp"
#include "ipc/cuda/ipc_api.hpp"
#include "ipc/process.hpp"
#include "ipc/version.hpp"

namespace {

using namespace std::chrono_literals;
const std::string kFerry = FERRY_BIN;
const std::string kPython = "/usr/bin/python3";

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/ferry-cli-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ignored;  // a test's leftovers in /tmp are no reason to fail it
    std::filesystem::remove_all(path, ignored);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Ran {
  int code;
  std::string out, err;
};

Ran run(const TempDir& dir, const std::string& args, const std::string& env = "") {
  const int status = std::system((env + kFerry + " " + args + " >'" + (dir / "stdout") + "' 2>'" +
                                  (dir / "stderr") + "' </dev/null")
                                     .c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "stdout"),
          slurp(dir / "stderr")};
}

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Runs a Python snippet with Debian's torch; false (with a visible note) where there is none.
bool python(const TempDir& dir, const std::string& code) {
  std::ofstream(dir / "script.py") << "import sys, torch\n" << code;
  const int status =
      std::system((kPython + " '" + (dir / "script.py") + "' '" + dir.path + "'").c_str());
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// True, with a visible note, where Debian's Python has no torch to compare against.
bool skip_without_python_torch() {
  if (std::system((kPython + " -c 'import torch' 2>/dev/null").c_str()) == 0) return false;
  WARN("SKIP: " << kPython << " has no torch (apt-get install python3-torch)");
  return true;
}

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  const std::string base = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(base.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(base + "/" + e->d_name + "/children");
    for (pid_t c; f >> c;) out.push_back(c);
  }
  ::closedir(d);
  return out;
}

TEST_CASE("ferry --version prints the one version: project()'s, which libferry reports too") {
  TempDir dir;
  const Ran r = run(dir, "--version");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out == std::string(FERRY_PROJECT_VERSION) + "\n");
  CHECK(std::string(ferry::version()) == FERRY_PROJECT_VERSION);
}

TEST_CASE("ferry run with no options runs the built-in mlp and prints a summary", "[fork]") {
  TempDir dir;
  const Ran r = run(dir, "run");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("task 'mlp'") && Catch::Contains("200 tasks"));
  CHECK_THAT(r.out, Catch::Contains("tasks/s") && Catch::Contains("p50") &&
                        Catch::Contains("p99") && Catch::Contains("zero-copy"));
  // Not a terminal: plain progress lines, the last at 100%.
  CHECK_THAT(r.err, Catch::Contains("200/200 tasks (100%)"));
}

TEST_CASE("ferry run --json gives the summary as one document") {
  TempDir dir;
  const Ran r = run(dir, "run --json --task square --workers 2 --batches 30 --start spawn");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("task") == "square");
  CHECK(j.at("tasks") == 30);
  CHECK(j.at("failed") == 0);
  CHECK(j.at("tasks_per_second").get<double>() > 0);
  CHECK(j.at("latency_ms").at("p99").get<double>() >= j.at("latency_ms").at("p50").get<double>());
  CHECK(j.at("inputs").at("bytes_zero_copy") == 30 * 64 * 64 * 4);  // synthetic: in the arena
  CHECK(j.at("cuda").at("ferry_entered").is_null());  // CPU workers: the supervisor never did
  REQUIRE(j.at("workers").size() == 2);
  std::uint64_t tasks = 0;
  for (const auto& w : j.at("workers")) {
    CHECK(w.at("start") == "spawn");
    tasks += w.at("tasks").get<std::uint64_t>();
  }
  CHECK(tasks == 30);
}

TEST_CASE("ferry run --max-tasks-per-worker replaces each worker process after that many tasks") {
  TempDir dir;
  const Ran r = run(dir,
                    "run --json --task square --workers 2 --batches 30 --max-tasks-per-worker 4 "
                    "--start spawn");  // spawn: under TSan too (test/CMakeLists.txt, [fork])
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("tasks") == 30);
  CHECK(j.at("failed") == 0);
  std::uint64_t tasks = 0, replaced = 0;
  for (const auto& w : j.at("workers")) {
    tasks += w.at("tasks").get<std::uint64_t>();
    replaced += w.at("replaced").get<std::uint64_t>();
    CHECK(w.at("restarts") == 0);
  }
  CHECK(tasks == 30);
  CHECK(replaced >= 30 / 4 - 2);  // 8 processes ran them, 2 of which may still be alive
  const Ran bad = run(dir, "run --task square --max-tasks-per-worker -1");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--max-tasks-per-worker"));
}

TEST_CASE("ferry run's large results come back zero-copy, copied with --shared-allocations off") {
  TempDir dir;
  const std::string job = "run --json --task square --features 4096 --batches 20 --start spawn ";
  const Ran on = run(dir, job);
  INFO(on.err);
  REQUIRE(on.code == 0);
  const auto j = nlohmann::json::parse(on.out);
  CHECK(j.at("results").at("bytes_zero_copy") == 20 * 64 * 4096 * 4);
  CHECK(j.at("results").at("bytes_copied") == 0);
  const Ran off = run(dir, job + "--shared-allocations off");
  INFO(off.err);
  REQUIRE(off.code == 0);
  const auto k = nlohmann::json::parse(off.out);
  CHECK(k.at("results").at("bytes_zero_copy") == 0);
  CHECK(k.at("results").at("bytes_copied") == 20 * 64 * 4096 * 4);
  // The summary says why small results are copied, and why all are with it off.
  const Ran mlp = run(dir, "run --batches 10 --start spawn");
  CHECK_THAT(mlp.out, Catch::Contains("2.5 KiB a result: under 64.0 KiB, results are copied by "
                                      "design"));
  const Ran square =
      run(dir, "run --task square --batches 10 --start spawn --shared-allocations off");
  CHECK_THAT(square.out, Catch::Contains("copied (--shared-allocations off)"));
}

TEST_CASE("input and output files round-trip with Python's torch.save and torch.load", "[fork]") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  REQUIRE(python(dir, R"(
d = sys.argv[1]
g = torch.Generator().manual_seed(3)
xs = [torch.randn(5, 7, generator=g), torch.arange(12, dtype=torch.int64).reshape(3, 4),
      torch.randn(4, 3, dtype=torch.float64, generator=g).t(), torch.tensor(2.5)]
torch.save(xs, d + '/in.pt')
torch.save(tuple(xs), d + '/in_tuple.pt')
)"));
  for (const char* in : {"in.pt", "in_tuple.pt"}) {
    const Ran r = run(dir, "run --task square --workers 2 --input " + (dir / in) + " --output " +
                               (dir / "out.pt"));
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("wrote 4 results"));
    CHECK(python(dir, R"(
d = sys.argv[1]
# weights_only: PyTorch 2.6's default, which refuses anything but tensors and containers
xs, ys = torch.load(d + '/in.pt'), torch.load(d + '/out.pt', weights_only=True)
assert isinstance(ys, list) and len(ys) == len(xs), ys
for x, y in zip(xs, ys):
    assert y.dtype == x.dtype and y.shape == x.shape, (x, y)
    assert torch.equal(y, x * x), (x, y)
)"));
  }
}

TEST_CASE("ferry run --input sends each task's inputs zero-copy, moved into shared memory once",
          "[fork]") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  // 40 tasks over 3 storages, two of them through views as well (a transpose, a slice): each
  // storage moves once, and every view reads its own values after the move. The 0-d tensor is
  // left where it is: it travels inside its wire record, as it did before.
  REQUIRE(python(dir, R"(
d = sys.argv[1]
g = torch.Generator().manual_seed(5)
a, b = torch.randn(64, 64, generator=g), torch.randn(32, 16, dtype=torch.float64, generator=g)
c = torch.arange(4096, dtype=torch.int32).reshape(64, 64)
xs = [[a, a.t(), b, b[3:9], c][i % 5] for i in range(40)]
torch.save(xs, d + '/in.pt')
torch.save(xs + [torch.tensor(2.5)], d + '/in_small.pt')
)"));
  for (const char* in : {"in.pt", "in_small.pt"}) {
    const Ran r = run(dir,
                      "run --json --task square --workers 2 --input " + (dir / in) + " --output " +
                          (dir / "out.pt"),
                      "FERRY_LOG=debug ");
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.err, Catch::Contains("moved into shared memory once, sent zero-copy"));
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("inputs").at("bytes_zero_copy").get<std::uint64_t>() > 0);
    CHECK(j.at("inputs").at("bytes_copied") == 0);
    CHECK(python(dir,
                 "d = sys.argv[1]\n"
                 "xs = torch.load(d + '/" +
                     std::string(in) + R"(')
ys = torch.load(d + '/out.pt', weights_only=True)
assert len(ys) == len(xs), (len(xs), len(ys))
for x, y in zip(xs, ys):
    assert y.dtype == x.dtype and torch.equal(y, x * x), (x, y)
)"));
  }
}

TEST_CASE("ferry run --input leaves rows of one tensor where they are: each travels in its record",
          "[fork]") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  // list(x) saves 40 views of one 1280-byte storage, each row 32 bytes: a record carries a row
  // cheaper than a lease on a shared block would, so nothing moves.
  REQUIRE(python(dir,
                 "torch.save(list(torch.arange(320.).reshape(40, 8)), sys.argv[1] + "
                 "'/rows.pt')\n"));
  const Ran r = run(dir, "run --json --task square --workers 2 --input " + (dir / "rows.pt"),
                    "FERRY_LOG=debug ");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("--input: no input storage travels outside a wire record"));
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("tasks") == 40);
  CHECK(j.at("failed") == 0);
}

TEST_CASE("ferry run --input takes a dict, and lists, tuples or dicts of several tensors a task",
          "[fork]") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  // Dicts and lists of one item are the ones LibTorch 1.13's unpickler cannot read as Python
  // writes them (tools/pickle_compat.hpp); a state_dict is an OrderedDict with _metadata.
  REQUIRE(python(dir, R"(
d = sys.argv[1]
x = [torch.full((2, 3), float(i + 1)) for i in range(6)]
cases = {
    'dict': {'a': x[0], 'b': x[1], 'c': x[2]},
    'one_dict': {'a': x[0]},
    'one_list': [x[0]],
    'lists': [[x[0], x[1]], [x[2], x[3]]],
    'tuples': [(x[0], x[1]), (x[2],)],
    'dicts': [{'x': x[0], 'y': x[1]}, {'x': x[2], 'y': x[3]}],
    'one_item_dicts': [{'x': x[0]}, {'x': x[1]}],
    'mixed': [x[0], [x[1], x[2]], {'m': x[3]}, (x[4], x[5])],
    'dict_of_lists': {'a': [x[0], x[1]], 'b': {'c': x[2]}},
    'state_dict': torch.nn.Linear(3, 2).state_dict(),
}
for name, v in cases.items():
    torch.save(v, d + '/' + name + '.pt')
)"));
  for (const char* name : {"dict", "one_dict", "one_list", "lists", "tuples", "dicts",
                           "one_item_dicts", "mixed", "dict_of_lists", "state_dict"}) {
    INFO(name);
    const Ran r = run(dir, "run --task square --workers 2 --input " + (dir / name) +
                               ".pt --output " + (dir / name) + ".out.pt");
    INFO(r.err);
    REQUIRE(r.code == 0);
  }
  // Each task's result: the squares of its tensors in the order given (one tensor where it had
  // one), the tasks in the file's order.
  CHECK(python(dir, R"(
d = sys.argv[1]
def tasks(v):
    items = list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, (list, tuple)) else [v]
    return [[i] if isinstance(i, torch.Tensor) else list(i.values()) if isinstance(i, dict) else list(i)
            for i in items]
for name in ['dict', 'one_dict', 'one_list', 'lists', 'tuples', 'dicts', 'one_item_dicts', 'mixed',
             'dict_of_lists', 'state_dict']:
    want = tasks(torch.load(d + '/' + name + '.pt'))
    got = torch.load(d + '/' + name + '.out.pt', weights_only=True)
    assert len(got) == len(want), (name, got)
    for w, g in zip(want, got):
        g = [g] if isinstance(g, torch.Tensor) else g
        assert len(g) == len(w), (name, w, g)
        for a, b in zip(w, g):
            assert torch.equal(b, a.detach() * a.detach()), (name, a, b)
)"));
}

TEST_CASE("ferry run --input of another shape is refused: where in the file, what, what is taken") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  REQUIRE(python(dir, R"(
d = sys.argv[1]
x = torch.ones(2)
torch.save([x, {'x': x, 'mask': 'none'}], d + '/str.pt')
torch.save({'a': [x, [x]]}, d + '/deep.pt')
torch.save([x, []], d + '/empty.pt')
torch.save([[x] * 65], d + '/many.pt')
torch.save([x], d + '/protocol4.pt', pickle_protocol=4)
class Box:
    pass
torch.save([x, Box()], d + '/object.pt')
)"));
  const std::string shapes =
      "; it takes a tensor (one task), or a list, tuple or dict with one task per item, each item "
      "a tensor or a list, tuple or dict of tensors (that task's inputs, in order)\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"str.pt", "' holds a str at [1]['mask']" + shapes},
      {"deep.pt", "' holds a list at ['a'][1]" + shapes},
      {"empty.pt", "' holds an empty list at [1]" + shapes},
      {"many.pt",
       "' holds 65 tensors for the task at [0]; a task takes at most 64 (stack or concatenate "
       "them, or split the task)\n"},
      {"protocol4.pt",
       "' was pickled with protocol 4, where LibTorch reads 2 only, torch.save's default: leave "
       "out torch.save's pickle_protocol\n"},
      {"object.pt", "' holds something LibTorch cannot read ("},
  };
  for (const auto& [file, says] : cases) {
    const Ran r = run(dir, "run --task square --workers 1 --input " + (dir / file));
    INFO(r.out << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::StartsWith("ferry: --input '" + (dir / file) + says));
    // One line: LibTorch's backtrace is for FERRY_LOG=debug only.
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, !Catch::Contains("Exception raised from") && !Catch::Contains("frame #"));
  }
  const Ran debug =
      run(dir, "run --task square --workers 1 --input " + (dir / "object.pt"), "FERRY_LOG=debug ");
  CHECK(debug.code == 2);
  CHECK_THAT(debug.err, Catch::Contains("unpickling --input '" + (dir / "object.pt") + "'"));
}

// ferry run --task torchscript on dir's model.pt and in.pt, into out.pt, with 2 workers.
void run_model(const TempDir& dir) {
  const Ran r = run(dir, "run --task torchscript --model " + (dir / "model.pt") + " --input " +
                             (dir / "in.pt") + " --output " + (dir / "out.pt") + " --workers 2");
  INFO(r.err);
  REQUIRE(r.code == 0);
}

TEST_CASE("ferry run --task torchscript gives what Python gets running the model itself",
          "[fork]") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  REQUIRE(python(dir, R"(
d = sys.argv[1]
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)
    def forward(self, x):
        return torch.softmax(self.b(torch.relu(self.a(x))), dim=1)
m = torch.jit.script(Net().eval())
m.save(d + '/model.pt')
xs = [torch.randn(8, 16) for _ in range(12)]
torch.save(xs, d + '/in.pt')
with torch.no_grad():
    torch.save([m(x) for x in xs], d + '/expected.pt')
)"));
  run_model(dir);
  CHECK(python(dir, R"(
d = sys.argv[1]
want, got = torch.load(d + '/expected.pt'), torch.load(d + '/out.pt', weights_only=True)
assert len(want) == len(got) == 12
for w, g in zip(want, got):
    assert w.shape == g.shape, (w.shape, g.shape)
    assert torch.allclose(w, g, rtol=1e-5, atol=1e-6), (w - g).abs().max()
)"));
}

TEST_CASE("a model returning several tensors gives a list of them per input, for torch.load",
          "[fork]") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  REQUIRE(python(dir, R"(
d = sys.argv[1]
class Two(torch.nn.Module):
    def forward(self, x):
        return x * 2, x.sum(dim=0)
torch.jit.script(Two()).save(d + '/model.pt')
torch.save([torch.full((2, 3), float(i)) for i in range(5)], d + '/in.pt')
)"));
  run_model(dir);
  CHECK(python(dir, R"(
d = sys.argv[1]
got = torch.load(d + '/out.pt', weights_only=True)
assert isinstance(got, list) and len(got) == 5, got
for i, (a, b) in enumerate(got):
    assert torch.equal(a, torch.full((2, 3), 2.0 * i)), a
    assert torch.equal(b, torch.full((3,), 2.0 * i)), b
)"));
}

TEST_CASE("SIGTERM or SIGINT to ferry run stops it cleanly: no worker left, no segment left",
          "[fork]") {
  for (const int sig : {SIGTERM, SIGINT}) {
    TempDir dir;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // as a job in a shell: SIGINT reaches its workers too
      const std::string out = dir / "out", err = dir / "err";
      if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr))
        ::_exit(126);
      ::execl(kFerry.c_str(), kFerry.c_str(), "run", "--task", "square", "--workers", "2",
              "--batches", "100000000", nullptr);
      ::_exit(127);
    }
    std::vector<pid_t> workers;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (workers.size() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
      workers = children_of(pid);
    }
    REQUIRE(workers.size() == 2);
    std::this_thread::sleep_for(300ms);  // mid-run, tasks in flight
    // SIGINT as a terminal sends it: to the whole process group.
    ::kill(sig == SIGINT ? -pid : pid, sig);
    const int code = ferry::test::wait_child(pid, std::chrono::seconds(30));
    INFO(slurp(dir / "err"));
    CHECK(code == 128 + sig);
    CHECK_THAT(slurp(dir / "err"), Catch::Contains("stopped by"));
    for (pid_t w : workers) CHECK_FALSE(ferry::process_alive(w));
    workers.push_back(pid);
    CHECK(ferry::test::shm_names_of(workers).empty());
  }
}

// The thread of test/tools/early_thread.cpp in `pid`, found by its name; 0 until it shows.
pid_t early_thread_of(pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid) + "/task";
  pid_t found = 0;
  if (DIR* d = ::opendir(base.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::string comm;
      std::ifstream(base + "/" + e->d_name + "/comm") >> comm;
      if (comm == "ferry-early") found = static_cast<pid_t>(std::atoi(e->d_name));
    }
    ::closedir(d);
  }
  return found;
}

TEST_CASE("SIGTERM taken by a thread that started before ferry run's main still stops it cleanly") {
  // Such a thread has the signal unblocked, and the kernel may give it a process-directed
  // SIGTERM (a CUDA driver's threads took it on a GPU machine). Sent to that thread itself, the
  // default action would end ferry run at once: exit 143 still, but no message, and no workers
  // stopped. Spawned workers, so ThreadSanitizer runs it too.
  TempDir dir;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const std::string out = dir / "out", err = dir / "err";
    if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr))
      ::_exit(126);
    ::setenv("LD_PRELOAD", FERRY_EARLY_THREAD_LIB, 1);
    // Under ASan the preloaded library comes before the sanitizer's runtime, which it allows.
    const char* asan = std::getenv("ASAN_OPTIONS");
    const std::string asan_options =
        std::string(asan ? asan : "") + (asan ? ":" : "") + "verify_asan_link_order=0";
    ::setenv("ASAN_OPTIONS", asan_options.c_str(), 1);
    ::execl(kFerry.c_str(), kFerry.c_str(), "run", "--task", "square", "--workers", "2", "--start",
            "spawn", "--batches", "100000000", nullptr);
    ::_exit(127);
  }
  std::vector<pid_t> workers;
  pid_t early = 0;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while ((workers.size() < 2 || early == 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    workers = children_of(pid);
    early = early_thread_of(pid);
  }
  INFO(slurp(dir / "err"));
  REQUIRE(early != 0);
  REQUIRE(workers.size() == 2);
  std::this_thread::sleep_for(300ms);  // mid-run
  REQUIRE(::syscall(SYS_tgkill, pid, early, SIGTERM) == 0);
  const int code = ferry::test::wait_child(pid, std::chrono::seconds(30));
  INFO(slurp(dir / "err"));
  CHECK(code == 128 + SIGTERM);
  CHECK_THAT(slurp(dir / "err"), Catch::Contains("stopped by SIGTERM"));
  for (pid_t w : workers) CHECK_FALSE(ferry::process_alive(w));
  workers.push_back(pid);
  CHECK(ferry::test::shm_names_of(workers).empty());
}

TEST_CASE("bad arguments and inputs are exit code 2 with the bad value named") {
  TempDir dir;
  Ran r = run(dir, "run --start vfork");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("vfork"));
  r = run(dir, "run --input /nonexistent/in.pt");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("/nonexistent/in.pt"));
  r = run(dir, "run --task no_such_task --workers 1");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("no_such_task"));
  r = run(dir, "run --task torchscript");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("--model"));
  r = run(dir, "run --devices cpu,tpu:0");
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("'tpu:0'"));
  std::ofstream(dir / "junk.pt") << "not a torch file";
  r = run(dir, "run --input " + (dir / "junk.pt"));
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("torch.save"));
}

TEST_CASE("ferry run checks shared memory first: a /dev/shm too small stops it with the remedy") {
  TempDir dir;
  ferry::test::in_child([&] {
    ferry::test::private_tmpfs(16 << 20);  // a container's small /dev/shm, in this child only
    const Ran r = run(dir, "run --workers 2 --batches 5");
    if (r.code != 3 || r.err.find("ferry: shm_exhausted: ") == std::string::npos ||
        r.err.find("shm_reserve") == std::string::npos ||
        r.err.find("--shm-size") == std::string::npos) {
      std::fprintf(stderr, "code %d, stderr:\n%s\n", r.code, r.err.c_str());
      ::_exit(1);
    }
  });
}

TEST_CASE("ferry run --worker PROGRAM spawns it under the default --start, and runs its tasks") {
  TempDir dir;
  const Ran r = run(dir, "run --task whoami --workers 1 --batches 2 --json --worker " +
                             std::string(FERRY_TEST_WORKER));
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc.at("tasks") == 2);
  CHECK(doc.at("failed") == 0);
  CHECK(r.out.find("\"spawn\"") != std::string::npos);
}

TEST_CASE("ferry run --worker PROGRAM --start fork is refused, naming both flags, exit 2") {
  TempDir dir;
  const Ran r = run(dir, "run --task whoami --workers 1 --batches 2 --start fork --worker " +
                             std::string(FERRY_TEST_WORKER));
  INFO(r.out << r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("--worker '" + std::string(FERRY_TEST_WORKER) + "'") &&
                        Catch::Contains("drop --start fork"));
}

TEST_CASE("ferry run --model FILE alone runs the TorchScript task, not the default mlp", "[fork]") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  REQUIRE(python(dir, R"(
d = sys.argv[1]
m = torch.jit.script(torch.nn.Linear(4, 2).eval())
m.save(d + '/model.pt')
torch.save([torch.randn(3, 4) for _ in range(5)], d + '/in.pt')
)"));
  const Ran r = run(dir, "run --model " + (dir / "model.pt") + " --input " + (dir / "in.pt") +
                             " --output " + (dir / "out.pt") + " --workers 1");
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("task 'torchscript'"));
  CHECK(python(dir, R"(
d = sys.argv[1]
out = torch.load(d + '/out.pt')
assert len(out) == 5 and all(t.shape == (3, 2) for t in out), [t.shape for t in out]
)"));
}

TEST_CASE("ferry run --model FILE with a built-in task that takes none is refused, exit 2") {
  TempDir dir;
  const Ran r = run(dir, "run --task mlp --model net.pt --batches 2");
  INFO(r.out << r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err,
             Catch::Contains("--model 'net.pt'") && Catch::Contains("'mlp', which takes no model"));
}

TEST_CASE("ferry run --model that is not TorchScript is refused up front, naming the file, exit 2",
          "[fork]") {
  if (skip_without_python_torch()) return;
  TempDir dir;
  REQUIRE(python(dir, R"(
d = sys.argv[1]
torch.save(torch.nn.Linear(4, 2).state_dict(), d + '/weights.pt')
open(d + '/notes.txt', 'w').write('not a model')
)"));
  const Ran sd = run(dir, "run --model " + (dir / "weights.pt") + " --batches 4 --workers 1");
  INFO(sd.out << sd.err);
  CHECK(sd.code == 2);
  CHECK_THAT(sd.err, Catch::Contains("--model '" + (dir / "weights.pt") +
                                     "' is a file of "
                                     "torch.save") &&
                         Catch::Contains("torch.jit.save") && !Catch::Contains("frame #"));
  CHECK(std::count(sd.err.begin(), sd.err.end(), '\n') == 1);  // one line, before any worker
  CHECK_THAT(sd.out, !Catch::Contains("worker"));
  const Ran txt = run(
      dir, "run --task torchscript --model " + (dir / "notes.txt") + " --batches 4 --workers 1");
  INFO(txt.out << txt.err);
  CHECK(txt.code == 2);
  CHECK_THAT(txt.err, Catch::Contains("'" + (dir / "notes.txt") +
                                      "' is neither a TorchScript "
                                      "module nor a file of torch.save") &&
                          !Catch::Contains("frame #"));
}

TEST_CASE(
    "ferry run on a pipe says when its workers are ready, and shows progress while a long "
    "task runs") {
  TempDir dir;
  // One task that runs until --timeout-ms kills it, 12 s in: the 10 s line must come first.
  const Ran r = run(dir,
                    "run --task hang --workers 1 --batches 1 --retries 0 --timeout-ms 12000 "
                    "--worker " +
                        std::string(FERRY_TEST_WORKER));
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("ferry: 1 worker ready (spawn: cpu) in "));
  const auto waiting = r.err.find("ferry: 0/1 tasks (0%), 0 failed, 1");
  const auto ended = r.err.find("ferry: 1/1 tasks (100%), 1 failed, ");
  CHECK(waiting != std::string::npos);
  CHECK(ended != std::string::npos);
  CHECK(waiting < ended);
}

TEST_CASE("when its workers keep failing to start, ferry run ends with exit 3 and names them") {
  TempDir dir;
  // Both workers start, then every restart crashes by itself (ferry-test-worker's start plan):
  // each slot is given up after 2 such starts, and with none left the run ends.
  std::ofstream(dir / "plan") << "ok\nok\ncrash\ncrash\ncrash\ncrash\n";
  const Ran r = run(dir,
                    "run --task segfault --workers 2 --batches 20 --retries 50 --start spawn "
                    "--max-start-crashes 2 --restart-backoff-ms 10 --worker " +
                        std::string(FERRY_TEST_WORKER) + " --output " + (dir / "out.pt"),
                    "FERRY_TEST_START_PLAN='" + (dir / "plan") + "' ");
  INFO(r.out << r.err);
  CHECK(r.code == 3);
  CHECK_THAT(r.err,
             Catch::Contains("no worker can be started") && Catch::Contains("exited with code 3"));
  CHECK_THAT(r.out, Catch::Contains("worker 0 (cpu) given up; its last start: worker 0 (cpu) "
                                    "ended during its start-up, exited with code 3") &&
                        Catch::Contains("worker 1 (cpu) given up"));
  CHECK_THAT(r.err, !Catch::Contains("terminate called"));
  // The pool's error once: not again for each task that failed with it.
  CHECK(occurrences(r.err, "no worker can be started") == 1);
  CHECK_THAT(r.err, Catch::Contains(" task(s) failed with it)"));
  CHECK(::access((dir / "out.pt").c_str(), F_OK) != 0);  // no partial output written
}

TEST_CASE("a pool that cannot start says why once on stderr, not again for each retry") {
  TempDir dir;
  // A worker that fails at every start, as one missing a library would: each slot is retried
  // (the restart policy), then given up, and the pool does not start.
  std::ofstream(dir / "worker.sh") << "#!/bin/sh\necho 'worker.sh: no weights here' >&2\nexit 1\n";
  ::chmod((dir / "worker.sh").c_str(), 0755);
  const Ran r = run(dir,
                    "run --task square --workers 2 --batches 2 --restart-backoff-ms 10 "
                    "--worker " +
                        (dir / "worker.sh"));
  INFO(r.out << r.err);
  CHECK(r.code == 3);
  CHECK(occurrences(r.err, "ended during its start-up") == 1);
  CHECK_THAT(r.err, Catch::StartsWith("worker.sh: no weights here\n") &&
                        Catch::Contains("ferry: handshake: worker ") &&
                        Catch::Contains("(gave up: 3 failed starts in a row by its own fault)"));
  // A device this machine lacks: its worker refuses to start, and says why once.
  const Ran gpu = run(dir, "run --devices cuda:7 --batches 2");
  INFO(gpu.out << gpu.err);
  if (gpu.code == 0) return;  // a machine with eight GPUs
  CHECK(gpu.code == 3);
  CHECK(occurrences(gpu.err, "(cuda:7)") == 1);
}

TEST_CASE("a task's LibTorch error reaches ferry run's stderr without LibTorch's C++ backtrace") {
  TempDir dir;
  // sleep_echo reads its first tensor as a number: a synthetic [64, 64] batch makes at::item()
  // throw, a c10::Error whose what() carries the frames.
  const Ran r = run(dir, "run --task sleep_echo --workers 1 --batches 1 --worker " +
                             std::string(FERRY_TEST_WORKER));
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("a Tensor with 4096 elements cannot be converted to Scalar") &&
                        !Catch::Contains("Exception raised from") && !Catch::Contains("frame #"));
}

TEST_CASE("ferry run reports a failed shared-memory check by the code of the check that failed") {
  TempDir dir;
  ferry::test::in_child([&] {
    // No such directory: the job cannot make a segment at all, which is not a lack of room.
    ::setenv("FERRY_SHM_DIR", (dir / "missing").c_str(), 1);
    const Ran r = run(dir, "run --workers 1 --batches 2");
    if (r.code != 3 || r.err.find("ferry: shm_failed: ") == std::string::npos ||
        r.err.find("shm_dir: ") == std::string::npos ||
        r.err.find(dir / "missing") == std::string::npos) {
      std::fprintf(stderr, "code %d, stderr:\n%s\n", r.code, r.err.c_str());
      ::_exit(1);
    }
  });
}

TEST_CASE("ferry run --help explains each flag and the exit codes") {
  TempDir dir;
  const Ran r = run(dir, "run --help");
  CHECK(r.code == 0);
  for (const char* flag : {"--workers", "--devices", "--start", "--task", "--model", "--input",
                           "--output", "--batches", "--batch-size", "--json", "Exit codes"}) {
    CHECK_THAT(r.out, Catch::Contains(flag));
  }
}

}  // namespace

TEST_CASE("ferry run --devices cuda:0,cuda:0 --task mlp runs on the GPU end to end", "[gpu]") {
  if (!ferry::cuda::available()) {
    std::fprintf(stderr, "SKIP: GPU test: no CUDA device (or driver) on this machine\n");
    std::fflush(nullptr);
    std::_Exit(77);
  }
  TempDir dir;
  const Ran r = run(dir, "run --json --devices cuda:0,cuda:0 --task mlp --batches 40 --output '" +
                             (dir / "out.pt") + "'");
  if (r.code != 0 && r.err.find("LibTorch has no CUDA") != std::string::npos) {
    std::fprintf(stderr, "SKIP: GPU test: ferry was built against a LibTorch without CUDA\n");
    std::fflush(nullptr);
    std::_Exit(77);
  }
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("tasks") == 40);
  CHECK(j.at("failed") == 0);
  // Batches were staged on the device once and reached the workers by handle; the results came
  // back the same way.
  CHECK(j.at("inputs").at("bytes_zero_copy") == 40 * 64 * 64 * 4);
  CHECK(j.at("cuda").at("tensors_sent_zero_copy") == 40);
  CHECK(j.at("cuda").at("handles_opened").get<int>() >= 1);
  CHECK(j.at("results").at("bytes_copied") == 0);
  for (const auto& w : j.at("workers")) CHECK(w.at("device") == "cuda:0");
  std::ifstream out(dir / "out.pt");
  CHECK(out.good());
}
