#include "runtime/tensor_queue.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "ipc/arena.hpp"
#include "ipc/env.hpp"
#include "ipc/log.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/stats.hpp"
#include "ipc/step_times.hpp"
#include "ipc/wire.hpp"
#include "runtime/receive_witness.hpp"
#include "runtime/transport/transport.hpp"
#include "runtime/transport_table.hpp"

namespace ferry {
namespace {

// At a normal exit, a process that sent tensors waits (FERRY_EXIT_LINGER_MS, default 2 s) only for
// what its queues' custody does not hold: once it is gone that memory cannot be fetched from it.
// The variable is read at the first send, where a bad value is that send's Error; a throw from
// the atexit handler would end the process in std::terminate.
std::atomic<std::int64_t> g_exit_linger_ms{2000};

void linger_at_exit() {
  const std::size_t waiting = flush_at_exit(std::chrono::milliseconds(g_exit_linger_ms.load()));
  if (waiting > 0) {
    log().warn(
        "exiting with {} sent tensor(s) never received; their receivers will get "
        "peer_dead (FERRY_EXIT_LINGER_MS sets how long to wait)",
        waiting);
  }
}

void register_linger_once() {
  static std::atomic<pid_t> registered{0};
  const pid_t me = current_pid();
  if (registered.load() == me) return;
  g_exit_linger_ms = exit_linger().count();
  if (registered.exchange(me) != me) std::atexit(linger_at_exit);
}
using detail::Claim;

std::atomic<detail::ReceiveWitness> g_witness{nullptr};

// The segments a message names, with the lease ledger (0) first, each once: a few inline, more
// (a message of many tensors from many segments) on the heap.
class SmallSegments {
 public:
  void add(std::uint32_t segment) {
    if (n_ == 0) push(0);
    for (std::size_t i = 0; i < n_; ++i) {
      if (at(i) == segment) return;
    }
    push(segment);
  }
  const std::uint32_t* data() const noexcept { return n_ <= kInline ? inline_ : more_.data(); }
  std::size_t size() const noexcept { return n_; }

