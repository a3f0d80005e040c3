// The fixed-size header that leads every message on a link between two hosts
// (docs/multi-host.md, "The link").
//
// A Gloo receive must be posted with exactly the size that was sent: one that differs aborts the
// receiving process. So every message is a frame of kFrameBytes first, which the receiver checks
// here before it posts anything else; the frame says how many payload tensors follow, with their
// dtypes and sizes, and the receiver posts a receive of exactly that size for each. A frame that
// fails the check is refused with Error(bad_record) and the link is given up: nothing is guessed.
//
// Payloads small enough to fit in the frame's room ride in it (inline): the message is then one
// Gloo send, not one plus one per tensor, each of which waits for the peer to post its receive.
// That is most results and small tasks (a round trip of 4 KiB went from 3.3x plain Gloo's).
// Payloads up to kSlabBytes follow in one slab of exactly that size, for which the receiver
// keeps a receive posted from its first receive on: a payload's own receive is posted only once its
// frame has come, and the sender's data waits for word of it, one more trip across the link each
// way (a 64 KiB round trip was 3.6x plain Gloo's). Larger payloads follow as one message per
// tensor, where that trip costs little against the transfer. payload_carrier() decides for a
// sender, carrier_of() reads a received frame by the same rule.
//
// A slab behind its frame is still a second Gloo message each way. So each frame also announces
// whether the sender's next frame will be wide (Frame::next_wide): a frame with a slab's room
// behind it, sent as one message of kWideFrameBytes, for which the receiver posts exactly that
// size. A sender announces a wide frame after a message that went in a slab (plan_message()), as
// a stream of tasks or results tends to go on as it went: in steady state a 64 KiB payload costs
// one message, not two; the message that changes the stream's size class pays once (a slab apart,
// or a wide frame's padding).
//
// Layout (little-endian, as both ends are the same build on the same architecture; a peer of the
// other byte order fails the magic): magic, version, kind, tensor count, body length, sequence
// number, inline payload bytes, flags (bit 0: the next frame is wide), then one entry per tensor
// (dtype, rank, sizes), the body, and the inline payloads one after the other.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::hosts {

inline constexpr std::size_t kFrameBytes = 16384;
inline constexpr std::size_t kMaxFrameTensors = 64;  // a task's most (worker_protocol.hpp)
inline constexpr std::size_t kMaxFrameDims = 12;     // as ipc/wire
// The body (a task's name and arguments, a result's error text) rides in the frame itself.
inline constexpr std::size_t kMaxFrameBody = 512;

enum class FrameKind : std::uint8_t {
  task = 1,       // head to host: run `body` on the tensors; `seq` names the task
  result = 2,     // host to head: the outputs of task `seq` (or its error in `body`)
  heartbeat = 3,  // either way, while idle: "still here" (a host's body: kStarting or empty)
  bye = 4,        // either way: the sender leaves; nothing follows
};
const char* frame_kind_name(FrameKind k) noexcept;

// A host's heartbeat body while its pool is still starting: the head gives it tasks only from its
// first other frame on (a host sends one as soon as its pool runs), so a map does not park tasks
// on a host that cannot run them yet, and "hosts live" means hosts that can.
inline constexpr const char* kStarting = "starting";

// The fixed size of a slab (above): a 64 KiB tensor fits it exactly. Padding a smaller payload to
// it cost the loopback less than the trip it saves (20 KiB: 2.5x plain Gloo's round trip before
// slabs, 2.0x with; docs/multi-host.md); over a real network it costs the padding's wire time.
inline constexpr std::size_t kSlabBytes = 65536;

// How a message's payload travels with its frame.
enum class Carrier : std::uint8_t {
  none,   // no payload bytes
  frame,  // in the frame (Frame::payload)
  slab,   // in one slab of kSlabBytes that follows the frame, the rest of it zeros
  apart,  // one message per tensor of a non-zero size, in order, each exactly its bytes
};
const char* carrier_name(Carrier c) noexcept;

// A wide frame: the frame, then a slab's room, in one message.
inline constexpr std::size_t kWideFrameBytes = kFrameBytes + kSlabBytes;

