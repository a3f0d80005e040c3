#include "hosts/hub_life.hpp"

#include <string>

#include "ipc/error.hpp"

namespace ferry::hosts {

const char* phase_name(HubLife::Phase p) noexcept {
  switch (p) {
    case HubLife::Phase::idle:
      return "idle";
    case HubLife::Phase::admitting:
      return "admitting";
    case HubLife::Phase::stopping:
      return "stopping";
  }
  return "?";
}

void HubLife::start() {
  if (phase_ != Phase::idle) {
    throw Error(Errc::invalid_argument, std::string("a hosts' hub serves one pool, once (it is ") +
                                            phase_name(phase_) + ")");
  }
  phase_ = Phase::admitting;
}

bool HubLife::stop() noexcept {
  if (phase_ == Phase::stopping) return false;
  phase_ = Phase::stopping;
  return true;
}

}  // namespace ferry::hosts
