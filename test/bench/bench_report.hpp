// What ferry-bench and ferry-fanin-bench share around their figures: the options of their
// torch.multiprocessing side, a report's first keys, the lines its printout opens with, its
// table cells, and its JSON file.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "test/bench/bench_support.hpp"

namespace ferry::bench {

// The torch.multiprocessing side of a run: a Python peer script, run by an interpreter with torch.
struct TorchPeer {
  std::string python = "/usr/bin/python3";
  std::string script;  // empty: the one beside the executable (peer_script())
  bool skip = false;
};

// --python, --torch-peer and --no-torch. `side` is what the help calls the torch.multiprocessing
// side ("side", "baseline"); `script` is the peer's file name.
inline void add_torch_peer_options(CLI::App& app, TorchPeer& peer, const std::string& side,
                                   const std::string& script) {
  app.add_option("--python", peer.python,
                 "interpreter with torch for the torch.multiprocessing " + side +
                     " (default /usr/bin/python3)");
  app.add_option("--torch-peer", peer.script, "path of " + script);
  app.add_flag("--no-torch", peer.skip, "skip the torch.multiprocessing " + side);
}

// A report's first keys: the tool, when it ran (UTC) and the machine; `gpu` says what the run did
// with GPUs.
inline json open_report(const std::string& tool, const std::string& gpu) {
  json report;
  report["tool"] = tool;
  report["date"] = utc_now();
  report["machine"] = machine_info(gpu);
  return report;
}

// Says on stderr why the torch.multiprocessing side has no figures; false where it failed, since a
// skip is not a failure.
inline bool explain_missing_peer(const std::string& tool, const std::string& side,
                                 const json& peer) {
  std::fprintf(stderr, "%s: torch.multiprocessing %s %s: %s\n", tool.c_str(), side.c_str(),
               peer["status"].get<std::string>().c_str(),
               peer["reason"].get<std::string>().c_str());
  return peer["status"] != "failed";
}

// The lines a printed report opens with: the machine, how busy it was over the run, and why the
// torch.multiprocessing side has no figures, where it has none.
inline void print_report_head(const std::string& tool, const json& report,
                              const std::string& side) {
  const json& m = report["machine"];
  std::printf("\n%s on %s, %d cores, %s%s\n", tool.c_str(),
              m["cpu_model"].get<std::string>().c_str(), m["cores"].get<int>(),
              m["kernel"].get<std::string>().c_str(),
              m["virtual_machine"].get<bool>() ? " (virtual machine)" : "");
  const json& a = report["machine_activity"];
  std::printf(
      "run: %.0f s wall, %.0f CPU-s by the benchmark, %.1f CPU-s by other processes, "
      "%.1f s stolen by the hypervisor\n",
      a["wall_s"].get<double>(), a["bench_cpu_s"].get<double>(), a["other_cpu_s"].get<double>(),
      a["steal_s"].get<double>());
  const json& torch = report["torch"];
  if (torch["status"] != "ok") {
    std::printf("%s: torch.multiprocessing %s: %s\n", torch["status"].get<std::string>().c_str(),
                side.c_str(), torch["reason"].get<std::string>().c_str());
  }
}

// A latency cell, "p50 / p99", of a {"p50", "p99"} object.
inline std::string latency_cell(const json& latency) {
  return num(latency["p50"].get<double>()) + " / " + num(latency["p99"].get<double>());
}

// A rate cell, "messages/s (GB/s)", of a {"messages_per_s", "gb_per_s"} object.
inline std::string rate_cell(const json& figures) {
  return num(figures["messages_per_s"].get<double>()) + " (" +
         num(figures["gb_per_s"].get<double>()) + ")";
}

// Writes the report to `path` (--json) and says so; nothing where no path was given.
inline void write_report(const json& report, const std::string& path) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << report.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path);
  std::printf("\nwrote %s\n", path.c_str());
}

}  // namespace ferry::bench