 private:
  static constexpr std::size_t kInline = 8;
  std::uint32_t at(std::size_t i) const noexcept { return data()[i]; }
  void push(std::uint32_t segment) {
    if (n_ < kInline) {
      inline_[n_++] = segment;
      return;
    }
    if (n_ == kInline) more_.assign(inline_, inline_ + kInline);
    more_.push_back(segment);
    ++n_;
  }
  std::uint32_t inline_[kInline] = {};
  std::vector<std::uint32_t> more_;
  std::size_t n_ = 0;
};

// Inside the pop, while the records are still in the ring: each record's transport claims its
// lease and maps what it needs. A failure is noted in its Claim, reported after the pop.
void claim_records(const std::byte* bytes, std::uint32_t count, Channel& channel,
                   std::vector<Claim>& out) {
  if (const auto witness = g_witness.load(std::memory_order_relaxed)) {
    witness(reinterpret_cast<const wire::Record*>(bytes), count);
  }
  const pid_t me = current_pid();
  // A sender that exited left its segments in the queue's custody; the pop holds the ring lock
  // that reading it needs.
  const detail::CustodyLookup custody = [&channel](std::uint64_t token, std::uint32_t seq) {
    return channel.from_custody(token, seq);
  };
  out.assign(count, {});
  for (std::uint32_t i = 0; i < count; ++i) {
    Claim& c = out[i];
    std::memcpy(&c.record, bytes + std::size_t{i} * sizeof(wire::Record), sizeof(wire::Record));
    c.error = wire::validate(c.record);
    if (!c.error.empty() || (c.record.flags & wire::kFlagEmptyMessage)) continue;
    try {
      detail::transport(detail::choose(c.record)).claim(c, me, custody);
    } catch (const Error& e) {
      c.error = e.detail();
      c.code = e.code();
    } catch (const std::exception& e) {
      c.error = e.what();
      c.code = Errc::system;
    }
  }
}

// Tensors this process sent that no receiver has claimed yet, over every transport.
std::size_t in_flight() {
  std::size_t n = 0;
  for (const detail::Transport* t : detail::all_transports()) n += t->in_flight();
  return n;
}

}  // namespace

void detail::set_receive_witness(ReceiveWitness witness) noexcept {
  g_witness.store(witness);
}

std::size_t flush(std::chrono::milliseconds timeout) {
  const auto deadline = timeout.count() < 0 ? Clock::time_point::max() : Clock::now() + timeout;
  std::size_t waiting;
  while ((waiting = in_flight()) > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return waiting;
}

std::size_t flush_at_exit(std::chrono::milliseconds timeout) {
  const auto deadline = timeout.count() < 0 ? Clock::time_point::max() : Clock::now() + timeout;
  std::vector<detail::ExitWait> waits;
  for (const detail::Transport* t : detail::all_transports()) waits.push_back(t->at_exit());
  auto waiting = [&] {
    std::size_t n = 0;
    for (const detail::ExitWait& w : waits) n += w();
    return n;
  };
  std::size_t left;
  while ((left = waiting()) > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return left;
}

std::chrono::milliseconds exit_linger() {
  using std::chrono::milliseconds;
  return env::millis("FERRY_EXIT_LINGER_MS", milliseconds(2000), milliseconds(0),
                     std::chrono::hours(1));
}

TensorQueue::TensorQueue(std::shared_ptr<Channel> channel) : channel_(std::move(channel)) {
  channel_->hold_here();
  hold_ = std::shared_ptr<void>(channel_.get(), [ch = channel_](void*) { ch->let_go_here(); });
}

TensorQueue TensorQueue::create(const Options& options) {
  if (options.capacity == 0 || options.capacity > 65535) {
    throw Error(Errc::invalid_argument, "TensorQueue capacity " + std::to_string(options.capacity) +
                                            " is outside 1..65535");
  }
  Channel::Options co;
  co.capacity = options.capacity;
  co.record_size = sizeof(wire::Record);
  co.max_messages = options.max_messages;
  return TensorQueue(Channel::create(co));
}

TensorQueue TensorQueue::attach(int fd, bool announced, int custody_fd) {
  UniqueFd own(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!own)
    throw_errno(Errc::invalid_argument, "TensorQueue::attach(" + std::to_string(fd) + ")", errno);
  UniqueFd custody;
  if (custody_fd >= 0) {
    custody.reset(::fcntl(custody_fd, F_DUPFD_CLOEXEC, 0));
    if (!custody) {
      throw_errno(Errc::invalid_argument,
                  "TensorQueue::attach: custody fd " + std::to_string(custody_fd), errno);
    }
  }
  auto channel = Channel::attach(std::move(own), std::move(custody));
  if (channel->record_size() != sizeof(wire::Record)) {
    throw Error(Errc::invalid_argument, "fd " + std::to_string(fd) +
                                            " is a ferry channel of another record size (" +
                                            std::to_string(channel->record_size()) +
                                            "), not a TensorQueue of this version");
  }
  channel->hold(announced);
  return TensorQueue(std::move(channel));
}

SendReport TensorQueue::send(const Tensors& tensors, std::chrono::milliseconds timeout) {
  return send_message(tensors, nullptr, SendOptions{false, timeout});
}

SendReport TensorQueue::send(const Tensors& tensors, const SendOptions& options) {
  return send_message(tensors, nullptr, options);
}

SendReport TensorQueue::send_described(const std::function<at::Tensor(const SendReport&)>& describe,
                                       const Tensors& body, const SendOptions& options) {
  return send_message(body, &describe, options);
}

void TensorQueue::set_receiver(pid_t pid, int cuda_device) noexcept {
  receiver_pid_ = pid;
  receiver_device_ = cuda_device < 0 ? -1 : cuda_device;
}

SendReport TensorQueue::send_message(const Tensors& body,
                                     const std::function<at::Tensor(const SendReport&)>* describe,
                                     const SendOptions& options) {
  const steps::Timed step("send");
  const std::size_t first = describe ? 1 : 0;  // where body starts in the message
  const std::size_t tensors = body.size() + first;
  const std::size_t n = std::max<std::size_t>(tensors, 1);
  if (n > channel_->capacity()) {
    throw Error(Errc::invalid_argument, "a message of " + std::to_string(tensors) +
                                            " tensors does not fit a queue of capacity " +
                                            std::to_string(channel_->capacity()) +
                                            "; split it or create a larger queue");
  }
  Arena& arena = Arena::local();
  register_linger_once();

  std::vector<wire::Record> records(n);
  std::vector<std::pair<Ledger*, Ledger::Lease>> leases;  // in each transport's ledger
  leases.reserve(n);
  auto abandon = [&] {
    for (const auto& [l, lease] : leases) l->abandon(lease);
  };
  // The segments of this process's arena the records name, and its lease ledger (0), once each;
  // a message names one or two, so they are kept without a heap allocation.
  SmallSegments segments;
  const detail::SendContext ctx{arena, {receiver_pid_, receiver_device_}, options.detached};
  for (const detail::Transport* t : detail::all_transports()) t->before_send(ctx);
  SendReport report;  // body's tensors
  report.tensors.resize(body.size());
  SentTensor header;
  auto encode = [&](const at::Tensor& t, std::size_t i, SentTensor& sent) {
    const detail::Sending facts = detail::sending(t, options.detached);
    const detail::Carrier carrier = detail::choose(facts);
    detail::Outgoing o = detail::transport(carrier).encode(t, i, ctx);
    if (o.ledger) leases.emplace_back(o.ledger, o.lease);
    if (o.segment) segments.add(*o.segment);
    wire::Record& r = records[i];
    r = o.record;
    r.msg_index = static_cast<std::uint16_t>(i);
    r.msg_count = static_cast<std::uint16_t>(tensors);
    sent.copied = o.copied;
    sent.in_record = o.self_contained;
    sent.cuda = facts.cuda;
    sent.bytes = t.nbytes();
  };
  std::uint64_t seq;
  try {
    if (tensors == 0) {
      records[0] = wire::make_record();
      records[0].flags = wire::kFlagEmptyMessage;
    }
    for (std::size_t i = 0; i < body.size(); ++i) encode(body[i], first + i, report.tensors[i]);
    if (describe) encode((*describe)(report), 0, header);
    if (segments.size() != 0 && !channel_->entrusted(segments.data(), segments.size())) {
      // Before the push: once the message is in the ring, this process may die at any instant,
      // and the custody must already hold what the message needs. A refusal is logged and
      // counted there; the message then lives as long as this process.
      channel_->entrust(
          process_token(), segments.data(), segments.size(),
          [&arena](std::uint32_t seg) {
            const std::shared_ptr<Segment> s = arena.segment(seg);
            return s ? s->fd() : -1;
          },
          options.timeout);
    }
    const steps::Timed pushing("send: push");
    seq = channel_->push(records.data(), static_cast<std::uint32_t>(n), options.timeout);
  } catch (...) {
    abandon();
    throw;
  }
  for (const auto& [l, lease] : leases) l->route(lease, channel_, seq);
  for (const SentTensor& t : report.tensors) detail::count_sent(t);
  if (describe) detail::count_sent(header);
  detail::bump(detail::counters().messages_sent);
  return report;
}

Tensors TensorQueue::recv(std::chrono::milliseconds timeout) {
  const steps::Timed step("recv");
  for (const detail::Transport* t : detail::all_transports()) t->before_receive();
  std::vector<std::byte> bytes;
  std::vector<Claim> claimed;
  {
    const steps::Timed popping("recv: pop");
    channel_->pop(bytes, timeout, [&](const std::byte* recs, std::uint32_t count, std::uint64_t) {
      claim_records(recs, count, *channel_, claimed);
    });
  }

  // Build every tensor before reporting any failure: a tensor built owns its lease, so on error
  // the ones already built release theirs as `out` unwinds, and unclaimed ones are released here.
  Tensors out;
  out.reserve(claimed.size());
  std::string first_error;
  Errc first_code = Errc::bad_record;
  const pid_t me = current_pid();
  for (Claim& c : claimed) {
    const wire::Record& r = c.record;
    if (r.flags & wire::kFlagEmptyMessage) break;
    if (c.error.empty()) {
      try {
        out.push_back(detail::transport(detail::choose(r)).decode(c, me));
        detail::bump(detail::counters().tensors_received);
        detail::bump(detail::counters().bytes_received, out.back().nbytes());
        continue;
      } catch (const Error& e) {
        c.error = e.detail();
        c.code = e.code();
      }
    }
    // A claim that took the lease holds it in c.ledger (one whose record holds the bytes takes
    // none), and a decode that failed after handing it on has reset c.ledger.
    if (c.ledger) Ledger::release(*c.ledger, r.lease_slot, r.lease_gen, me);
    if (first_error.empty()) {
      first_error = c.error;
      first_code = c.code;
    }
  }
  if (!first_error.empty()) {
    log().warn("dropped a received message: {}", first_error);
    throw Error(first_code, "received message dropped: " + first_error);
  }
  detail::bump(detail::counters().messages_received);
  return out;
}

std::optional<Tensors> TensorQueue::try_recv(std::chrono::milliseconds timeout) {
  try {
    return recv(timeout);
  } catch (const Error& e) {
    if (e.code() == Errc::timeout) return std::nullopt;
    throw;
  }
}

void TensorQueue::announce() noexcept {
  channel_->announce();
}
bool TensorQueue::expire_announced(pid_t child) {
  return channel_->expire_announced(child);
}
void TensorQueue::hold(bool announced) {
  channel_->hold(announced);
}
void TensorQueue::close() noexcept {
  channel_->close();
}
bool TensorQueue::closed() const noexcept {
  return channel_->closed();
}

void TensorQueue::set_yielding(bool on) noexcept {
  channel_->set_yielding(on);
}

std::uint32_t TensorQueue::capacity() const noexcept {
  return channel_->capacity();
}
std::uint32_t TensorQueue::size() const noexcept {
  return channel_->size();
}
std::uint32_t TensorQueue::messages() const noexcept {
  return channel_->messages();
}
std::uint32_t TensorQueue::max_messages() const noexcept {
  return channel_->max_messages();
}
int TensorQueue::fd() const noexcept {
  return channel_->fd();
}
int TensorQueue::custody_fd() const noexcept {
  return channel_->custody_fd();
}

}  // namespace ferry
