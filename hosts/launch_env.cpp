#include "hosts/launch_env.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ipc/error.hpp"

extern char** environ;

namespace ferry::hosts {
namespace {

Error bad(const std::string& what) {
  return Error(Errc::invalid_argument, what);
}

const std::string* find(const Environment& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// A whole decimal number in [least, most], or Error naming the variable and what it must be.
long number(const std::string& name, const std::string& text, long least, long most,
            const std::string& remedy) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || v < least || v > most) {
    throw bad(name + "=" + text + ": " + remedy);
  }
  return v;
}

long required_number(const Environment& env, const char* name, long least, long most,
                     const std::string& remedy, const std::string& missing) {
  const std::string* v = find(env, name);
  if (v == nullptr) throw bad(missing);
  return number(name, *v, least, most, remedy);
}

const char* const kEnvRemedy =
    "torch.distributed's env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, each set "
    "for every rank";

Launch from_rank_variables(const Environment& env) {
  Launch l;
  l.by = find(env, "TORCHELASTIC_RUN_ID") != nullptr ? Launcher::torchrun : Launcher::env;
  const std::string given = find(env, "RANK") ? "RANK" : "WORLD_SIZE";
  const std::string other = given == "RANK" ? "WORLD_SIZE" : "RANK";
  const std::string missing = given + " is set but " + other + " is not: " + kEnvRemedy;
  l.world_size = static_cast<int>(required_number(env, "WORLD_SIZE", 1, 1 << 20,
                                                  "give the number of ranks, 1 or more", missing));
  l.rank = static_cast<int>(required_number(
      env, "RANK", 0, 1 << 20, "give this rank's number, 0 to WORLD_SIZE - 1", missing));
  if (l.rank >= l.world_size) {
    throw bad("RANK=" + std::to_string(l.rank) + " with WORLD_SIZE=" +
              std::to_string(l.world_size) + ": ranks are numbered 0 to WORLD_SIZE - 1");
  }
  const std::string* addr = find(env, "MASTER_ADDR");
  if (addr == nullptr) {
    throw bad(
        "RANK and WORLD_SIZE are set but MASTER_ADDR is not: set it to rank 0's address "
        "or name (" +
        std::string(kEnvRemedy) + ")");
  }
  l.head = *addr;
  l.port = static_cast<std::uint16_t>(required_number(
      env, "MASTER_PORT", 1, 65535, "give a TCP port, 1 to 65535",
      "RANK and WORLD_SIZE are set but MASTER_PORT is not: set it to a free port on rank 0's "
      "machine (" +
          std::string(kEnvRemedy) + ")"));
  l.port_from = "MASTER_PORT";
  // One rank is a machine's whole pool: several on a machine would each start a worker per core.
  if (const std::string* local = find(env, "LOCAL_WORLD_SIZE")) {
    if (number("LOCAL_WORLD_SIZE", *local, 1, 1 << 20, "give a number, 1 or more") != 1) {
      throw bad("LOCAL_WORLD_SIZE=" + *local +
                ": ferry runs one rank per machine, whose pool has a worker per core "
                "(--workers, --devices): launch it with torchrun --nproc-per-node=1");
    }
  }
  if (l.by == Launcher::torchrun) {
    l.run_id = *find(env, "TORCHELASTIC_RUN_ID");
    if (const std::string* r = find(env, "TORCHELASTIC_RESTART_COUNT")) {
      l.restart = static_cast<int>(
          number("TORCHELASTIC_RESTART_COUNT", *r, 0, 1 << 20, "give a count, 0 or more"));
    }
    const std::string* agent = find(env, "TORCHELASTIC_USE_AGENT_STORE");
    l.agent_store = agent != nullptr && *agent == "True";
  }
  return l;
}

Launch from_slurm(const Environment& env) {
  Launch l;
  l.by = Launcher::slurm;
  const std::string missing =
      "SLURM_PROCID is set but SLURM_NTASKS is not: start every rank with srun";
  l.world_size = static_cast<int>(
      required_number(env, "SLURM_NTASKS", 1, 1 << 20, "give a number of tasks", missing));
  l.rank = static_cast<int>(
      required_number(env, "SLURM_PROCID", 0, 1 << 20, "give this task's number", missing));
  if (l.world_size == 1) return l;
  if (l.rank >= l.world_size) {
    throw bad("SLURM_PROCID=" + std::to_string(l.rank) + " with SLURM_NTASKS=" +
              std::to_string(l.world_size) + ": tasks are numbered 0 to SLURM_NTASKS - 1");
  }
  const char* list_name = "SLURM_STEP_NODELIST";
  const std::string* list = find(env, list_name);
  if (list == nullptr) {
    list_name = "SLURM_JOB_NODELIST";
    list = find(env, list_name);
  }
  if (list == nullptr) {
    throw bad(
        "SLURM_PROCID is set but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is: "
        "start every rank with srun");
  }
  std::vector<std::string> nodes;
  try {
    nodes = expand_host_list(*list);
  } catch (const Error& e) {
    throw bad(std::string(list_name) + ": " + e.detail());
  }
  if (nodes.size() != static_cast<std::size_t>(l.world_size)) {
    throw bad("SLURM_NTASKS=" + std::to_string(l.world_size) + " on " +
              std::to_string(nodes.size()) + " node(s) (" + list_name + "=" + *list +
              "): ferry runs one task per node, whose pool has a worker per core; start it with "
              "srun --ntasks-per-node=1");
  }
  l.head = nodes.front();
  if (const std::string* addr = find(env, "MASTER_ADDR")) l.head = *addr;
  if (const std::string* port = find(env, "MASTER_PORT")) {
    l.port = static_cast<std::uint16_t>(
        number("MASTER_PORT", *port, 1, 65535, "give a TCP port, 1 to 65535"));
    l.port_from = "MASTER_PORT";
  } else {
    // Every task derives the same port with no word between them, and two jobs sharing a node
    // differ; 20000-29999 lies below Linux's ephemeral ports (32768 and up).
    const std::string* job = find(env, "SLURM_JOB_ID");
    if (job == nullptr) {
      throw bad(
          "SLURM_PROCID is set but neither SLURM_JOB_ID nor MASTER_PORT is: set "
          "MASTER_PORT to a free port on the first node");
    }
    const long id = number("SLURM_JOB_ID", *job, 0, 0x7fffffffL, "give the job's number");
    l.port = static_cast<std::uint16_t>(20000 + id % 10000);
    l.port_from = "SLURM_JOB_ID (20000 + the job id mod 10000; set MASTER_PORT to choose)";
  }
  if (const std::string* job = find(env, "SLURM_JOB_ID")) l.run_id = *job;
  if (const std::string* r = find(env, "SLURM_RESTART_COUNT")) {
    l.restart =
        static_cast<int>(number("SLURM_RESTART_COUNT", *r, 0, 1 << 20, "give a count, 0 or more"));
  }
  return l;
}

// The items of a host list at its top level: split at commas outside brackets.
std::vector<std::string> top_level_items(const std::string& list) {
  std::vector<std::string> items;
  std::string item;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw bad("'" + list + "': a ']' without its '['");
    if (c == ',' && depth == 0) {
      items.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0) throw bad("'" + list + "': a '[' without its ']'");
  items.push_back(item);
  return items;
}

// One item, its first bracket expanded and the rest recursively: "n[1-2]-r[3,5]" gives four.
void expand_item(const std::string& list, const std::string& item, std::vector<std::string>& out) {
  const std::size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.empty()) throw bad("'" + list + "': an empty name");
    out.push_back(item);
    return;
  }
  const std::size_t close = item.find(']', open);
  const std::string prefix = item.substr(0, open);
  const std::string suffix = item.substr(close + 1);
  const std::string inside = item.substr(open + 1, close - open - 1);
  std::size_t from = 0;
  for (;;) {
    const std::size_t comma = inside.find(',', from);
    const std::string range =
        inside.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    const std::size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    const std::string remedy = "'" + list + "': '[" + inside + "]' holds ranges as 01-03,7";
    if (lo.empty() || hi.empty() || lo.find_first_not_of("0123456789") != std::string::npos ||
        hi.find_first_not_of("0123456789") != std::string::npos || lo.size() > 9 || hi.size() > 9) {
      throw bad(remedy);
    }
    const long a = std::stol(lo);
    const long b = std::stol(hi);
    if (b < a || b - a > 100000) throw bad(remedy);
    for (long n = a; n <= b; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      expand_item(list, prefix + digits + suffix, out);
    }
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
}

}  // namespace

