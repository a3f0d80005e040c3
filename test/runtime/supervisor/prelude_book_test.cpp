// What one worker holds of the tasks' preludes, as its slot's sends tell it: once each, the
// least recently used forgotten for room, nothing recorded for a send that did not go.
#include "runtime/supervisor/prelude_book.hpp"

#include "../../catch.hpp"

namespace ferry::supervisor {

TEST_CASE("prelude book: a prelude is attached the first time, then named only") {
  PreludeBook book(4);
  auto p = book.plan(7);
  CHECK(p.attach);
  CHECK(p.forget == 0);
  book.sent(7, p);
  CHECK(book.holds(7));
  p = book.plan(7);
  CHECK_FALSE(p.attach);
  CHECK(p.forget == 0);
  book.sent(7, p);
  CHECK(book.size() == 1);
}

TEST_CASE("prelude book: a send that did not go through records nothing") {
  PreludeBook book(4);
  const auto p = book.plan(7);  // planned, then the send failed: sent() is not called
  CHECK(p.attach);
  CHECK_FALSE(book.holds(7));
  CHECK(book.plan(7).attach);  // the next send attaches it again
}

TEST_CASE("prelude book: when full, the least recently used is forgotten to make room") {
  PreludeBook book(3);
  for (std::uint64_t id : {1, 2, 3}) book.sent(id, book.plan(id));
  book.sent(1, book.plan(1));  // 1 used again: 2 is now the least recent
  const auto p = book.plan(4);
  CHECK(p.attach);
  CHECK(p.forget == 2);
  book.sent(4, p);
  CHECK(book.size() == 3);
  CHECK_FALSE(book.holds(2));
  CHECK(book.holds(1));
  CHECK(book.holds(3));
  CHECK(book.holds(4));
  CHECK(book.plan(2).attach);  // forgotten: attached again when named again
}

TEST_CASE("prelude book: a new process holds nothing") {
  PreludeBook book(3);
  book.sent(5, book.plan(5));
  book.clear();
  CHECK(book.size() == 0);
  CHECK(book.plan(5).attach);
}

}  // namespace ferry::supervisor
