// ferry's logger: quiet by default (warnings and errors only), `FERRY_LOG=debug` (or trace,
// info, warn, error, off) for detail. Everything ferry says goes through it, to stderr.
#pragma once

#include <spdlog/spdlog.h>

namespace ferry {

// The process-wide "ferry" logger, created on first use with the level from FERRY_LOG (a value
// it does not know is a warning, not an error: logging never throws).
spdlog::logger& log();

}  // namespace ferry
