#include "ipc/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <memory>
#include <string>

#include "ipc/env.hpp"
#include "ipc/error.hpp"

namespace ferry {

spdlog::logger& log() {
  // Leaked on purpose: destructors of other statics may still log during exit.
  static spdlog::logger* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* l = new spdlog::logger("ferry", std::move(sink));
    l->set_pattern("[ferry %P %l] %v");
    // The logger is first made anywhere, a destructor or noexcept code included, so a bad
    // FERRY_LOG cannot throw from here: it is said as the first warning, at the default level.
    std::string level = "warn";
    std::string refused;
    try {
      level =
          env::choice("FERRY_LOG", level,
                      {"trace", "debug", "info", "warn", "warning", "error", "critical", "off"});
    } catch (const Error& e) {
      refused = e.detail();
    }
    l->set_level(spdlog::level::from_str(level));
    if (!refused.empty()) l->warn("{}", refused);
    return l;
  }();
  return *logger;
}

}  // namespace ferry
