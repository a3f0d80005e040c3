// Preludes across real worker processes: what many tasks share crosses once per worker, each
// task sees its own, and a worker that forgets one for room or restarts gets it again.
#include "runtime/prelude.hpp"

#include <signal.h>

#include "runtime/pool.hpp"
#include "runtime/worker_protocol.hpp"
#include "test_pools.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

using test::cpu_pool;

std::uint64_t preludes_sent(const Pool& pool) {
  std::uint64_t n = 0;
  for (const auto& w : pool.stats().workers) n += w.preludes_sent;
  return n;
}

// prelude_add's outputs for `input` under `prelude`: their sum and the prelude's id, checked.
void check_added(Tensors out, std::int64_t input, std::int64_t prelude, std::uint64_t id) {
  REQUIRE(out.size() == 2);
  CHECK(out[0].equal(at::full({4}, input + prelude, at::kLong)));
  CHECK(out[1].item<std::int64_t>() == static_cast<std::int64_t>(id));
}

}  // namespace

TEST_CASE("a prelude crosses once per worker, and every task sees it") {
  Pool pool(cpu_pool(2));
  const PreludePtr p = make_prelude({at::full({4}, 1000, at::kLong)});
  std::vector<std::future<Tensors>> out;
  for (std::int64_t i = 0; i < 40; ++i) {
    out.push_back(pool.submit("prelude_add", {at::full({4}, i, at::kLong)}, kForever, p));
  }
  for (std::int64_t i = 0; i < 40; ++i) check_added(out[i].get(), i, 1000, p->id);
  CHECK(preludes_sent(pool) >= 1);
  CHECK(preludes_sent(pool) <= 2);
  for (const auto& w : pool.stats().workers) CHECK(w.preludes_sent <= 1);
  // A task without one sees none, even in a worker that holds one.
  check_added(pool.submit("prelude_add", {at::full({4}, 5, at::kLong)}).get(), 5, 0, 0);
}

TEST_CASE("a stream's tasks share its prelude") {
  Pool pool(cpu_pool(2));
  const PreludePtr p = make_prelude({at::full({4}, 7, at::kLong)});
  auto results = pool.imap_unordered(
      "prelude_add",
      [](std::size_t i) -> std::optional<Tensors> {
        if (i == 30) return std::nullopt;
        return Tensors{at::full({4}, static_cast<std::int64_t>(i), at::kLong)};
      },
      p);
  std::size_t n = 0;
  while (auto r = results.next(30s)) {
    check_added(r->get(), static_cast<std::int64_t>(r->index), 7, p->id);
    ++n;
  }
  CHECK(n == 30);
  CHECK(preludes_sent(pool) <= 2);
}

TEST_CASE("a worker that forgot a prelude for room gets it again, and never mixes two up") {
  Pool pool(cpu_pool(1));
  // More than a worker keeps, named round and round: each is forgotten before it comes again.
  const std::size_t n = kPreludesPerWorker + 8;
  std::vector<PreludePtr> ps;
  for (std::size_t k = 0; k < n; ++k) {
    ps.push_back(make_prelude({at::full({4}, static_cast<std::int64_t>(100 * k), at::kLong)}));
  }
  std::vector<std::future<Tensors>> out;
  for (std::size_t round = 0; round < 2; ++round) {
    for (std::size_t k = 0; k < n; ++k) {
      out.push_back(pool.submit("prelude_add", {at::full({4}, 1, at::kLong)}, kForever, ps[k]));
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t k = i % n;
    check_added(out[i].get(), 1, static_cast<std::int64_t>(100 * k), ps[k]->id);
  }
  CHECK(preludes_sent(pool) == 2 * n);  // least recently used goes first: every one missed
  // Named again while it is held: not sent again.
  check_added(pool.submit("prelude_add", {at::full({4}, 2, at::kLong)}, kForever, ps[n - 1]).get(),
              2, static_cast<std::int64_t>(100 * (n - 1)), ps[n - 1]->id);
  CHECK(preludes_sent(pool) == 2 * n);
}

TEST_CASE("a restarted worker is sent the prelude again") {
  PoolOptions o = cpu_pool(1);
  o.max_retries = 0;
  Pool pool(o);
  const PreludePtr p = make_prelude({at::full({4}, 3, at::kLong)});
  check_added(pool.submit("prelude_add", {at::full({4}, 1, at::kLong)}, kForever, p).get(), 1, 3,
              p->id);
  CHECK(preludes_sent(pool) == 1);
  CHECK_THROWS_AS(pool.submit("segfault", {}, kForever, p).get(), TaskError);
  check_added(pool.submit("prelude_add", {at::full({4}, 2, at::kLong)}, kForever, p).get(), 2, 3,
              p->id);
  CHECK(pool.stats().workers[0].restarts == 1);
  CHECK(preludes_sent(pool) == 2);
}

TEST_CASE("a prelude that cannot be is refused, naming why") {
  CHECK_THROWS_WITH(make_prelude(Tensors(kMaxPreludeTensors + 1, at::zeros({1}))),
                    Catch::Contains("holds at most 8"));
  CHECK_THROWS_WITH(make_prelude({at::Tensor()}), Catch::Contains("not an undefined one"));
  CHECK(make_prelude({})->id != make_prelude({})->id);
  Pool pool(cpu_pool(1));
  const PreludePtr p = make_prelude({at::zeros({1}), at::zeros({1})});
  CHECK_THROWS_WITH(
      pool.submit("prelude_add", Tensors(protocol::kMaxTensorsPerTask - 1, at::zeros({1})),
                  kForever, p),
      Catch::Contains("and a prelude of 2"));
}

}  // namespace ferry