const char* launcher_name(Launcher l) noexcept {
  switch (l) {
    case Launcher::torchrun:
      return "torchrun";
    case Launcher::env:
      return "env://";
    case Launcher::slurm:
      return "SLURM";
  }
  return "?";
}

std::string Launch::describe() const {
  std::string s = "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (" +
                  launcher_name(by);
  if (restart > 0) s += ", restart " + std::to_string(restart);
  return s + ")";
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr)
      env.emplace(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

std::optional<Launch> read_launch(const Environment& env) {
  std::optional<Launch> l;
  if (find(env, "RANK") != nullptr || find(env, "WORLD_SIZE") != nullptr) {
    l = from_rank_variables(env);
  } else if (find(env, "SLURM_PROCID") != nullptr && find(env, "SLURM_STEP_ID") != nullptr) {
    // srun sets SLURM_STEP_ID; a batch script's own shell has SLURM_PROCID without it, and a
    // ferry run there is one process on one machine.
    l = from_slurm(env);
  }
  if (l && l->world_size == 1) return std::nullopt;
  return l;
}

std::vector<std::string> expand_host_list(const std::string& list) {
  std::vector<std::string> out;
  for (const std::string& item : top_level_items(list)) expand_item(list, item, out);
  return out;
}

}  // namespace ferry::hosts
