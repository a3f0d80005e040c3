// read_launch() and expand_host_list(): what torchrun, env:// and srun tell a rank, one case each,
// and each malformed or contradictory environment named with its remedy.
#include "hosts/launch_env.hpp"

#include <tuple>
#include <vector>

#include "../catch.hpp"
#include "ipc/error.hpp"

using ferry::hosts::Environment;
using ferry::hosts::expand_host_list;
using ferry::hosts::Launcher;
using ferry::hosts::read_launch;

namespace {

// What torchrun --nnodes=3 --nproc-per-node=1 gives the rank on its second node (PyTorch 2.x).
Environment torchrun_rank(int rank) {
  return {{"RANK", std::to_string(rank)},
          {"GROUP_RANK", std::to_string(rank)},
          {"LOCAL_RANK", "0"},
          {"LOCAL_WORLD_SIZE", "1"},
          {"WORLD_SIZE", "3"},
          {"MASTER_ADDR", "node01"},
          {"MASTER_PORT", "29400"},
          {"TORCHELASTIC_RESTART_COUNT", "0"},
          {"TORCHELASTIC_MAX_RESTARTS", "1"},
          {"TORCHELASTIC_RUN_ID", "job7"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
}

Environment env_rank(int rank) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", "3"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

Environment srun_task(int procid) {
  return {{"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_NTASKS", "3"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_ID", "123456"},
          {"SLURM_STEP_NODELIST", "node[01-03]"},
          {"SLURM_JOB_NODELIST", "node[01-04]"}};
}

// The message read_launch throws for `env`, or "" when it throws nothing.
std::string refusal(const Environment& env) {
  try {
    (void)read_launch(env);
  } catch (const ferry::Error& e) {
    CHECK(e.code() == ferry::Errc::invalid_argument);
    return e.detail();
  }
  return "";
}

}  // namespace

TEST_CASE("launch: no launcher's variables, no launch", "[launch]") {
  CHECK_FALSE(read_launch({}).has_value());
  CHECK_FALSE(read_launch({{"PATH", "/bin"}, {"MASTER_ADDR", "x"}}).has_value());
}

TEST_CASE("launch: torchrun's variables give the rank, the world and its agent's store",
          "[launch]") {
  const auto l = read_launch(torchrun_rank(1));
  REQUIRE(l.has_value());
  CHECK(l->by == Launcher::torchrun);
  CHECK(l->rank == 1);
  CHECK_FALSE(l->is_head());
  CHECK(l->world_size == 3);
  CHECK(l->head == "node01");
  CHECK(l->port == 29400);
  CHECK(l->agent_store);
  CHECK(l->run_id == "job7");
  CHECK(l->restart == 0);
  CHECK(l->describe() == "rank 1 of 3 (torchrun)");
}

TEST_CASE("launch: a rank restarted by torchrun keeps its rank and counts the restart",
          "[launch]") {
  Environment e = torchrun_rank(2);
  e["TORCHELASTIC_RESTART_COUNT"] = "1";
  e["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // PyTorch before 2.4, or a static rendezvous
  const auto l = read_launch(e);
  REQUIRE(l.has_value());
  CHECK(l->rank == 2);
  CHECK(l->restart == 1);
  CHECK_FALSE(l->agent_store);
  CHECK(l->describe() == "rank 2 of 3 (torchrun, restart 1)");
}

TEST_CASE("launch: plain env:// variables", "[launch]") {
  const auto l = read_launch(env_rank(0));
  REQUIRE(l.has_value());
  CHECK(l->by == Launcher::env);
  CHECK(l->is_head());
  CHECK(l->head == "10.0.0.1");
  CHECK(l->port == 29500);
  CHECK(l->port_from == "MASTER_PORT");
  CHECK_FALSE(l->agent_store);
  CHECK(l->run_id.empty());
}

TEST_CASE("launch: a world of one runs as on one machine", "[launch]") {
  Environment e = env_rank(0);
  e["WORLD_SIZE"] = "1";
  CHECK_FALSE(read_launch(e).has_value());
  Environment s = srun_task(0);
  s["SLURM_NTASKS"] = "1";
  s["SLURM_STEP_NODELIST"] = "node01";
  CHECK_FALSE(read_launch(s).has_value());
}

TEST_CASE("launch: incomplete or malformed env:// variables are named with the remedy",
          "[launch]") {
  // Each case: the variable changed (an empty value: removed), and what the refusal says.
  const std::vector<std::tuple<const char*, const char*, const char*>> cases = {
      {"WORLD_SIZE", "", "RANK is set but WORLD_SIZE is not"},
      {"RANK", "", "WORLD_SIZE is set but RANK is not"},
      {"MASTER_ADDR", "", "MASTER_ADDR is not: set it to rank 0's address"},
      {"MASTER_PORT", "", "MASTER_PORT is not"},
      {"MASTER_PORT", "70000", "MASTER_PORT=70000: give a TCP port, 1 to 65535"},
      {"RANK", "one", "RANK=one: give this rank's number"},
      {"RANK", "3", "RANK=3 with WORLD_SIZE=3: ranks are numbered 0 to"},
      {"WORLD_SIZE", "0", "WORLD_SIZE=0: give the number of ranks"},
  };
  for (const auto& [name, value, says] : cases) {
    Environment e = env_rank(1);
    if (*value == '\0') {
      e.erase(name);
    } else {
      e[name] = value;
    }
    INFO(name << "=" << value);
    CHECK_THAT(refusal(e), Catch::Contains(says));
  }
  Environment e = env_rank(1);
  e.erase("WORLD_SIZE");
  CHECK_THAT(refusal(e), Catch::Contains("MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE"));
}

TEST_CASE("launch: more than one rank a machine is refused, naming --nproc-per-node=1",
          "[launch]") {
  Environment e = torchrun_rank(1);
  e["LOCAL_WORLD_SIZE"] = "4";
  CHECK_THAT(refusal(e), Catch::Contains("LOCAL_WORLD_SIZE=4") &&
                             Catch::Contains("torchrun --nproc-per-node=1"));
}

TEST_CASE("launch: srun's variables, the head the first node of the step's list", "[launch]") {
  const auto l = read_launch(srun_task(2));
  REQUIRE(l.has_value());
  CHECK(l->by == Launcher::slurm);
  CHECK(l->rank == 2);
  CHECK(l->world_size == 3);
  CHECK(l->head == "node01");
  CHECK(l->port == 20000 + 123456 % 10000);
  CHECK(l->run_id == "123456");
  // Without the step's list, the job's; MASTER_ADDR and MASTER_PORT override both.
  Environment e = srun_task(0);
  e.erase("SLURM_STEP_NODELIST");
  e["SLURM_JOB_NODELIST"] = "gpu[7-9]";
  CHECK(read_launch(e)->head == "gpu7");
  e["MASTER_ADDR"] = "10.1.1.1";
  e["MASTER_PORT"] = "31000";
  CHECK(read_launch(e)->head == "10.1.1.1");
  CHECK(read_launch(e)->port == 31000);
}

TEST_CASE("launch: a batch script's own shell, outside srun, is no launch", "[launch]") {
  Environment e = srun_task(0);
  e.erase("SLURM_STEP_ID");
  CHECK_FALSE(read_launch(e).has_value());
}

TEST_CASE("launch: env:// variables win over SLURM's, as under srun torchrun", "[launch]") {
  Environment e = srun_task(1);
  for (const auto& kv : torchrun_rank(2)) e[kv.first] = kv.second;
  const auto l = read_launch(e);
  REQUIRE(l.has_value());
  CHECK(l->by == Launcher::torchrun);
  CHECK(l->rank == 2);
}

TEST_CASE("launch: SLURM with several tasks a node, or without its list, is refused", "[launch]") {
  Environment e = srun_task(1);
  e["SLURM_NTASKS"] = "6";
  CHECK_THAT(refusal(e), Catch::Contains("SLURM_NTASKS=6 on 3 node(s)") &&
                             Catch::Contains("srun --ntasks-per-node=1"));
  e = srun_task(1);
  e.erase("SLURM_STEP_NODELIST");
  e.erase("SLURM_JOB_NODELIST");
  CHECK_THAT(refusal(e), Catch::Contains("neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"));
  e = srun_task(1);
  e["SLURM_STEP_NODELIST"] = "node[03-01]";
  CHECK_THAT(refusal(e), Catch::Contains("SLURM_STEP_NODELIST: 'node[03-01]'"));
  e = srun_task(1);
  e.erase("SLURM_JOB_ID");
  CHECK_THAT(refusal(e), Catch::Contains("set MASTER_PORT"));
}

TEST_CASE("launch: SLURM's compressed host lists", "[launch]") {
  using V = std::vector<std::string>;
  CHECK(expand_host_list("node01") == V{"node01"});
  CHECK(expand_host_list("a,b,c") == V{"a", "b", "c"});
  CHECK(expand_host_list("node[01-03]") == V{"node01", "node02", "node03"});
  CHECK(expand_host_list("node[8-11]") == V{"node8", "node9", "node10", "node11"});
  CHECK(expand_host_list("n[1,3-4],gpu5") == V{"n1", "n3", "n4", "gpu5"});
  CHECK(expand_host_list("r[1-2]-n[01,03]") == V{"r1-n01", "r1-n03", "r2-n01", "r2-n03"});
  CHECK(expand_host_list("x[098-101].lab") == V{"x098.lab", "x099.lab", "x100.lab", "x101.lab"});
  for (const char* bad :
       {"node[01-03", "node01]", "node[]", "node[a-b]", "node[3-1]", "a,,b", "node[1-]"}) {
    CHECK_THROWS_AS(expand_host_list(bad), ferry::Error);
  }
}