// How a sender puts one message on the link, given the carrier of its payload and whether its
// last frame announced this one as wide.
struct MessagePlan {
  // The frame goes as kWideFrameBytes (as announced), else kFrameBytes; a slab carrier's payload
  // fills a wide frame's slab room.
  bool wide = false;
  bool slab_apart = false;     // a slab carrier's payload follows as a slab message of its own
  bool announce_wide = false;  // this frame's next_wide: the sender's next frame will be wide
};
MessagePlan plan_message(Carrier carrier, bool announced_wide) noexcept;

// The carrier for `total` payload bytes in a frame with `room` bytes left for them
// (frame_room()). A sender passes the frame's room; a receiver passes the room of a frame that
// came without an inline payload as 0, and so expects what its sender chose.
Carrier payload_carrier(std::uint64_t total, std::size_t room) noexcept;

// One payload tensor as it travels: contiguous, `dtype` a ferry wire code (runtime/dtype.hpp).
struct TensorShape {
  std::uint8_t dtype = 0;
  std::vector<std::int64_t> sizes;
  bool operator==(const TensorShape& o) const { return dtype == o.dtype && sizes == o.sizes; }
};

struct Frame {
  FrameKind kind = FrameKind::heartbeat;
  std::uint64_t seq = 0;
  std::string body;
  std::vector<TensorShape> tensors;
  // The tensors' bytes one after the other when they ride in the frame (at most frame_room());
  // empty when they follow it as payloads of their own.
  std::string payload;
  // The sender's next frame is wide (kWideFrameBytes): its receiver posts that size next.
  bool next_wide = false;
};

// The bytes a frame with `tensors` tensors and a body of `body_bytes` has left for inline
// payloads.
std::size_t frame_room(std::size_t tensors, std::size_t body_bytes) noexcept;

using FrameBytes = std::array<std::uint8_t, kFrameBytes>;

// The frame's bytes. Error(invalid_argument) naming the limit for more than kMaxFrameTensors
// tensors, a body over kMaxFrameBody bytes, a rank over kMaxFrameDims, a negative size, or an
// inline payload that is not exactly the tensors' bytes or does not fit.
FrameBytes encode_frame(const Frame& f);

// The frame in `bytes`, checked: magic, version, kind, counts, dtype codes (those this build
// knows), ranks, sizes (non-negative, and the payload's total bytes at most `max_payload_bytes`
// without overflow), and an inline payload of exactly the tensors' bytes. Error(bad_record)
// naming the first field that is wrong.
Frame decode_frame(const FrameBytes& bytes, std::uint64_t max_payload_bytes);

// The carrier of a frame from decode_frame: in the frame when it came with its payload, else what
// payload_carrier() gives a sender for the tensors' bytes. A slab is in the frame's own slab room
// when the frame came wide, else it follows apart (plan_message()).
Carrier carrier_of(const Frame& f);

// A task frame's body: the task's name, and where the task has a prelude (runtime/prelude.hpp),
// its id on the head and how many of the frame's tensors, first, are its tensors.
std::string task_body(const std::string& name, std::uint64_t prelude, std::size_t prelude_tensors);
struct TaskBody {
  std::string name;
  std::uint64_t prelude = 0;
  std::size_t prelude_tensors = 0;
};
// Error(bad_record) for a prelude part that is malformed or claims more than `tensors` tensors.
TaskBody parse_task_body(const std::string& body, std::size_t tensors);

// A result frame's body: "ok", or "error: " and the task's error, cut to fit kMaxFrameBody.
std::string result_body(bool ok, const std::string& error);
struct ResultBody {
  bool ok = false;
  std::string error;  // when !ok
};
// Error(bad_record) for a body that is neither.
ResultBody parse_result_body(const std::string& body);

// Bytes of one payload tensor: the product of its sizes times its dtype's element size.
// Error(bad_record) for an unknown dtype or an overflow.
std::uint64_t payload_bytes(const TensorShape& t);

}  // namespace ferry::hosts
