#include "hosts/serve_life.hpp"

namespace ferry::hosts {

bool ServeLife::ready() noexcept {
  if (phase_ != Phase::starting) return false;
  phase_ = Phase::serving;
  return true;
}

bool ServeLife::leave() noexcept {
  if (phase_ != Phase::starting && phase_ != Phase::serving) return false;
  phase_ = Phase::leaving;
  return true;
}

}  // namespace ferry::hosts
