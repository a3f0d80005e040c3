// What `ferry run` tells of a run: progress while it goes, then the summary (text or --json),
// the first failures, and the results for Python's torch.load (--output).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/ferry.hpp"
#include "tools/ferry_inputs.hpp"

namespace ferry::tools {

// What `ferry run` reports of the hosts that joined it.
struct HostCounts {
  std::uint64_t joined = 0, lost = 0, refused = 0;
};

// How a run went, gathered by run() for the report.
struct RunOutcome {
  std::size_t count = 0;                // tasks asked for
  std::size_t done = 0;                 // tasks that ended, failed or not
  double seconds = 0;                   // from the first task to the last
  std::vector<double> latencies;        // seconds, hand-over to result, one per ended task
  std::vector<std::string> errors;      // the failed tasks' errors
  std::string broken;                   // why the pool could not go on, if it could not
  std::string broken_detail;            // the same without "ferry: <code>: ", as tasks carry it
  ferry::PoolStats stats;               // taken before the pool closed
  std::vector<ferry::Tensors> results;  // in input order, kept only for --output
  std::optional<HostCounts> hosts;      // with --listen

  // Every task ended and none failed.
  bool complete() const { return errors.empty() && broken.empty() && done == count; }
};

// Shows progress on a terminal as a bar redrawn in place; elsewhere (a pipe, a log file) as a line
// at each tenth of the tasks and at least every 10 s. The words are tools/progress_text.hpp's.
class Progress {
 public:
  explicit Progress(std::size_t total);
  // Called as each task ends and, while none does, about once a second.
  void update(std::size_t done, std::size_t failed);

 private:
  std::size_t total_;
  bool tty_;
  std::size_t last_tenth_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

// The first five errors, a count of the rest, and why the pool broke, on stderr, each once: the
// tasks that failed because it broke are counted on its line.
void print_failures(const RunOutcome& r);

// The summary on stdout: one JSON document with --json, else a table.
void print_summary(const RunArgs& a, const RunOutcome& r);

// Results for Python's torch.load: a list with one entry per input, a tensor when the task
// returned one, else a list of its tensors. BadInput when `path` cannot be written.
void save_results(const std::string& path, const std::vector<ferry::Tensors>& results);

}  // namespace ferry::tools
