// What a user gives `ferry run` and `ferry host`: the command line, and the pool's options made
// from it (the tensors of --input are tools/task_inputs.hpp's). A problem with any of it is a
// BadInput (exit code 2).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hosts/launch_env.hpp"
#include "runtime/ferry.hpp"
#include "tools/bad_input.hpp"        // BadInput, the exit codes
#include "workers/builtin_tasks.hpp"  // kMlpFeatures

namespace ferry::tools {

struct RunArgs {
  int workers = 0;
  std::string devices;
  std::string start = "auto";
  std::string task = "mlp";
  bool task_given = false;  // --task was on the command line (a model alone implies torchscript)
  std::string model, input, output, worker;
  int batches = 200;
  int batch_size = 64;
  std::int64_t features = ferry::kMlpFeatures;
  int timeout_ms = 0;
  int start_timeout_ms = 60000;  // PoolOptions::start_timeout
  int maxtasks_inflight = 0;     // PoolOptions::max_inflight_per_worker; 0: the pool chooses
  int threads_per_worker = 0;    // PoolOptions::threads_per_worker; 0: cores / workers
  std::string shared_allocations = "on";  // PoolOptions::shared_allocations
  int retries = 2;
  std::int64_t max_tasks_per_worker = 0;  // PoolOptions::max_tasks_per_worker
  ferry::RestartPolicy restart;
  int backoff_ms = static_cast<int>(restart.backoff.count());
  int backoff_max_ms = static_cast<int>(restart.backoff_max.count());
  bool json = false;
  // Several hosts (docs/multi-host.md): the head listens; each host joins.
  std::string listen, join, secret_file, address, name;
  int wait_hosts = 0;
  int join_timeout_ms = 30000;
  int heartbeat_ms = 500;
  int lost_after_ms = 5000;
  std::string launch_mode = "auto";  // --launch: auto, or off (this machine alone)
  // Set where a cluster launcher started `ferry run` (tools/ferry_hosts.hpp, launch_of): rank 0
  // is the head, every other rank a host.
  std::optional<ferry::hosts::Launch> launch;
};

// The `run` and `host` subcommands of `app`, their options read into `a`.
CLI::App* add_run_command(CLI::App& app, RunArgs& a);
CLI::App* add_host_command(CLI::App& app, RunArgs& a);

// Settles what --task, --model, --worker and --start mean together (tools/run_choice.hpp): a
// BadInput where they contradict each other. Called once, right after parsing.
void settle_run_args(RunArgs& a);

// The pool's options from the command line, for `ferry run` and `ferry host` alike.
ferry::PoolOptions pool_options(const RunArgs& a);

// Loads --model as the torchscript task will, once, before any worker starts: a file that is not
// TorchScript is a BadInput naming it and saying what it is instead (a torch.save file, say).
void check_model(const std::string& path);

}  // namespace ferry::tools
