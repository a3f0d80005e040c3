#include "tools/ferry_inputs.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/script.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "ipc/cuda/visible_gpus.hpp"
#include "ipc/log.hpp"
#include "runtime/option_table.hpp"
#include "tools/run_choice.hpp"
#include "tools/task_inputs.hpp"
#include "workers/task_registry.hpp"

namespace ferry::tools {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Whether this program's LibTorch has CUDA, asked without initialising it (torch::cuda's and
// at::hasCUDA()'s answers count the devices, which initialises the driver): a CUDA build has
// loaded c10's CUDA library with it.
bool torch_has_cuda() {
  void* lib = ::dlopen("libc10_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return false;
  ::dlclose(lib);
  return true;
}

// The default device list: every core as a CPU worker and every GPU this LibTorch can use. The
// GPUs are counted without initialising CUDA here, so the workers may still be forked, and the
// one on a GPU can use it.
std::vector<std::string> default_devices() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> d(cores, "cpu");
  if (torch_has_cuda()) {
    const int gpus = ferry::cuda::visible_gpus();
    for (int i = 0; i < gpus; ++i) d.push_back("cuda:" + std::to_string(i));
  }
  return d;
}

// Flag `key` of the option table (runtime/option_table.hpp), bound to `field`: its spelling,
// help, default and range come from the table, as python3 -m ferry host's and docs/options.md's.
template <class T>
CLI::Option* table_flag(CLI::App* cmd, const char* key, T& field) {
  const ferry::OptionSpec& o = ferry::option(key);
  const std::string fallback = o.fallback;
  CLI::Option* opt = cmd->add_option(
      o.cli, field, fallback == "required" ? o.help : o.help + (" (default: " + fallback + ")"));
  switch (o.kind) {
    case ferry::OptionKind::count:
    case ferry::OptionKind::seconds:
      opt->check(CLI::Range(static_cast<std::int64_t>(o.least), static_cast<std::int64_t>(o.most)));
      break;
    case ferry::OptionKind::flag:
      opt->transform(CLI::IsMember({"on", "off"}));
      break;
    case ferry::OptionKind::choice: {
      std::vector<std::string> choices;
      std::stringstream ss(o.choices);
      for (std::string c; std::getline(ss, c, '|');) choices.push_back(c);
      opt->check(CLI::IsMember(choices));
      break;
    }
    case ferry::OptionKind::text:
    case ferry::OptionKind::list:
      break;
  }
  return opt;
}

// The options of this machine's pool, the same for `ferry run` and `ferry host`.
void add_pool_options(CLI::App* cmd, RunArgs& a) {
  table_flag(cmd, "workers", a.workers);
  table_flag(cmd, "devices", a.devices)->excludes("--workers");
  table_flag(cmd, "start", a.start);
  table_flag(cmd, "model", a.model);
  table_flag(cmd, "task_timeout", a.timeout_ms);
  table_flag(cmd, "start_timeout", a.start_timeout_ms);
  table_flag(cmd, "retries", a.retries);
  table_flag(cmd, "maxtasks_inflight", a.maxtasks_inflight);
  table_flag(cmd, "max_tasks_per_worker", a.max_tasks_per_worker);
  table_flag(cmd, "threads_per_worker", a.threads_per_worker);
  table_flag(cmd, "max_failed_starts", a.restart.max_failed_starts);
  table_flag(cmd, "max_start_crashes", a.restart.max_start_crashes);
  table_flag(cmd, "restart_backoff", a.backoff_ms);
  table_flag(cmd, "restart_backoff_max", a.backoff_max_ms);
  table_flag(cmd, "worker", a.worker);
  table_flag(cmd, "shared_allocations", a.shared_allocations);
}

// The options of a job on several hosts that the head and its hosts share.
void add_link_options(CLI::App* cmd, RunArgs& a) {
  table_flag(cmd, "secret_file", a.secret_file);
  table_flag(cmd, "join_timeout", a.join_timeout_ms);
  table_flag(cmd, "heartbeat", a.heartbeat_ms);
  table_flag(cmd, "lost_after", a.lost_after_ms);
}

}  // namespace

