// The stream's wake rule alone: when a result that came in wakes the consumer, and how long a
// consumer sleeps while results may gather.
#include "runtime/supervisor/stream_wake.hpp"

#include "../../catch.hpp"

namespace ferry::supervisor {
namespace {

using namespace std::chrono_literals;

// A stream of fast tasks in full flow: 20 in the window, 15 in flight, inputs left, results
// 500 us apart, the oldest not yet taken just in.
StreamState flowing() {
  StreamState s;
  s.window = 20;
  s.in_flight = 15;
  s.inputs_left = true;
  s.typical_gap = 500us;
  s.oldest_ready = 0us;
  s.consumer_looks_again = true;
  return s;
}

}  // namespace

TEST_CASE("stream wake: results of fast tasks gather while the workers hold over half a window") {
  CHECK_FALSE(StreamWake::wake_now(flowing()));
  CHECK(StreamWake::sleep_limit(flowing()) == StreamWake::kHold);
}

TEST_CASE("stream wake: at half the window in flight the consumer is woken to refill it") {
  StreamState s = flowing();
  s.in_flight = 10;
  CHECK(StreamWake::wake_now(s));
  CHECK_FALSE(StreamWake::sleep_limit(s));
  s.in_flight = 11;
  CHECK_FALSE(StreamWake::wake_now(s));
  s.in_flight = 0;
  CHECK(StreamWake::wake_now(s));
}

TEST_CASE("stream wake: a stream with no inputs left hands each result back as it comes") {
  StreamState s = flowing();
  s.inputs_left = false;
  CHECK(StreamWake::wake_now(s));
  CHECK_FALSE(StreamWake::sleep_limit(s));
}

TEST_CASE("stream wake: slow results are never held") {
  StreamState s = flowing();
  s.typical_gap = StreamWake::kHold;
  CHECK(StreamWake::wake_now(s));
  CHECK_FALSE(StreamWake::sleep_limit(s));
  s.typical_gap = 1s;
  CHECK(StreamWake::wake_now(s));
  s.typical_gap.reset();  // the first result: nothing known of the gaps yet
  CHECK(StreamWake::wake_now(s));
  CHECK_FALSE(StreamWake::sleep_limit(s));
}

TEST_CASE("stream wake: a consumer asleep until woken is woken, whatever else holds") {
  StreamState s = flowing();
  s.consumer_looks_again = false;
  CHECK(StreamWake::wake_now(s));
}

TEST_CASE("stream wake: a result held for kHold wakes the consumer at the next one") {
  StreamState s = flowing();
  s.oldest_ready = StreamWake::kHold - 1us;
  CHECK_FALSE(StreamWake::wake_now(s));
  s.oldest_ready = StreamWake::kHold;
  CHECK(StreamWake::wake_now(s));
}

TEST_CASE("stream wake: the typical gap is a moving average of the gaps between results") {
  StreamWake w;
  const Clock::time_point t0{};
  w.record_arrival(t0);
  CHECK_FALSE(w.typical_gap());  // one result: no gap yet
  w.record_arrival(t0 + 1ms);
  REQUIRE(w.typical_gap());
  CHECK(*w.typical_gap() == 1ms);
  w.record_arrival(t0 + 1ms);  // two at once
  CHECK(*w.typical_gap() == 750us);
  w.record_arrival(t0 + 9ms);            // one long gap: a quarter of it
  CHECK(*w.typical_gap() == 2562500ns);  // 750 us + (8 ms - 750 us) / 4
  const Clock::duration before = *w.typical_gap();
  w.record_arrival(t0);  // a clock read out of order counts as a gap of 0, not a negative one
  CHECK(*w.typical_gap() == before - before / 4);
}

}  // namespace ferry::supervisor
