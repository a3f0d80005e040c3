// PoolLife: where a pool is between its start and the end of its close, one phase at a time, with
// every transition here (the board's lock is held around each call).
//
//   starting --started--> running --begin_close--> closing --begin_stop--> stopping --end--> closed
//
// - starting: the workers are handshaking; the constructor has not returned;
// - running: tasks are taken;
// - closing: close() was called: submissions are refused, and a drain waits for the book to empty;
// - stopping: the monitor stops the workers (a stop token and a grace period, or SIGKILL at once
//   where a kill was asked) and returns;
// - closed: close() finished; a second close() does nothing.
// A kill (Shutdown::Kill) may be asked in any phase before closed: it cuts short a drain that
// another thread waits on, and the stop then kills at once, whatever manner of close began it. A
// transition out of its order is a bug in the pool and throws Error(invalid_argument) naming both
// phases.
#pragma once

namespace ferry::supervisor {

class PoolLife {
 public:
  enum class Phase { starting, running, closing, stopping, closed };

  Phase phase() const noexcept { return phase_; }
  bool started() const noexcept { return phase_ != Phase::starting; }   // the constructor returned
  bool closing() const noexcept { return phase_ >= Phase::closing; }    // submissions refused
  bool stopping() const noexcept { return phase_ >= Phase::stopping; }  // the monitor stops all
  bool closed() const noexcept { return phase_ == Phase::closed; }
  bool kill_asked() const noexcept { return kill_; }  // the stop kills at once

  void started_running();  // starting -> running: every worker handshook once
  void begin_close();      // running -> closing
  // closing -> stopping; `kill`: by SIGKILL at once (a kill asked before stays asked).
  void begin_stop(bool kill);
  void end();       // stopping -> closed
  void ask_kill();  // before closed; nothing once closed

 private:
  void move(Phase from, Phase to);

  Phase phase_ = Phase::starting;
  bool kill_ = false;
};

const char* phase_name(PoolLife::Phase p) noexcept;

}  // namespace ferry::supervisor