CLI::App* add_run_command(CLI::App& app, RunArgs& a) {
  CLI::App* run_cmd = app.add_subcommand(
      "run",
      "Start workers, stream batches through a task, and report throughput, latency and how "
      "many bytes moved zero-copy. With no options: the built-in 'mlp' over 200 synthetic "
      "batches on every CPU core (and every GPU LibTorch can use).");
  add_pool_options(run_cmd, a);
  // The tasks of this program's own registry: what forked workers run, and what the default
  // ferry-worker has too.
  std::string known;
  for (const auto& n : ferry::task_names()) known += (known.empty() ? "" : ", ") + n;
  run_cmd
      ->add_option("--task", a.task,
                   "task to run (here: " + known +
                       "; with --model alone: torchscript); a custom worker (--worker) may "
                       "register more")
      ->each([&a](const std::string&) { a.task_given = true; });
  run_cmd->add_option("--input", a.input, std::string("a file of torch.save: ") + kInputShapes);
  run_cmd->add_option("--output", a.output,
                      "write the results, in input order, for Python's torch.load");
  run_cmd->add_option("--batches", a.batches, "synthetic batches when there is no --input")
      ->check(CLI::Range(1, 100000000));
  run_cmd->add_option("--batch-size", a.batch_size, "rows per synthetic batch")
      ->check(CLI::Range(1, 1 << 20));
  run_cmd->add_option("--features", a.features, "columns per synthetic batch (mlp: 64)")
      ->check(CLI::Range(1, 1 << 20));
  run_cmd->add_flag("--json", a.json, "print the summary as one JSON document, no progress");
  table_flag(run_cmd, "listen", a.listen);
  table_flag(run_cmd, "wait_hosts", a.wait_hosts);
  table_flag(run_cmd, "launch", a.launch_mode);
  add_link_options(run_cmd, a);
  run_cmd->footer(
      "Exit codes: 0 all tasks succeeded, 1 some tasks failed, 2 bad arguments or input,\n"
      "3 the pool could not start or broke (every worker given up), or --wait-hosts ran out,\n"
      "or a launched job could not form, 130/143 stopped by SIGINT/SIGTERM.\n"
      "Under torchrun, srun or env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),\n"
      "without --listen: rank 0 runs the job as its head and every other rank serves it as a\n"
      "host; each needs the job's secret (docs/multi-host.md).\n"
      "Environment: FERRY_LOG=debug for detail, FERRY_WORKER for the worker executable,\n"
      "FERRY_SECRET for the hosts' secret; every variable is in docs/environment.md.");

  return run_cmd;
}

CLI::App* add_host_command(CLI::App& app, RunArgs& a) {
  CLI::App* host_cmd = app.add_subcommand(
      "host",
      "Join the head of a job on another machine (ferry run --listen) and run its tasks on "
      "this machine's workers until the job ends (docs/multi-host.md).");
  table_flag(host_cmd, "join", a.join)->required();
  add_pool_options(host_cmd, a);
  table_flag(host_cmd, "address", a.address);
  table_flag(host_cmd, "name", a.name);
  add_link_options(host_cmd, a);
  host_cmd->footer(
      "Exit codes: 0 the head's job ended, 2 bad arguments, 3 could not join or lost the head,\n"
      "130/143 stopped by SIGINT/SIGTERM (the head is told and runs its tasks elsewhere).");
  return host_cmd;
}

void settle_run_args(RunArgs& a) {
  const RunChoice c = choose_run({a.task, a.task_given, a.model, a.worker, a.start});
  if (!c.error.empty()) throw BadInput(c.error);
  a.task = c.task;
  a.start = c.start;
}

ferry::PoolOptions pool_options(const RunArgs& a) {
  ferry::PoolOptions o;
  if (!a.devices.empty()) {
    o.devices = split(a.devices);
  } else if (a.workers > 0) {
    o.devices.assign(a.workers, "cpu");
  } else {
    o.devices = default_devices();
  }
  o.start = ferry::parse_start(a.start);
  o.worker_executable = a.worker;
  o.task_timeout = std::chrono::milliseconds(a.timeout_ms);
  o.start_timeout = std::chrono::milliseconds(a.start_timeout_ms);
  o.max_inflight_per_worker = a.maxtasks_inflight;
  o.threads_per_worker = a.threads_per_worker;
  o.shared_allocations = a.shared_allocations == "on";
  o.max_retries = a.retries;
  o.max_tasks_per_worker = static_cast<std::uint64_t>(a.max_tasks_per_worker);
  o.restart = a.restart;
  o.restart.backoff = std::chrono::milliseconds(a.backoff_ms);
  o.restart.backoff_max = std::chrono::milliseconds(a.backoff_max_ms);
  if (!a.model.empty()) o.config["model"] = a.model;
  if (!a.model.empty() && ::access(a.model.c_str(), R_OK) != 0) {
    throw BadInput("cannot read --model '" + a.model + "': " + std::strerror(errno));
  }
  return o;
}

void check_model(const std::string& path) {
  try {
    torch::jit::load(path, at::kCPU);
    return;
  } catch (const std::exception& e) {  // c10::Error too; its backtrace is for FERRY_LOG=debug
    ferry::log().debug("torch::jit::load('{}'): {}", path, e.what());
  }
  // Not TorchScript: say what it is instead, from its first bytes and, for a zip archive (what
  // torch.save and torch.jit.save both write since PyTorch 1.6), from the records it holds.
  std::ifstream f(path, std::ios::binary);
  char head[4] = {};
  f.read(head, sizeof head);
  std::string what = "neither a TorchScript module nor a file of torch.save";
  if (f.gcount() == 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) {
    what = "a zip archive but not a TorchScript module";
    try {
      caffe2::serialize::PyTorchStreamReader reader(path);
      if (reader.hasRecord("data.pkl") && !reader.hasRecord("constants.pkl")) {
        what = "a file of torch.save (a state_dict or tensors, say), not a TorchScript module";
      }
    } catch (const std::exception& e) {
      ferry::log().debug("reading '{}' as a zip archive: {}", path, e.what());
    }
  } else if (f.gcount() >= 1 && static_cast<unsigned char>(head[0]) == 0x80) {
    what =
        "a pickle (torch.save's format before PyTorch 1.6, or pickle.dump's), not a "
        "TorchScript module";
  }
  throw BadInput("--model '" + path + "' is " + what +
                 ": save the model with torch.jit.save(torch.jit.script(model), FILE)");
}

}  // namespace ferry::tools
