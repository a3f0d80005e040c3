// What a cluster launcher told this process: torchrun's variables, torch.distributed's env://
// ones (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) or SLURM's (docs/multi-host.md, "Launched as
// clusters launch"). Pure: it reads the environment it is given, so every case is tested without a
// launcher, and it needs nothing of c10d (a ferry built for one machine reads it too, to say so).
//
// One rank is one machine's whole pool: rank 0 is the head (it runs workers too), every other rank
// a host with its local devices.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ferry::hosts {

enum class Launcher {
  torchrun,  // torchrun (torch.distributed.run): env:// plus TORCHELASTIC_*
  env,       // env:// set by hand or by another launcher
  slurm,     // srun
};
const char* launcher_name(Launcher l) noexcept;

struct Launch {
  Launcher by = Launcher::env;
  int rank = 0;
  int world_size = 2;
  std::string head;          // where rank 0 is reached: MASTER_ADDR, or SLURM's first node
  std::uint16_t port = 0;    // MASTER_PORT, or SLURM's (launch_env.cpp: from its job id)
  std::string port_from;     // what gave the port, in words, for errors
  bool agent_store = false;  // torchrun's own store serves head:port: rank 0 listens elsewhere
  int restart = 0;           // TORCHELASTIC_RESTART_COUNT or SLURM_RESTART_COUNT
  std::string run_id;        // TORCHELASTIC_RUN_ID or SLURM_JOB_ID; empty for plain env://

  bool is_head() const noexcept { return rank == 0; }
  // "rank 2 of 3 (torchrun, restart 1)", for messages.
  std::string describe() const;
};

using Environment = std::map<std::string, std::string>;

// This process's environment.
Environment process_environment();

// The launch `env` describes; nullopt where no launcher started this process, or where the job is
// one process (a world of 1 runs as on one machine). Error(invalid_argument), naming the variable,
// its value and the remedy, where the variables are incomplete, malformed or contradict each
// other. Precedence: RANK and WORLD_SIZE (torchrun, env://) over SLURM's, as `srun torchrun`
// gives both.
std::optional<Launch> read_launch(const Environment& env);

// SLURM's host list in its compressed form ("node[01-03,7],gpu5") as names, in order, zero padding
// kept. Error(invalid_argument) naming the list where a bracket or a range is malformed.
std::vector<std::string> expand_host_list(const std::string& list);

}  // namespace ferry::hosts
