#include "hosts/host_frame.hpp"

#include <cstdio>
#include <cstring>
#include <string>

#include "ipc/error.hpp"
#include "ipc/wire.hpp"

namespace ferry::hosts {
namespace {

constexpr std::uint64_t kMagic = 0x4b4e494c'59525246ull;  // "FRRYLINK" little-endian
// 2: 8 KiB, 64 tensors; 3: 16 KiB, inline payloads; 4: slabs; 5: wide frames announced
constexpr std::uint32_t kVersion = 6;
constexpr std::uint32_t kNextWide = 1;  // Head::flags

// The fixed part, then one entry per tensor, the body, and the inline payloads.
struct Head {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint8_t kind;
  std::uint8_t tensors;
  std::uint16_t body_bytes;
  std::uint64_t seq;
  std::uint32_t inline_bytes;
  std::uint32_t flags;
};
struct Entry {
  std::uint8_t dtype;
  std::uint8_t rank;
  std::uint8_t pad[6];
  std::int64_t sizes[kMaxFrameDims];
};
constexpr std::size_t kEntriesAt = sizeof(Head);
static_assert(kEntriesAt + kMaxFrameTensors * sizeof(Entry) + kMaxFrameBody <= kFrameBytes,
              "the frame's parts must fit its size");

std::size_t body_at(std::size_t tensors) {
  return kEntriesAt + tensors * sizeof(Entry);
}

[[noreturn]] void bad(const std::string& what) {
  throw Error(Errc::bad_record, "host link frame: " + what + "; the link is given up");
}

bool known_kind(std::uint8_t k) {
  return k >= static_cast<std::uint8_t>(FrameKind::task) &&
         k <= static_cast<std::uint8_t>(FrameKind::bye);
}

}  // namespace

const char* frame_kind_name(FrameKind k) noexcept {
  switch (k) {
    case FrameKind::task:
      return "task";
    case FrameKind::result:
      return "result";
    case FrameKind::heartbeat:
      return "heartbeat";
    case FrameKind::bye:
      return "bye";
  }
  return "unknown";
}

const char* carrier_name(Carrier c) noexcept {
  switch (c) {
    case Carrier::none:
      return "none";
    case Carrier::frame:
      return "frame";
    case Carrier::slab:
      return "slab";
    case Carrier::apart:
      return "apart";
  }
  return "unknown";
}

Carrier payload_carrier(std::uint64_t total, std::size_t room) noexcept {
  if (total == 0) return Carrier::none;
  if (total <= room) return Carrier::frame;
  if (total <= kSlabBytes) return Carrier::slab;
  return Carrier::apart;
}

MessagePlan plan_message(Carrier carrier, bool announced_wide) noexcept {
  MessagePlan p;
  p.wide = announced_wide;  // the receiver has posted that size: anything else would abort it
  const bool slab = carrier == Carrier::slab;
  p.slab_apart = slab && !p.wide;
  p.announce_wide = slab;
  return p;
}

Carrier carrier_of(const Frame& f) {
  if (!f.payload.empty()) return Carrier::frame;  // decode_frame checked that it is all of it
  std::uint64_t total = 0;
  for (const TensorShape& t : f.tensors) total += payload_bytes(t);
  return payload_carrier(total, 0);
}

// A task with a prelude: this mark, "<id> <tensors>", the mark again, then the name. No task
// name begins with a control character, so a plain name reads as itself.
constexpr char kPreludeMark = '\x1e';

std::string task_body(const std::string& name, std::uint64_t prelude, std::size_t prelude_tensors) {
  if (prelude == 0) return name;
  return kPreludeMark + std::to_string(prelude) + " " + std::to_string(prelude_tensors) +
         kPreludeMark + name;
}

TaskBody parse_task_body(const std::string& body, std::size_t tensors) {
  if (body.empty() || body[0] != kPreludeMark) return {body, 0, 0};
  const std::size_t end = body.find(kPreludeMark, 1);
  unsigned long long id = 0;
  std::size_t count = 0;
  int used = 0;
  if (end == std::string::npos ||
      std::sscanf(body.substr(1, end - 1).c_str(), "%llu %zu%n", &id, &count, &used) != 2 ||
      static_cast<std::size_t>(used) != end - 1 || id == 0 || count > tensors) {
    bad("a task's prelude part is malformed or claims more tensors than the frame's " +
        std::to_string(tensors));
  }
  return {body.substr(end + 1), static_cast<std::uint64_t>(id), count};
}

std::string result_body(bool ok, const std::string& error) {
  if (ok) return "ok";
  std::string body = "error: " + (error.empty() ? std::string("(no message)") : error);
  if (body.size() > kMaxFrameBody) {
    const std::string cut = " [...]";
    body.resize(kMaxFrameBody - cut.size());
    body += cut;
  }
  return body;
}

ResultBody parse_result_body(const std::string& body) {
  static const std::string error = "error: ";
  if (body == "ok") return {true, {}};
  if (body.compare(0, error.size(), error) == 0) return {false, body.substr(error.size())};
  bad("a result's body is neither 'ok' nor 'error: ...'");
}

std::size_t frame_room(std::size_t tensors, std::size_t body_bytes) noexcept {
  const std::size_t used = body_at(tensors) + body_bytes;
  return used >= kFrameBytes ? 0 : kFrameBytes - used;
}

std::uint64_t payload_bytes(const TensorShape& t) {
  const std::size_t elem = wire::element_size(t.dtype);
  if (elem == 0) bad("unknown dtype code " + std::to_string(t.dtype));
  std::uint64_t n = elem;
  for (const std::int64_t s : t.sizes) {
    if (s < 0) bad("negative size " + std::to_string(s));
    if (s != 0 && n > UINT64_MAX / static_cast<std::uint64_t>(s)) bad("tensor size overflows");
    n *= static_cast<std::uint64_t>(s);
  }
  return n;
}

FrameBytes encode_frame(const Frame& f) {
  if (f.tensors.size() > kMaxFrameTensors) {
    throw Error(Errc::invalid_argument, "a message between hosts carries at most " +
                                            std::to_string(kMaxFrameTensors) + " tensors, not " +
                                            std::to_string(f.tensors.size()) +
                                            ": stack them, or send them in several tasks");
  }
  if (f.body.size() > kMaxFrameBody) {
    throw Error(Errc::invalid_argument,
                "a message between hosts carries at most " + std::to_string(kMaxFrameBody) +
                    " bytes of task name and arguments, not " + std::to_string(f.body.size()) +
                    ": pass large arguments as tensors");
  }
  if (!f.payload.empty()) {
    std::uint64_t total = 0;
    for (const TensorShape& t : f.tensors) total += payload_bytes(t);
    if (total != f.payload.size() || total > frame_room(f.tensors.size(), f.body.size())) {
      throw Error(Errc::invalid_argument,
                  "an inline payload of " + std::to_string(f.payload.size()) + " bytes for " +
                      std::to_string(total) + " bytes of tensors, in a frame with room for " +
                      std::to_string(frame_room(f.tensors.size(), f.body.size())));
    }
  }
  FrameBytes out{};
  const Head head{kMagic,
                  kVersion,
                  static_cast<std::uint8_t>(f.kind),
                  static_cast<std::uint8_t>(f.tensors.size()),
                  static_cast<std::uint16_t>(f.body.size()),
                  f.seq,
                  static_cast<std::uint32_t>(f.payload.size()),
                  f.next_wide ? kNextWide : 0};
  std::memcpy(out.data(), &head, sizeof head);
  for (std::size_t i = 0; i < f.tensors.size(); ++i) {
    const TensorShape& t = f.tensors[i];
    if (t.sizes.size() > kMaxFrameDims) {
      throw Error(Errc::invalid_argument, "a tensor between hosts has at most " +
                                              std::to_string(kMaxFrameDims) + " dimensions, not " +
                                              std::to_string(t.sizes.size()));
    }
    Entry e{};
    e.dtype = t.dtype;
    e.rank = static_cast<std::uint8_t>(t.sizes.size());
    for (std::size_t d = 0; d < t.sizes.size(); ++d) {
      if (t.sizes[d] < 0) {
        throw Error(Errc::invalid_argument,
                    "a tensor size is negative: " + std::to_string(t.sizes[d]));
      }
      e.sizes[d] = t.sizes[d];
    }
    std::memcpy(out.data() + kEntriesAt + i * sizeof(Entry), &e, sizeof e);
  }
  const std::size_t at = body_at(f.tensors.size());
  std::memcpy(out.data() + at, f.body.data(), f.body.size());
  std::memcpy(out.data() + at + f.body.size(), f.payload.data(), f.payload.size());
  return out;
}

Frame decode_frame(const FrameBytes& bytes, std::uint64_t max_payload_bytes) {
  Head head{};
  std::memcpy(&head, bytes.data(), sizeof head);
  if (head.magic != kMagic) bad("bad magic: the peer is not a ferry host link");
  if (head.version != kVersion) {
    bad("version " + std::to_string(head.version) + ", this build speaks " +
        std::to_string(kVersion) + ": run the same ferry on every host");
  }
  if (!known_kind(head.kind)) bad("unknown kind " + std::to_string(head.kind));
  if (head.tensors > kMaxFrameTensors) bad(std::to_string(head.tensors) + " tensors");
  if (head.body_bytes > kMaxFrameBody) bad("a body of " + std::to_string(head.body_bytes));
  if ((head.flags & ~kNextWide) != 0) bad("unknown flags " + std::to_string(head.flags));
  Frame f;
  f.kind = static_cast<FrameKind>(head.kind);
  f.seq = head.seq;
  f.next_wide = (head.flags & kNextWide) != 0;
  const std::size_t at = body_at(head.tensors);
  f.body.assign(reinterpret_cast<const char*>(bytes.data() + at), head.body_bytes);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < head.tensors; ++i) {
    Entry e{};
    std::memcpy(&e, bytes.data() + kEntriesAt + i * sizeof(Entry), sizeof e);
    if (e.rank > kMaxFrameDims)
      bad("tensor " + std::to_string(i) + " of rank " + std::to_string(e.rank));
    TensorShape t;
    t.dtype = e.dtype;
    t.sizes.assign(e.sizes, e.sizes + e.rank);
    const std::uint64_t n = payload_bytes(t);
    if (n > max_payload_bytes - total) {
      bad("a payload over the link's limit of " + std::to_string(max_payload_bytes) + " bytes");
    }
    total += n;
    f.tensors.push_back(std::move(t));
  }
  if (head.inline_bytes != 0) {
    if (head.inline_bytes != total || total > frame_room(head.tensors, head.body_bytes)) {
      bad("an inline payload of " + std::to_string(head.inline_bytes) + " bytes for " +
          std::to_string(total) + " bytes of tensors");
    }
    f.payload.assign(reinterpret_cast<const char*>(bytes.data() + at + head.body_bytes),
                     head.inline_bytes);
  }
  return f;
}

}  // namespace ferry::hosts
