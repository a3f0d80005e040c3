// The ring: creating and attaching a channel's segment, push, pop and close. Every operation goes
// through the header's one robust lock (channel_lock.*) and commits with one store; its waits are
// channel_wait.*, the participants table channel_participants.cpp, the custody
// channel_custody.cpp (over custody_socket.*), and the bytes of the segment channel_layout.hpp.
#include "ipc/channel.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "ipc/channel_layout.hpp"
#include "ipc/channel_lock.hpp"
#include "ipc/channel_wait.hpp"
#include "ipc/custody_socket.hpp"
#include "ipc/error.hpp"
#include "ipc/log.hpp"
#include "ipc/peer_roles.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/spin_policy.hpp"
#include "ipc/step_times.hpp"

namespace ferry {

std::shared_ptr<Channel> Channel::create(const Options& options) {
  if (options.capacity == 0) {
    throw Error(Errc::invalid_argument, "channel capacity is 0; it must be at least 1 record");
  }
  if (options.record_size == 0) {
    throw Error(Errc::invalid_argument, "channel record_size is 0; it must be at least 1 byte");
  }
  const std::uint64_t record_size = (std::uint64_t{options.record_size} + 7) / 8 * 8;
  const std::uint64_t slot_size = ring::kSlotHeader + record_size;
  if (record_size > std::numeric_limits<std::uint32_t>::max() - ring::kSlotHeader) {
    throw Error(Errc::invalid_argument,
                "channel record_size " + std::to_string(options.record_size) + " is too large");
  }
  const std::uint64_t bytes = ring::kHeaderBytes + slot_size * options.capacity;

  auto segment = Segment::create(static_cast<std::size_t>(bytes));
  auto* h = new (segment->data()) Header{};
  h->version = ring::kVersion;
  h->capacity = options.capacity;
  h->record_size = static_cast<std::uint32_t>(record_size);
  h->slot_size = static_cast<std::uint32_t>(slot_size);
  h->max_messages = options.max_messages;

  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  int rc = pthread_mutex_init(&h->mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) throw_errno(Errc::system, "pthread_mutex_init for a channel", rc);

  h->custody_sweep_ns.store(ring::kNoSweep, std::memory_order_relaxed);

  // The magic goes in last so attach() never accepts a half-initialised header.
  h->magic.store(ring::kMagic, std::memory_order_release);
  UniqueFd custody = custody::make_socket();
  if (!custody) {
    // A channel without custody still works: its messages live only as long as their senders.
    ferry::log().debug("channel: no custody socket ({})", std::strerror(errno));
  }
  return std::shared_ptr<Channel>(new Channel(std::move(segment), std::move(custody)));
}

std::shared_ptr<Channel> Channel::attach(UniqueFd fd, UniqueFd custody) {
  if (custody && !custody::is_socket(custody.get())) {
    throw Error(Errc::invalid_argument, "fd " + std::to_string(custody.get()) +
                                            " is not a channel's custody socket (a Unix "
                                            "datagram socket connected to itself)");
  }
  auto segment = Segment::attach(std::move(fd), 0, /*keep_fd=*/true);
  const std::size_t size = segment->size();
  if (size < ring::kHeaderBytes) {
    throw Error(Errc::invalid_argument, "channel segment is " + std::to_string(size) +
                                            " bytes, smaller than a channel header (" +
                                            std::to_string(ring::kHeaderBytes) + " bytes)");
  }
  const auto* h = reinterpret_cast<const Header*>(segment->data());
  if (h->magic.load(std::memory_order_acquire) != ring::kMagic) {
    throw Error(Errc::invalid_argument, "the fd is not a ferry channel (bad magic)");
  }
  if (h->version != ring::kVersion) {
    throw Error(Errc::invalid_argument, "channel layout version " + std::to_string(h->version) +
                                            " is not the supported version " +
                                            std::to_string(ring::kVersion));
  }
  if (h->capacity == 0 || h->record_size == 0 || h->record_size % 8 != 0 ||
      h->slot_size != ring::kSlotHeader + h->record_size) {
    throw Error(Errc::invalid_argument, "channel header is corrupt: capacity " +
                                            std::to_string(h->capacity) + ", record_size " +
                                            std::to_string(h->record_size) + ", slot_size " +
                                            std::to_string(h->slot_size));
  }
  const std::uint64_t needed = ring::kHeaderBytes + std::uint64_t{h->slot_size} * h->capacity;
  if (size < needed) {
    throw Error(Errc::invalid_argument, "channel segment is " + std::to_string(size) +
                                            " bytes but capacity " + std::to_string(h->capacity) +
                                            " x slot " + std::to_string(h->slot_size) +
                                            " bytes needs " + std::to_string(needed));
  }
  return std::shared_ptr<Channel>(new Channel(std::move(segment), std::move(custody)));
}

Channel::Channel(std::shared_ptr<Segment> segment, UniqueFd custody)
    : segment_(std::move(segment)),
      custody_(std::move(custody)),
      custody_name_(custody_ ? custody::name_of(custody_.get()) : std::string()),
      push_spin_(SpinPolicy::ceiling_from_env()),
      pop_spin_(push_spin_.ceiling()) {}

Channel::~Channel() = default;

Channel::Header* Channel::header() const noexcept {
  return reinterpret_cast<Header*>(segment_->data());
}

std::byte* Channel::slot(std::uint64_t position) const noexcept {
  const Header* h = header();
  return segment_->data() + ring::kHeaderBytes + (position % h->capacity) * h->slot_size;
}

std::uint64_t Channel::push(const void* records, std::uint32_t count,
                            std::chrono::milliseconds timeout) {
  Header* h = header();
  if (count == 0 || count > h->capacity) {
    throw Error(Errc::invalid_argument, "push of " + std::to_string(count) +
                                            " records: a message holds 1 to capacity (" +
                                            std::to_string(h->capacity) + ") records");
  }
  register_role(kRoleProducer);
  const auto* src = static_cast<const std::byte*>(records);
  const ring::Deadline deadline(timeout);
  ring::PeerCheck peer_check;
  for (;;) {
    // Read before looking at the ring, so a pop between the look and the wait changes the word
    // and the wait returns at once.
    const std::uint32_t seen = h->not_full_seq.load(std::memory_order_acquire);
    bool pushed = false;
    std::uint64_t seq = 0;
    {
      ring::Lock lock(h, deadline, "push", timeout);
      if (h->closed.load(std::memory_order_acquire)) {
        throw Error(Errc::closed, "push on a closed channel");
      }
      const std::uint64_t head = h->head.load(std::memory_order_relaxed);
      const std::uint64_t tail = h->tail.load(std::memory_order_relaxed);
      const std::uint32_t messages = h->messages.load(std::memory_order_relaxed);
      const bool message_room = h->max_messages == 0 || messages < h->max_messages;
      if (message_room && h->capacity - (tail - head) >= count) {
        // Only slots past tail are written before the commit, so dying here publishes nothing.
        for (std::uint32_t i = 0; i < count; ++i) {
          std::byte* s = slot(tail + i);
          // The pusher tells a custody sweep whose segments this message may still need.
          const ring::SlotHead slot_head =
              i == 0 ? ring::SlotHead{count, current_pid()} : ring::SlotHead{0, 0};
          std::memcpy(s, &slot_head, sizeof slot_head);
          std::memcpy(s + ring::kSlotHeader, src + std::size_t{i} * h->record_size, h->record_size);
        }
        h->messages.store(messages + 1, std::memory_order_relaxed);
        h->tail.store(tail + count, std::memory_order_release);
        pushed = true;
        seq = tail;
      }
    }
    if (pushed) {
      ring::wake(&h->not_empty_seq, &h->empty_waiters, &h->not_empty_woken_ns);
      if (ring::now_and_then()) sweep_custody();
      return seq;
    }
    // Before the deadline: a wait that slept and runs out now still reports a death it sees.
    if (peer_check.due()) {
      sweep_custody();
      if (const auto gone = counterpart_gone(Waiting::push)) {
        throw Error(Errc::peer_dead,
                    "push: the queue is full and nothing will ever take from it: every other "
                    "process that held it, and could have popped, has exited: " +
                        *gone + "; their own output says why");
      }
    }
    if (deadline.passed()) {
      throw Error(
          Errc::timeout,
          "push of " + std::to_string(count) + " records timed out after " +
              ring::ms_text(timeout) + ": the channel (capacity " + std::to_string(h->capacity) +
              " records" +
              (h->max_messages ? ", " + std::to_string(h->max_messages) + " messages" : "") +
              ") stayed full; consumers are not keeping up: pop faster, add "
              "consumers, pass a longer timeout, or create the channel with a larger "
              "capacity");
    }
    const steps::Timed waiting("push: wait for room");
    ring::wait_for_change(&h->not_full_seq, &h->full_waiters, &h->not_full_woken_ns, seen,
                          deadline.slice(), push_spin_);
  }
}

std::uint32_t Channel::pop(std::vector<std::byte>& out, std::chrono::milliseconds timeout,
                           const Claim& claim) {
  Header* h = header();
  register_role(kRoleConsumer);
  const ring::Deadline deadline(timeout);
  ring::PeerCheck peer_check;
  for (;;) {
    const std::uint32_t seen = h->not_empty_seq.load(std::memory_order_acquire);
    std::uint32_t popped = 0;
    {
      ring::Lock lock(h, deadline, "pop", timeout);
      const std::uint64_t head = h->head.load(std::memory_order_relaxed);
      const std::uint64_t tail = h->tail.load(std::memory_order_relaxed);
      if (tail != head) {
        std::uint32_t count = 0;
        std::memcpy(&count, slot(head), sizeof count);
        if (count == 0 || count > tail - head) {
          throw Error(Errc::system, "channel ring is corrupt: the message at position " +
                                        std::to_string(head) + " claims " + std::to_string(count) +
                                        " records but " + std::to_string(tail - head) +
                                        " are queued");
        }
        out.resize(std::size_t{count} * h->record_size);
        for (std::uint32_t i = 0; i < count; ++i) {
          std::memcpy(out.data() + std::size_t{i} * h->record_size,
                      slot(head + i) + ring::kSlotHeader, h->record_size);
        }
        // A throwing claim propagates before the commit: the message stays for the next pop.
        if (claim) claim(out.data(), count, head);
        const std::uint32_t messages = h->messages.load(std::memory_order_relaxed);
        h->messages.store(messages > 0 ? messages - 1 : 0, std::memory_order_relaxed);
        h->head.store(head + count, std::memory_order_release);
        popped = count;
      } else if (h->closed.load(std::memory_order_acquire)) {
        throw Error(Errc::closed, "pop on a closed and drained channel");
      }
    }
    if (popped != 0) {
      ring::wake(&h->not_full_seq, &h->full_waiters, &h->not_full_woken_ns, popped);
      if (ring::now_and_then()) sweep_custody();
      return popped;
    }
    if (peer_check.due()) {
      sweep_custody();
      if (const auto gone = counterpart_gone(Waiting::pop)) {
        // A producer may have pushed its last message and exited after the ring was found
        // empty above: with every producer gone the ring can only have filled, so look again.
        if (h->tail.load(std::memory_order_acquire) != h->head.load(std::memory_order_acquire)) {
          continue;
        }
        throw Error(Errc::peer_dead,
                    "pop: the queue is empty and nothing more can come: every other process that "
                    "held it, and could have pushed, has exited: " +
                        *gone + "; their own output says why");
      }
    }
    if (deadline.passed()) {
      throw Error(Errc::timeout, "pop timed out after " + ring::ms_text(timeout) +
                                     ": the channel stayed empty; check that a producer is "
                                     "pushing, or pass a longer timeout (kForever to wait)");
    }
    const steps::Timed waiting("pop: wait for a message");
    ring::wait_for_change(&h->not_empty_seq, &h->empty_waiters, &h->not_empty_woken_ns, seen,
                          deadline.slice(), pop_spin_);
  }
}

void Channel::close() noexcept {
  Header* h = header();
  h->closed.store(1, std::memory_order_release);
  ring::wake_all(&h->not_empty_seq, &h->empty_waiters);
  ring::wake_all(&h->not_full_seq, &h->full_waiters);
}

bool Channel::closed() const noexcept {
  return header()->closed.load(std::memory_order_acquire) != 0;
}

bool Channel::consumed(std::uint64_t seq) const noexcept {
  return header()->head.load(std::memory_order_acquire) > seq;
}

std::uint32_t Channel::capacity() const noexcept {
  return header()->capacity;
}

std::uint32_t Channel::record_size() const noexcept {
  return header()->record_size;
}

std::uint32_t Channel::size() const noexcept {
  const Header* h = header();
  // Head first: tail only grows, so the difference is never negative; it can overshoot while
  // both move, hence the clamp.
  const std::uint64_t head = h->head.load(std::memory_order_acquire);
  const std::uint64_t tail = h->tail.load(std::memory_order_acquire);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(tail - head, h->capacity));
}

std::uint32_t Channel::messages() const noexcept {
  return std::min(header()->messages.load(std::memory_order_acquire), header()->capacity);
}

std::uint32_t Channel::max_messages() const noexcept {
  return header()->max_messages;
}

int Channel::fd() const noexcept {
  return segment_->fd();
}

}  // namespace ferry
