// The frame that leads every message between hosts: what goes in comes out, and a frame that
// would make the receiver post a wrong-sized receive is refused before anything is posted.
#include "hosts/host_frame.hpp"

#include <cstring>
#include <string>
#include "../catch.hpp"

#include "ipc/error.hpp"
#include "ipc/wire.hpp"

namespace ferry::hosts {
namespace {

constexpr std::uint64_t kNoLimit = UINT64_MAX;
const auto f32 = static_cast<std::uint8_t>(wire::DType::float32);
const auto i64 = static_cast<std::uint8_t>(wire::DType::int64);

Errc code_of_decode(const FrameBytes& b, std::uint64_t limit = kNoLimit) {
  try {
    decode_frame(b, limit);
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::system;  // "no error", which no check expects
}

}  // namespace

TEST_CASE("hosts: a frame decodes to what was encoded", "[multihost]") {
  Frame f;
  f.kind = FrameKind::task;
  f.seq = 0x1234'5678'9abcull;
  f.body = "mlp {\"width\": 64}";
  f.tensors = {
      {f32, {64, 64}}, {i64, {}}, {f32, {0, 3}}, {f32, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}};
  const Frame g = decode_frame(encode_frame(f), kNoLimit);
  CHECK(g.kind == FrameKind::task);
  CHECK(g.seq == f.seq);
  CHECK(g.body == f.body);
  CHECK(g.tensors == f.tensors);
  CHECK(payload_bytes(g.tensors[0]) == 64 * 64 * 4);
  CHECK(payload_bytes(g.tensors[1]) == 8);  // a scalar has one element
  CHECK(payload_bytes(g.tensors[2]) == 0);
}

TEST_CASE("hosts: what a frame cannot carry is refused when sending, naming the limit",
          "[multihost]") {
  using Catch::Contains;
  Frame many;
  many.tensors.assign(kMaxFrameTensors + 1, {f32, {1}});
  CHECK_THROWS_WITH(encode_frame(many), Contains("at most 64 tensors") && Contains("65"));
  Frame body;
  body.body.assign(kMaxFrameBody + 1, 'x');
  CHECK_THROWS_WITH(encode_frame(body), Contains("pass large arguments as tensors"));
  Frame rank;
  rank.tensors = {{f32, std::vector<std::int64_t>(kMaxFrameDims + 1, 1)}};
  CHECK_THROWS_WITH(encode_frame(rank), Contains("13"));
  Frame negative;
  negative.tensors = {{f32, {4, -1}}};
  CHECK_THROWS_WITH(encode_frame(negative), Contains("-1"));
}

TEST_CASE("hosts: a damaged frame is refused before any payload is posted", "[multihost]") {
  Frame f;
  f.kind = FrameKind::result;
  f.tensors = {{f32, {1024}}};
  const FrameBytes good = encode_frame(f);
  // The fixed part: magic 0-7, version 8-11, kind 12, tensor count 13, body length 14-15,
  // sequence 16-23, inline bytes 24-27, flags 28-31; the first entry at 32: dtype, rank, then
  // sizes at 40.
  auto damaged = [&](std::size_t at, std::uint8_t value) {
    FrameBytes b = good;
    b[at] = value;
    return b;
  };
  CHECK(code_of_decode(damaged(0, 0)) == Errc::bad_record);      // magic
  CHECK(code_of_decode(damaged(8, 7)) == Errc::bad_record);      // version
  CHECK(code_of_decode(damaged(12, 9)) == Errc::bad_record);     // kind
  CHECK(code_of_decode(damaged(13, 33)) == Errc::bad_record);    // tensor count
  CHECK(code_of_decode(damaged(15, 0x40)) == Errc::bad_record);  // body length
  CHECK(code_of_decode(damaged(24, 1)) == Errc::bad_record);     // inline bytes, none there
  CHECK(code_of_decode(damaged(32, 200)) == Errc::bad_record);   // dtype code
  CHECK(code_of_decode(damaged(33, 13)) == Errc::bad_record);    // rank
  CHECK(code_of_decode(damaged(47, 0x80)) == Errc::bad_record);  // a negative size
  // Sizes whose product overflows, and a payload over the link's limit.
  Frame huge;
  huge.tensors = {{f32, {INT64_MAX, 4}}};
  CHECK(code_of_decode(encode_frame(huge)) == Errc::bad_record);
  CHECK(code_of_decode(good, 4095) == Errc::bad_record);
  CHECK_NOTHROW(decode_frame(good, 4096));
}

TEST_CASE("hosts: small payloads ride in the frame, exactly their bytes", "[multihost]") {
  using Catch::Contains;
  Frame f;
  f.kind = FrameKind::result;
  f.seq = 9;
  f.body = "ok";
  f.tensors = {{f32, {2, 3}}, {i64, {}}, {f32, {0}}};
  for (int i = 0; i < 6 * 4 + 8; ++i) f.payload.push_back(static_cast<char>(i));
  const FrameBytes bytes = encode_frame(f);
  const Frame g = decode_frame(bytes, kNoLimit);
  CHECK(g.tensors == f.tensors);
  CHECK(g.body == "ok");
  CHECK(g.payload == f.payload);
  // The room is what the entries and the body leave of the frame; a payload must be exactly the
  // tensors' bytes and fit it, or nothing is sent.
  CHECK(frame_room(3, 2) < kFrameBytes);
  CHECK(frame_room(1, 0) > frame_room(2, 0));
  CHECK(frame_room(1, 0) >= 16000);
  Frame short_one = f;
  short_one.payload.pop_back();
  CHECK_THROWS_WITH(encode_frame(short_one), Contains("31 bytes for 32 bytes of tensors"));
  Frame too_big;
  too_big.tensors = {{f32, {static_cast<std::int64_t>(frame_room(1, 0) / 4 + 1)}}};
  too_big.payload.assign(static_cast<std::size_t>(payload_bytes(too_big.tensors[0])), 'x');
  CHECK_THROWS_WITH(encode_frame(too_big), Contains("in a frame with room for"));
  // A frame that says its payload is inline, with the wrong length, is refused on receipt.
  FrameBytes lying = bytes;
  lying[24] = static_cast<std::uint8_t>(lying[24] + 1);
  CHECK(code_of_decode(lying) == Errc::bad_record);
}

TEST_CASE("hosts: a payload rides in the frame, in one slab, or apart, by its size",
          "[multihost]") {
  const std::size_t room = frame_room(1, 0);
  CHECK(payload_carrier(0, room) == Carrier::none);
  CHECK(payload_carrier(1, room) == Carrier::frame);
  CHECK(payload_carrier(room, room) == Carrier::frame);
  CHECK(payload_carrier(room + 1, room) == Carrier::slab);
  CHECK(payload_carrier(kSlabBytes, room) == Carrier::slab);  // a 64 KiB tensor, exactly
  CHECK(payload_carrier(kSlabBytes + 1, room) == Carrier::apart);
  CHECK(payload_carrier(std::uint64_t{1} << 40, room) == Carrier::apart);
  // A receiver passes 0 for a frame that came without its payload, and so expects a slab for what
  // would have fitted the frame: the sender chose.
  CHECK(payload_carrier(4096, 0) == Carrier::slab);
  CHECK(payload_carrier(0, 0) == Carrier::none);
  CHECK(std::string(carrier_name(Carrier::slab)) == "slab");
  // A receiver reads the carrier off the decoded frame by the same rule.
  auto received = [](std::vector<TensorShape> tensors, std::string payload) {
    Frame f;
    f.tensors = std::move(tensors);
    f.payload = std::move(payload);
    return carrier_of(decode_frame(encode_frame(f), kNoLimit));
  };
  CHECK(received({}, "") == Carrier::none);
  CHECK(received({{f32, {0, 3}}}, "") == Carrier::none);
  CHECK(received({{f32, {2}}}, std::string(8, 'x')) == Carrier::frame);
  CHECK(received({{f32, {2}}}, "") == Carrier::slab);  // the sender chose not to inline it
  CHECK(received({{f32, {static_cast<std::int64_t>(kSlabBytes / 4)}}}, "") == Carrier::slab);
  CHECK(received({{f32, {static_cast<std::int64_t>(kSlabBytes / 4) + 1}}}, "") == Carrier::apart);
}

TEST_CASE("hosts: a frame goes wide as its sender announced, and announces wide after a slab",
          "[multihost]") {
  using P = MessagePlan;
  auto plan = [](Carrier c, bool announced) {
    const P p = plan_message(c, announced);
    return std::vector<bool>{p.wide, p.slab_apart, p.announce_wide};
  };
  // Announced narrow: a slab follows apart, and the next frame is announced wide.
  CHECK(plan(Carrier::none, false) == std::vector<bool>{false, false, false});
  CHECK(plan(Carrier::frame, false) == std::vector<bool>{false, false, false});
  CHECK(plan(Carrier::slab, false) == std::vector<bool>{false, true, true});
  CHECK(plan(Carrier::apart, false) == std::vector<bool>{false, false, false});
  // Announced wide: the frame goes wide whatever it carries (the receiver posted that size); a
  // slab fills its room (not apart) and keeps the stream wide, anything else pads it and ends it.
  CHECK(plan(Carrier::none, true) == std::vector<bool>{true, false, false});
  CHECK(plan(Carrier::frame, true) == std::vector<bool>{true, false, false});
  CHECK(plan(Carrier::slab, true) == std::vector<bool>{true, false, true});
  CHECK(plan(Carrier::apart, true) == std::vector<bool>{true, false, false});
  CHECK(kWideFrameBytes == kFrameBytes + kSlabBytes);
}

TEST_CASE("hosts: a frame's word that the next is wide survives encoding, unknown flags fail",
          "[multihost]") {
  Frame f;
  f.kind = FrameKind::result;
  f.tensors = {{f32, {4096}}};
  CHECK_FALSE(decode_frame(encode_frame(f), kNoLimit).next_wide);
  f.next_wide = true;
  const FrameBytes wide = encode_frame(f);
  CHECK(decode_frame(wide, kNoLimit).next_wide);
  // Flags at 28-31: bit 0 is the only one known.
  FrameBytes unknown = wide;
  unknown[28] = 0x03;
  CHECK(code_of_decode(unknown) == Errc::bad_record);
  unknown[28] = 0x01;
  unknown[31] = 0x80;
  CHECK(code_of_decode(unknown) == Errc::bad_record);
}

TEST_CASE("host frame: a result's body says ok or carries the task's error, cut to fit") {
  using Catch::Contains;
  CHECK(parse_result_body(result_body(true, "")).ok);
  const ResultBody e = parse_result_body(result_body(false, "boom: bad input"));
  CHECK_FALSE(e.ok);
  CHECK(e.error == "boom: bad input");
  CHECK(parse_result_body(result_body(false, "")).error == "(no message)");
  const std::string long_text(2000, 'x');
  const std::string body = result_body(false, long_text);
  CHECK(body.size() == kMaxFrameBody);
  CHECK_THAT(parse_result_body(body).error, Catch::EndsWith("[...]"));
  CHECK_THROWS_AS(parse_result_body("okay"), Error);
  CHECK_THROWS_WITH(parse_result_body(""), Contains("neither"));
}

TEST_CASE("hosts: a task's body names its task, and its prelude where it has one", "[multihost]") {
  const TaskBody plain = parse_task_body(task_body("sleep_echo", 0, 0), 2);
  CHECK(plain.name == "sleep_echo");
  CHECK(plain.prelude == 0);
  CHECK(plain.prelude_tensors == 0);
  const TaskBody with = parse_task_body(task_body("python", 12345678901ull, 1), 3);
  CHECK(with.name == "python");
  CHECK(with.prelude == 12345678901ull);
  CHECK(with.prelude_tensors == 1);
  using Catch::Contains;
  // More prelude tensors than the frame has, a prelude part cut short, an id of 0.
  CHECK_THROWS_WITH(parse_task_body(task_body("python", 5, 4), 3), Contains("frame's 3"));
  CHECK_THROWS_WITH(parse_task_body("\x1e"
                                    "5 1python",
                                    3),
                    Contains("malformed"));
  CHECK_THROWS_WITH(parse_task_body("\x1e"
                                    "0 1\x1epython",
                                    3),
                    Contains("malformed"));
  CHECK_THROWS_WITH(parse_task_body("\x1e"
                                    "5 1x\x1epython",
                                    3),
                    Contains("malformed"));
}

}  // namespace ferry::hosts
