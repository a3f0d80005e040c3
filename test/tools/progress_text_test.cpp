// What ferry run says about its progress, and when (tools/progress_text.hpp), one case each.
#include "tools/progress_text.hpp"

#include "../catch.hpp"

using namespace ferry::tools;

TEST_CASE("progress: a slow rate is shown per minute or per hour, never as 0", "[tools]") {
  CHECK(rate_text(23180.8) == "23181 tasks/s");
  CHECK(rate_text(3.21) == "3.2 tasks/s");
  CHECK(rate_text(1.0 / 30) == "2.0 tasks/min");
  CHECK(rate_text(1.0 / 600) == "6.0 tasks/h");
}

TEST_CASE("progress: durations in seconds, minutes and hours", "[tools]") {
  CHECK(duration_text(4.24) == "4.2 s");
  CHECK(duration_text(65) == "1 min 05 s");
  CHECK(duration_text(3600 * 2 + 180) == "2 h 03 min");
}

TEST_CASE("progress: the percentage is not floored to a tenth, and an ETA follows", "[tools]") {
  CHECK(progress_text(1, 4, 0, 30) ==
        "1/4 tasks (25%), 0 failed, 2.0 tasks/min, 30.0 s elapsed, about 1 min 30 s left");
  CHECK(progress_text(1, 400, 0, 2) ==
        "1/400 tasks (0.2%), 0 failed, 30.0 tasks/min, 2.0 s elapsed, about 13 min 18 s left");
}

TEST_CASE("progress: before the first task ends, no rate and no ETA", "[tools]") {
  CHECK(progress_text(0, 4, 0, 10) == "0/4 tasks (0%), 0 failed, 10.0 s elapsed");
}

TEST_CASE("progress: the last line has no ETA", "[tools]") {
  CHECK(progress_text(4, 4, 1, 2) == "4/4 tasks (100%), 1 failed, 2.0 tasks/s, 2.0 s elapsed");
}

TEST_CASE("progress: a pipe gets a line each tenth, every 10 s otherwise, and the last once",
          "[tools]") {
  CHECK_FALSE(pipe_line_due(0, 4, 0, 9.9));       // nothing yet, under 10 s
  CHECK(pipe_line_due(0, 4, 0, 10.0));            // nothing ended in 10 s: a line anyway
  CHECK(pipe_line_due(1, 4, 0, 0.1));             // a new tenth
  CHECK_FALSE(pipe_line_due(11, 100, 1, 3));      // the same tenth, soon after
  CHECK(pipe_line_due(100, 100, 9, 0.1));         // the end
  CHECK_FALSE(pipe_line_due(100, 100, 10, 0.1));  // the end, already said
  CHECK(tenth_of(25, 100) == 2);
}

TEST_CASE("progress: the ready line groups the workers by start method and device", "[tools]") {
  CHECK(ready_text({"fork", "fork", "fork", "fork"}, {"cpu", "cpu", "cpu", "cpu"}, 0.83) ==
        "4 workers ready (fork: 4 cpu) in 0.8 s");
  CHECK(ready_text({"fork", "spawn", "fork"}, {"cpu", "cuda:0", "cpu"}, 2.1) ==
        "3 workers ready (fork: 2 cpu; spawn: cuda:0) in 2.1 s");
  CHECK(ready_text({"spawn"}, {"cpu"}, 1) == "1 worker ready (spawn: cpu) in 1.0 s");
}
