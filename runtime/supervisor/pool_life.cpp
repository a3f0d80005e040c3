#include "runtime/supervisor/pool_life.hpp"

#include <string>

#include "ipc/error.hpp"

namespace ferry::supervisor {

const char* phase_name(PoolLife::Phase p) noexcept {
  switch (p) {
    case PoolLife::Phase::starting:
      return "starting";
    case PoolLife::Phase::running:
      return "running";
    case PoolLife::Phase::closing:
      return "closing";
    case PoolLife::Phase::stopping:
      return "stopping";
    case PoolLife::Phase::closed:
      return "closed";
  }
  return "?";
}

void PoolLife::move(Phase from, Phase to) {
  if (phase_ != from) {
    throw Error(Errc::invalid_argument, std::string("pool life: to ") + phase_name(to) + " from " +
                                            phase_name(phase_) + ", not from " + phase_name(from));
  }
  phase_ = to;
}

void PoolLife::started_running() {
  move(Phase::starting, Phase::running);
}

void PoolLife::begin_close() {
  move(Phase::running, Phase::closing);
}

void PoolLife::begin_stop(bool kill) {
  move(Phase::closing, Phase::stopping);
  kill_ = kill_ || kill;
}

void PoolLife::end() {
  move(Phase::stopping, Phase::closed);
}

void PoolLife::ask_kill() {
  if (phase_ != Phase::closed) kill_ = true;  // a closed pool has nothing left to kill
}

}  // namespace ferry::supervisor
