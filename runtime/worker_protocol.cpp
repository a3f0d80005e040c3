#include "runtime/worker_protocol.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "ipc/error.hpp"
#include "ipc/wire.hpp"

namespace ferry::protocol {
namespace {

using nlohmann::json;

// Envelope words: [magic, kind, ...]. The magic catches a message that was never an envelope.
constexpr std::int64_t kEnvelopeMagic = 0x46525259454e56;  // "FRRYENV"
constexpr std::int64_t kTaskKind = 1;
constexpr std::int64_t kResultKind = 2;
constexpr std::int64_t kTaskWords = 8;
constexpr std::int64_t kResultWords = 9;

template <typename T>
T parse(const std::string& bytes, const char* what, T (*from)(const json&)) {
  try {
    return from(json::parse(bytes));
  } catch (const json::exception& e) {
    throw Error(Errc::handshake, std::string("malformed ") + what + " on the control socket (" +
                                     e.what() + "); supervisor and worker must be the same ferry");
  }
}

Hello hello_from(const json& j) {
  Hello h;
  h.version = j.at("version").get<int>();
  h.supervisor_pid = j.at("supervisor_pid").get<pid_t>();
  h.worker_id = j.at("worker_id").get<int>();
  h.device = j.at("device").get<std::string>();
  h.threads = j.at("threads").get<int>();
  // value(), not at(): a hello of an older version must reach the version check, which names it.
  h.shared_allocations = j.value("shared_allocations", false);
  h.config = j.at("config").get<std::map<std::string, std::string>>();
  h.shared = j.at("shared").get<std::vector<std::string>>();
  return h;
}

Welcome welcome_from(const json& j) {
  Welcome w;
  w.version = j.at("version").get<int>();
  w.pid = j.at("pid").get<pid_t>();
  w.device = j.at("device").get<std::string>();
  w.tasks = j.at("tasks").get<std::vector<std::string>>();
  w.error = j.at("error").get<std::string>();
  return w;
}

const std::int64_t* words(const at::Tensor& t, std::int64_t kind, std::int64_t count) {
  if (!t.defined() || t.scalar_type() != at::kLong || t.dim() != 1 || t.numel() != count ||
      !t.is_contiguous() || !t.device().is_cpu()) {
    throw Error(Errc::bad_record, "a message's first tensor is not a ferry envelope");
  }
  const std::int64_t* w = t.data_ptr<std::int64_t>();
  if (w[0] != kEnvelopeMagic || w[1] != kind) {
    throw Error(Errc::bad_record, "a message's envelope has the wrong magic or kind");
  }
  return w;
}

}  // namespace

std::string encode(const Hello& h) {
  return json{{"version", h.version},     {"supervisor_pid", h.supervisor_pid},
              {"worker_id", h.worker_id}, {"device", h.device},
              {"threads", h.threads},     {"config", h.config},
              {"shared", h.shared},       {"shared_allocations", h.shared_allocations}}
      .dump();
}

std::string encode(const Welcome& w) {
  return json{{"version", w.version},
              {"pid", w.pid},
              {"device", w.device},
              {"tasks", w.tasks},
              {"error", w.error}}
      .dump();
}

Hello decode_hello(const std::string& bytes) {
  return parse<Hello>(bytes, "hello", hello_from);
}

Welcome decode_welcome(const std::string& bytes) {
  return parse<Welcome>(bytes, "welcome", welcome_from);
}

namespace {

// An envelope's tensor: this thread's own, written again for each message while nobody holds
// the last one. An envelope travels inside its record, copied there by the send, so its tensor
// is free again once the send returns; a fresh one per message cost a 64-byte-aligned
// allocation and its free, past glibc's per-thread cache, for each task on each side.
template <std::int64_t Words>
at::Tensor envelope_tensor() {
  thread_local at::Tensor kept;
  if (!kept.defined() || kept.use_count() != 1 || kept.storage().use_count() != 1) {
    kept = at::empty({Words}, at::kLong);
  }
  return kept;
}

}  // namespace

// Envelopes are ordinary tensors small enough to travel inside their records (64 and 72 bytes):
// no arena block, lease or mapping per task, and no copy in the statistics.
at::Tensor pack(const TaskEnvelope& e) {
  static_assert(kResultWords * 8 <= wire::kInlineBytes, "an envelope fits a record");
  at::Tensor t = envelope_tensor<kTaskWords>();
  std::int64_t* w = t.data_ptr<std::int64_t>();
  w[0] = kEnvelopeMagic;
  w[1] = kTaskKind;
  w[2] = static_cast<std::int64_t>(e.task_id);
  w[3] = e.attempt;
  w[4] = e.task_index;
  w[5] = static_cast<std::int64_t>(e.prelude);
  w[6] = e.prelude_tensors;
  w[7] = static_cast<std::int64_t>(e.forget);
  return t;
}

at::Tensor pack(const ResultEnvelope& e) {
  at::Tensor t = envelope_tensor<kResultWords>();
  std::int64_t* w = t.data_ptr<std::int64_t>();
  w[0] = kEnvelopeMagic;
  w[1] = kResultKind;
  w[2] = static_cast<std::int64_t>(e.task_id);
  w[3] = static_cast<std::int64_t>(e.attempt) | (e.ok ? std::int64_t{1} << 32 : 0);
  w[4] = static_cast<std::int64_t>(e.tensors_zero_copy);
  w[5] = static_cast<std::int64_t>(e.bytes_zero_copy);
  w[6] = static_cast<std::int64_t>(e.tensors_copied);
  w[7] = static_cast<std::int64_t>(e.bytes_copied);
  w[8] = e.detail_pieces;
  return t;
}

TaskEnvelope unpack_task(const at::Tensor& t) {
  const std::int64_t* w = words(t, kTaskKind, kTaskWords);
  TaskEnvelope e;
  e.task_id = static_cast<std::uint64_t>(w[2]);
  e.attempt = static_cast<std::uint32_t>(w[3]);
  e.task_index = static_cast<std::uint32_t>(w[4]);
  e.prelude = static_cast<std::uint64_t>(w[5]);
  if (w[6] < 0 || w[6] > static_cast<std::int64_t>(kMaxTensorsPerTask) ||
      (w[6] > 0 && e.prelude == 0)) {
    throw Error(Errc::bad_record, "a task envelope says its prelude takes " + std::to_string(w[6]) +
                                      " tensors (prelude id " + std::to_string(e.prelude) + ")");
  }
  e.prelude_tensors = static_cast<std::uint32_t>(w[6]);
  e.forget = static_cast<std::uint64_t>(w[7]);
  return e;
}

ResultEnvelope unpack_result(const at::Tensor& t) {
  const std::int64_t* w = words(t, kResultKind, kResultWords);
  ResultEnvelope e;
  e.task_id = static_cast<std::uint64_t>(w[2]);
  e.attempt = static_cast<std::uint32_t>(w[3] & 0xffffffff);
  e.ok = (w[3] >> 32) & 1;
  e.tensors_zero_copy = static_cast<std::uint64_t>(w[4]);
  e.bytes_zero_copy = static_cast<std::uint64_t>(w[5]);
  e.tensors_copied = static_cast<std::uint64_t>(w[6]);
  e.bytes_copied = static_cast<std::uint64_t>(w[7]);
  if (w[8] < 0 || w[8] > static_cast<std::int64_t>(kMaxDetailPieces)) {
    throw Error(Errc::bad_record, "a result envelope says its detail takes " +
                                      std::to_string(w[8]) + " pieces (at most " +
                                      std::to_string(kMaxDetailPieces) + ")");
  }
  e.detail_pieces = static_cast<std::uint32_t>(w[8]);
  return e;
}

namespace {

// `bytes` in pieces of at most one record's inline room; empty bytes are one empty piece.
std::vector<at::Tensor> pieces(const std::string& bytes) {
  const std::size_t piece = wire::kInlineBytes;
  std::vector<at::Tensor> out;
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(piece, bytes.size() - at);
    at::Tensor t = at::empty({static_cast<std::int64_t>(n)}, at::kByte);
    if (n > 0) std::memcpy(t.data_ptr(), bytes.data() + at, n);
    out.push_back(std::move(t));
    at += n;
  } while (at < bytes.size());
  return out;
}

}  // namespace

