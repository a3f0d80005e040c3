#include "ipc/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <memory>

namespace ferry {

spdlog::logger& log() {
  // Leaked on purpose: destructors of other statics may still log during exit.
  static spdlog::logger* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* l = new spdlog::logger("ferry", std::move(sink));
    l->set_pattern("[ferry %P %l] %v");
    const char* env = std::getenv("FERRY_LOG");
    l->set_level(env && *env ? spdlog::level::from_str(env) : spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace ferry
