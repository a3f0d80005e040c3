// HubLife: where a head's hub of hosts is, one phase at a time, with every transition here (the
// hub's lock is held around each call).
//
//   idle --start--> admitting --stop--> stopping
//   idle --stop--> stopping
//
// - idle: made, listening (hosts may knock), no pool given yet;
// - admitting: start() gave it its pool: hosts are admitted and handed tasks;
// - stopping: stop() was called: no host is admitted, each is told goodbye and its threads end.
// A hub serves one pool, once: start() in any phase but idle is the caller's error. A second
// stop() does nothing, so a destructor may call it after an explicit one.
#pragma once

namespace ferry::hosts {

class HubLife {
 public:
  enum class Phase { idle, admitting, stopping };

  Phase phase() const noexcept { return phase_; }
  bool stopping() const noexcept { return phase_ == Phase::stopping; }

  // idle -> admitting; Error(invalid_argument) from any other phase.
  void start();
  // -> stopping; false (and no change) when already stopping: that stop() does the rest.
  bool stop() noexcept;

 private:
  Phase phase_ = Phase::idle;
};

const char* phase_name(HubLife::Phase p) noexcept;

}  // namespace ferry::hosts
