// What `ferry run` says about its progress, and when: pure, with a test per case
// (test/tools/progress_text_test.cpp). Progress (ferry_report.hpp) prints it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ferry::tools {

// "3.2 tasks/s"; below one a second "45 tasks/min", below one a minute "2.0 tasks/h": a slow
// job's rate never rounds to 0.
std::string rate_text(double tasks_per_second);

// "4.2 s", "1 min 05 s", "2 h 03 min".
std::string duration_text(double seconds);

// "12/200 tasks (6%), 0 failed, 3.2 tasks/s, 3.7 s elapsed, about 58 s left": the percentage is
// never floored to a tenth (1/4 is 25%), the ETA comes from the rate so far and is left out
// before the first task ends.
std::string progress_text(std::size_t done, std::size_t total, std::size_t failed,
                          double elapsed_s);

// Whether a pipe (not a terminal) gets a progress line now: at every further tenth of the tasks,
// at the last one, and at least every `every_s` seconds while nothing else is printed.
bool pipe_line_due(std::size_t done, std::size_t total, std::size_t last_tenth,
                   double since_last_line_s, double every_s = 10.0);

// The tenth of the tasks `done` is in (0 to 10), for pipe_line_due's `last_tenth`.
std::size_t tenth_of(std::size_t done, std::size_t total);

// "4 workers ready (fork: 4 cpu) in 0.8 s", "3 workers ready (fork: 2 cpu; spawn: cuda:0) in
// 2.1 s": each worker's start method and device, as the pool reports them, in order of first
// appearance.
std::string ready_text(const std::vector<std::string>& starts,
                       const std::vector<std::string>& devices, double seconds);

}  // namespace ferry::tools
