// Which chunks a tensor in virtual memory travels as, and what a receiver checks before it maps
// them: the pure rules of ipc/cuda/vmm_span.hpp, one case each.
#include "../catch.hpp"

#include <map>

#include "ipc/cuda/vmm_span.hpp"

namespace ferry::cuda {
namespace {

using Catch::Contains;

constexpr std::uint64_t kChunk = 2 << 20;  // LibTorch's small-pool chunk
constexpr std::uint64_t kBase = 0x7f0000000000;

// An owner's address space: chunks by base, as the driver would report them.
struct Space {
  std::map<std::uint64_t, Chunk> chunks;
  std::uint64_t next_id = 1;
  void add(std::uint64_t base, std::uint64_t size = kChunk, bool fd = true, int device = 0) {
    chunks[base] = Chunk{base, size, next_id++, device, fd};
  }
  ChunkAt lookup() const {
    return [this](std::uint64_t addr, Chunk* out) -> Status {
      auto it = chunks.upper_bound(addr);
      if (it == chunks.begin()) return {1, "not mapped"};
      --it;
      if (addr >= it->first + it->second.size) return {1, "not mapped"};
      *out = it->second;
      return {};
    };
  }
};

TEST_CASE("vmm span: a tensor inside one chunk is a span of that chunk alone", "[vmm]") {
  Space s;
  for (int i = 0; i < 3; ++i) s.add(kBase + i * kChunk);
  Span span;
  REQUIRE(plan_span(kBase + kChunk + 4096, 1024, s.lookup(), &span) == "");
  REQUIRE(span.chunks.size() == 1);
  CHECK(span.base == kBase + kChunk);
  CHECK(span.size == kChunk);
  CHECK(span.digest == span_digest(span.chunks));
}

TEST_CASE("vmm span: a tensor across chunks is one span of them, in order", "[vmm]") {
  Space s;
  for (int i = 0; i < 4; ++i) s.add(kBase + i * kChunk);
  Span span;
  // From the middle of chunk 0 to the middle of chunk 2.
  REQUIRE(plan_span(kBase + kChunk / 2, 2 * kChunk, s.lookup(), &span) == "");
  REQUIRE(span.chunks.size() == 3);
  CHECK(span.base == kBase);
  CHECK(span.size == 3 * kChunk);
  for (std::size_t i = 0; i < 3; ++i) CHECK(span.chunks[i].base == kBase + i * kChunk);
  // A tensor ending exactly at a chunk's end takes no chunk after it.
  REQUIRE(plan_span(kBase, kChunk, s.lookup(), &span) == "");
  CHECK(span.chunks.size() == 1);
}

TEST_CASE("vmm span: bytes that cannot travel by fd are refused, each with its reason", "[vmm]") {
  Span span;
  SECTION("memory not made for fd export") {
    Space s;
    s.add(kBase, kChunk, false);
    CHECK_THAT(plan_span(kBase, 16, s.lookup(), &span), Contains("not made for export"));
  }
  SECTION("a gap in the address space") {
    Space s;
    s.add(kBase);
    s.add(kBase + 2 * kChunk);
    CHECK_THAT(plan_span(kBase, 2 * kChunk, s.lookup(), &span), Contains("locating"));
    s.add(kBase + kChunk, kChunk / 2);  // a shorter chunk leaves a hole before the next
    CHECK_THAT(plan_span(kBase, 2 * kChunk + 1, s.lookup(), &span), Contains("locating"));
  }
  SECTION("another device") {
    Space s;
    s.add(kBase);
    s.add(kBase + kChunk, kChunk, true, 1);
    CHECK_THAT(plan_span(kBase, kChunk + 1, s.lookup(), &span), Contains("more than one device"));
  }
  SECTION("more chunks than one message can carry fds for") {
    Space s;
    for (std::size_t i = 0; i <= kMaxSpanChunks; ++i) s.add(kBase + i * kChunk);
    CHECK(plan_span(kBase, kMaxSpanChunks * kChunk, s.lookup(), &span) == "");
    CHECK_THAT(plan_span(kBase, kMaxSpanChunks * kChunk + 1, s.lookup(), &span),
               Contains("more than 128"));
  }
  SECTION("an answer that does not contain the address asked") {
    ChunkAt wrong = [](std::uint64_t, Chunk* out) -> Status {
      *out = Chunk{kBase + kChunk, kChunk, 1, 0, true};
      return {};
    };
    CHECK_THAT(plan_span(kBase, 16, wrong, &span), Contains("does not contain it"));
  }
}

TEST_CASE("vmm span: a chunk freed and mapped anew at the same place changes the digest", "[vmm]") {
  Space s;
  s.add(kBase);
  s.add(kBase + kChunk);
  Span before;
  REQUIRE(plan_span(kBase, 2 * kChunk, s.lookup(), &before) == "");
  s.add(kBase + kChunk);  // same place and size, a new buffer id
  Span after;
  REQUIRE(plan_span(kBase, 2 * kChunk, s.lookup(), &after) == "");
  CHECK(before.base == after.base);
  CHECK(before.size == after.size);
  CHECK(before.digest != after.digest);
}

TEST_CASE("vmm span: its description crosses intact, and a damaged one is refused", "[vmm]") {
  Space s;
  for (int i = 0; i < 3; ++i) s.add(kBase + i * kChunk);
  Span span;
  REQUIRE(plan_span(kBase, 3 * kChunk, s.lookup(), &span) == "");
  const std::string bytes = encode_span(span);
  Span back;
  REQUIRE(decode_span(bytes, &back) == "");
  CHECK(back.base == span.base);
  CHECK(back.size == span.size);
  CHECK(back.digest == span.digest);
  REQUIRE(back.chunks.size() == 3);
  CHECK(back.chunks[2].buffer_id == span.chunks[2].buffer_id);
  CHECK(check_span(back, kChunk) == "");

  CHECK_THAT(decode_span(bytes.substr(0, 10), &back), Contains("too short"));
  CHECK_THAT(decode_span(bytes.substr(0, bytes.size() - 1), &back), Contains("cannot hold"));
  std::string bad = bytes;
  bad[0] ^= 1;
  CHECK_THAT(decode_span(bad, &back), Contains("magic"));
}

TEST_CASE("vmm span: the receiver maps only a span whose chunks add up and match the digest",
          "[vmm]") {
  Space s;
  for (int i = 0; i < 3; ++i) s.add(kBase + i * kChunk);
  Span span;
  REQUIRE(plan_span(kBase, 3 * kChunk, s.lookup(), &span) == "");
  REQUIRE(check_span(span, kChunk) == "");
  Span t = span;
  t.chunks[1].base += 4096;
  CHECK_THAT(check_span(t, 4096), Contains("does not follow"));
  t = span;
  t.size += kChunk;
  CHECK_THAT(check_span(t, kChunk), Contains("the span says"));
  CHECK_THAT(check_span(span, 3 << 20), Contains("granules"));
  t = span;
  t.chunks[0].buffer_id = 999;
  CHECK_THAT(check_span(t, kChunk), Contains("digest"));
  CHECK_THAT(check_span(Span{}, kChunk), Contains("no chunks"));
}

}  // namespace
}  // namespace ferry::cuda
