// ServeLife: where a host's side of the link to its head is, as its sender thread speaks for it,
// one phase at a time, with every transition here (the outbox's lock is held around each call).
//
//   starting --ready--> serving --leave--> leaving
//   starting --leave--> leaving                       (the pool did not start)
//   any --close--> closed                              (serving is returning)
//
// - starting: the host's pool is starting: heartbeats say so, and the head hands it no task yet;
// - serving: results go back as they come; the first plain heartbeat tells the head it is ready;
// - leaving: the goodbye goes once what is queued is sent; no result is taken any more;
// - closed: the link is done with: nothing more is sent.
// ready() after leave() changes nothing: a pool that finished starting while its host was already
// saying goodbye does not take the goodbye back.
#pragma once

namespace ferry::hosts {

class ServeLife {
 public:
  enum class Phase { starting, serving, leaving, closed };

  // `starting`: the pool is still starting (else it already runs).
  explicit ServeLife(bool starting) noexcept
      : phase_(starting ? Phase::starting : Phase::serving) {}

  Phase phase() const noexcept { return phase_; }
  bool starting() const noexcept { return phase_ == Phase::starting; }  // beats say so
  bool takes_results() const noexcept { return phase_ <= Phase::serving; }
  bool leaving() const noexcept { return phase_ == Phase::leaving; }  // a goodbye is due or sent
  bool closed() const noexcept { return phase_ == Phase::closed; }

  // starting -> serving; false (no change) from any other phase.
  bool ready() noexcept;
  // starting or serving -> leaving; false (no change) when leaving or closed already.
  bool leave() noexcept;
  // -> closed, from any phase.
  void close() noexcept { phase_ = Phase::closed; }

 private:
  Phase phase_;
};

}  // namespace ferry::hosts
