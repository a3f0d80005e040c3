// The lives of a head's hub and of a host's side of its link, alone: their phases in order, what
// each says, and the transitions that change nothing.
#include <string>

#include "../catch.hpp"

#include "hosts/hub_life.hpp"
#include "hosts/serve_life.hpp"
#include "ipc/error.hpp"

namespace ferry::hosts {

TEST_CASE("hub life: idle, admitting, stopping, and a second stop does nothing") {
  HubLife l;
  CHECK(l.phase() == HubLife::Phase::idle);
  CHECK_FALSE(l.stopping());
  l.start();
  CHECK(l.phase() == HubLife::Phase::admitting);
  CHECK_FALSE(l.stopping());
  CHECK(l.stop());  // this caller tells the hosts and joins their threads
  CHECK(l.stopping());
  CHECK_FALSE(l.stop());  // a destructor's stop() after an explicit one
  CHECK(l.stopping());
}

TEST_CASE("hub life: a hub serves one pool, once, and a stopped one none") {
  HubLife twice;
  twice.start();
  try {
    twice.start();
    FAIL("a second start() was taken");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(std::string(e.what()).find("one pool, once (it is admitting)") != std::string::npos);
  }
  HubLife stopped;
  CHECK(stopped.stop());  // stopped before any pool was given
  CHECK_THROWS_AS(stopped.start(), Error);
  CHECK(stopped.stopping());
}

TEST_CASE("serve life: starting, serving, leaving, closed, and what each phase says") {
  ServeLife l(true);
  CHECK(l.starting());  // heartbeats say so: the head hands it nothing yet
  CHECK(l.takes_results());
  CHECK(l.ready());
  CHECK(l.phase() == ServeLife::Phase::serving);
  CHECK_FALSE(l.starting());
  CHECK(l.takes_results());
  CHECK_FALSE(l.ready());  // once
  CHECK(l.leave());
  CHECK(l.leaving());
  CHECK_FALSE(l.takes_results());  // a result that comes now is dropped: the head retries it
  CHECK_FALSE(l.leave());          // the goodbye goes once
  l.close();
  CHECK(l.closed());
  CHECK_FALSE(l.leaving());
  CHECK_FALSE(l.leave());
  CHECK_FALSE(l.takes_results());
}

TEST_CASE("serve life: a pool that ends its start after the goodbye does not take it back") {
  ServeLife l(true);
  CHECK(l.leave());  // the head said goodbye, or the pool's start failed
  CHECK_FALSE(l.ready());
  CHECK(l.leaving());
  CHECK_FALSE(l.starting());
}

TEST_CASE("serve life: a host whose pool already runs serves from the start") {
  ServeLife l(false);
  CHECK(l.phase() == ServeLife::Phase::serving);
  CHECK_FALSE(l.ready());
  ServeLife closed(false);
  closed.close();  // serving returns without a goodbye: the link broke
  CHECK(closed.closed());
  CHECK_FALSE(closed.takes_results());
}

}  // namespace ferry::hosts
