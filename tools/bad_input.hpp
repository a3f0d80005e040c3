// What `ferry run` and `ferry host` say about what a user gave them: a BadInput is exit code 2.
// Apart from ferry_inputs.hpp, so the readers of --input need not include the command line.
#pragma once

#include <stdexcept>

namespace ferry::tools {

// Exit codes (the commands' footers list them; 128+N is a stop by signal N).
inline constexpr int kOk = 0, kTasksFailed = 1, kBadInput = 2, kBroken = 3;

// A problem with what the user gave us, reported as exit code 2.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A job started by a cluster launcher that cannot form (its variables, its secret, its ranks),
// reported as exit code 3, as a pool that cannot start: the launcher's command is no user's typo.
struct LaunchFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ferry::tools
