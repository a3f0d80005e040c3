// The pool's life alone: its phases in order, what each says, and a kill asked on the way.
#include "runtime/supervisor/pool_life.hpp"

#include "../../catch.hpp"

#include "ipc/error.hpp"

namespace ferry::supervisor {

TEST_CASE("pool life: starting, running, closing, stopping, closed, and what each phase says") {
  PoolLife l;
  CHECK(l.phase() == PoolLife::Phase::starting);
  CHECK_FALSE(l.started());
  CHECK_FALSE(l.closing());
  l.started_running();
  CHECK(l.started());
  CHECK_FALSE(l.closing());
  l.begin_close();
  CHECK(l.closing());  // submissions refused from here
  CHECK_FALSE(l.stopping());
  l.begin_stop(false);
  CHECK(l.stopping());
  CHECK_FALSE(l.kill_asked());
  CHECK_FALSE(l.closed());
  l.end();
  CHECK(l.closed());
  CHECK(l.started());
  CHECK(l.closing());
  CHECK(l.stopping());
}

TEST_CASE("pool life: a step out of its order throws, naming where the pool is and was to be") {
  PoolLife l;
  CHECK_THROWS_WITH(l.begin_close(), Catch::Contains("to closing from starting"));
  l.started_running();
  CHECK_THROWS_WITH(l.started_running(), Catch::Contains("from running, not from starting"));
  CHECK_THROWS_WITH(l.begin_stop(false), Catch::Contains("not from closing"));
  CHECK_THROWS_AS(l.end(), Error);
  l.begin_close();
  CHECK_THROWS_WITH(l.begin_close(), Catch::Contains("from closing, not from running"));
  CHECK(l.phase() == PoolLife::Phase::closing);  // a refused step changes nothing
}

TEST_CASE("pool life: a kill asked before the stop stays asked, whatever manner of close began") {
  PoolLife l;
  l.started_running();
  l.ask_kill();  // a Shutdown::Kill from another thread, while this one drains
  CHECK(l.kill_asked());
  l.begin_close();
  l.begin_stop(false);
  CHECK(l.kill_asked());
  l.end();
  l.ask_kill();  // nothing left to kill
  CHECK(l.closed());

  PoolLife k;
  k.started_running();
  k.begin_close();
  k.begin_stop(true);
  CHECK(k.kill_asked());
}

}  // namespace ferry::supervisor