std::vector<at::Tensor> text_tensors(const std::string& text, std::size_t room) {
  const std::size_t piece = wire::kInlineBytes;
  room = std::clamp<std::size_t>(room, 1, kMaxTensorsPerTask);
  if (text.size() <= piece * room) return pieces(text);
  // The note is at most one piece long; what is kept leaves room for it.
  const std::size_t kept = piece * (room - 1);
  const std::string note = " ... (" + std::to_string(text.size() - kept) + " more bytes cut)";
  return pieces(text.substr(0, kept) + note);
}

bool detail_needs_shared_memory(const std::string& detail) noexcept {
  return detail.size() > wire::kInlineBytes * kMaxDetailPieces;
}

std::vector<at::Tensor> detail_tensors(const std::string& detail) {
  if (detail.empty()) return {};
  if (!detail_needs_shared_memory(detail)) return pieces(detail);
  at::Tensor all = at::empty({static_cast<std::int64_t>(detail.size())}, at::kByte);
  std::memcpy(all.data_ptr(), detail.data(), detail.size());
  return {std::move(all)};
}

std::string tensors_text(const std::vector<at::Tensor>& message, std::size_t from, std::size_t to) {
  std::string text;
  for (std::size_t i = from; i < std::min(to, message.size()); ++i) {
    const at::Tensor& t = message[i];
    if (!t.defined() || t.scalar_type() != at::kByte || t.dim() != 1 || !t.is_contiguous()) {
      throw Error(Errc::bad_record, "an error message tensor is not a 1-d uint8 tensor");
    }
    text.append(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.numel()));
  }
  return text;
}

}  // namespace ferry::protocol
