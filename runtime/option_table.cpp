#include "runtime/option_table.hpp"

#include "ipc/error.hpp"

namespace ferry {
namespace {

constexpr unsigned kEverywhere = kUsePool | kUseServe | kUseHost | kUseRun;
constexpr unsigned kHosts = kUseServe | kUseHost;
constexpr unsigned kCommands = kUseHost | kUseRun;
constexpr double kNoLimit = 1073741824.0;  // 2^30

}  // namespace

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = {
      // This machine's workers.
      {"workers", "processes", "--workers", OptionKind::count, 1, 1024, "one per core",
       "CPU workers", kEverywhere},
      {"devices", "devices", "--devices", OptionKind::list, 0, 0,
       "a CPU worker per core (ferry run, ferry host: and one per GPU LibTorch can use)",
       "one worker per entry, e.g. cpu,cpu,cuda:0 (instead of workers)", kEverywhere},
      {"start", "", "--start", OptionKind::choice, 0, 0, "auto",
       "how workers start: fork (only while CUDA is uninitialised here), spawn (runs the worker "
       "executable), auto (fork when safe)",
       kCommands, "auto|fork|spawn"},
      {"worker", "", "--worker", OptionKind::text, 0, 0, "ferry-worker beside this program",
       "the worker executable, spawned", kCommands},
      {"model", "", "--model", OptionKind::text, 0, 0, "none",
       "TorchScript file for the torchscript task (implies it)", kCommands},
      {"threads_per_worker", "threads_per_worker", "--threads-per-worker", OptionKind::count, 0,
       1024, "0: the cores divided among the workers", "intra-op threads in each worker",
       kEverywhere},
      {"shared_allocations", "shared_allocations", "--shared-allocations", OptionKind::flag, 0, 0,
       "on",
       "tensors a task makes of 64 KiB or more are born in the worker's shared memory and come "
       "back without a copy; off: they are copied when sent",
       kEverywhere},
      // Tasks, failures and restarts.
      {"maxtasks_inflight", "maxtasks_inflight", "--maxtasks-inflight", OptionKind::count, 0, 1000,
       "0 (Python: None): the pool chooses, 3 to 64, by its tasks' time and size; python3 -m "
       "ferry host: 3",
       "tasks one worker holds at most", kEverywhere},
      {"retries", "retries", "--retries", OptionKind::count, 0, 100, "2",
       "times a task lost with its worker is retried", kEverywhere},
      {"max_tasks_per_worker", "maxtasksperchild", "--max-tasks-per-worker", OptionKind::count, 0,
       1099511627776.0, "0 (Python: None): no end",
       "tasks a worker process runs before a fresh one replaces it, as multiprocessing's "
       "maxtasksperchild",
       kEverywhere},
      {"task_timeout", "task_timeout", "--timeout-ms", OptionKind::seconds, 0, kNoLimit,
       "0 (Python: None): no limit", "kill a worker whose task runs longer; the task is retried",
       kEverywhere},
      {"start_timeout", "start_timeout", "--start-timeout-ms", OptionKind::seconds, 1, kNoLimit,
       "60 s", "a worker's start-up and handshake, then it counts as a failed start", kEverywhere},
      {"max_failed_starts", "", "--max-failed-starts", OptionKind::count, 1, 1000, "10",
       "failed starts in a row, any cause, before a worker slot is given up", kCommands},
      {"max_start_crashes", "", "--max-start-crashes", OptionKind::count, 1, 1000, "3",
       "failed starts in a row by the worker's own fault before it is given up", kCommands},
      {"restart_backoff", "", "--restart-backoff-ms", OptionKind::seconds, 0, 3600000, "50 ms",
       "wait before retrying a failed start; doubles with each failure in a row", kCommands},
      {"restart_backoff_max", "", "--restart-backoff-max-ms", OptionKind::seconds, 0, 3600000,
       "2000 ms", "the longest such wait", kCommands},
      // Several hosts.
      {"listen", "listen", "--listen", OptionKind::text, 0, 0, "none: this machine only",
       "also run tasks on hosts that join at ADDRESS:PORT (PORT 0: any free one)",
       kUsePool | kUseRun},
      {"wait_hosts", "wait_hosts", "--wait-hosts", OptionKind::count, 0, 4096, "0",
       "with listen: wait for this many hosts before the first task", kUsePool | kUseRun},
      {"launch", "launch", "--launch", OptionKind::choice, 0, 0,
       "auto (ferry.Pool: False, True to require one)",
       "auto: under torchrun, srun or env:// variables (RANK, WORLD_SIZE, ...), rank 0 runs the "
       "job and every other rank serves it; off: this machine alone, whatever they say",
       kUsePool | kUseRun, "auto|off"},
      {"join", "join", "--join", OptionKind::text, 0, 0, "required", "the head's ADDRESS:PORT",
       kHosts},
      {"address", "address", "--address", OptionKind::text, 0, 0,
       "the address on the route to the head", "this host's address as the head reaches it",
       kHosts},
      {"name", "name", "--name", OptionKind::text, 0, 0, "the hostname",
       "this host's name in the head's reports", kHosts},
      {"secret_file", "secret_file", "--secret-file", OptionKind::text, 0, 0,
       "FERRY_SECRET_FILE, else the secret itself in FERRY_SECRET",
       "the job's shared secret: a file of 16 bytes or more that only its owner can read",
       kEverywhere},
      {"join_timeout", "join_timeout", "--join-timeout-ms", OptionKind::seconds, 100, kNoLimit,
       "30 s", "how long joining, and waiting for hosts, may take", kEverywhere},
      {"heartbeat", "heartbeat", "--heartbeat-ms", OptionKind::seconds, 10, 600000, "0.5 s",
       "a quiet link sends a heartbeat this often", kEverywhere},
      {"lost_after", "lost_after", "--lost-after-ms", OptionKind::seconds, 20, kNoLimit, "5 s",
       "a peer silent this long is lost (at least twice the heartbeat)", kEverywhere},
  };
  return table;
}

const OptionSpec& option(std::string_view key) {
  for (const OptionSpec& o : option_table()) {
    if (key == o.key) return o;
  }
  throw Error(Errc::invalid_argument, "no option '" + std::string(key) + "' in the table");
}

std::int64_t checked(const OptionSpec& o, std::int64_t value) {
  const auto v = static_cast<double>(value);
  if (v < o.least || v > o.most) {
    const bool ms = o.kind == OptionKind::seconds;
    const std::string name = *o.python != '\0' ? o.python : o.cli;
    auto number = [](double d) { return std::to_string(static_cast<std::int64_t>(d)); };
    throw Error(Errc::invalid_argument, name + "=" + std::to_string(value) + (ms ? " ms" : "") +
                                            ": give " + number(o.least) + " to " + number(o.most) +
                                            (ms ? " ms" : "") + " (" + o.help + "; default " +
                                            o.fallback + ")");
  }
  return value;
}

}  // namespace ferry
