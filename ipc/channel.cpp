// One file over the house's 500 lines, on purpose: the ring, its waits and the custody all go
// through the header's one robust lock and the push's one commit store, and channel.hpp's state
// machine is checked against them here, in one read. The custody is the part to move out first
// if the file grows.
#include "ipc/channel.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <limits>
#include <new>
#include <string>

#include "ipc/control_socket.hpp"
#include "ipc/error.hpp"
#include "ipc/futex.hpp"
#include "ipc/log.hpp"
#include "ipc/peer_roles.hpp"
#include "ipc/process.hpp"
#include "ipc/segment.hpp"
#include "ipc/spin_policy.hpp"
#include "ipc/step_times.hpp"

#if defined(__SANITIZE_THREAD__)
#define FERRY_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_UNDER_TSAN 1
#endif
#endif
#ifdef FERRY_UNDER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace ferry {
namespace {

constexpr std::uint64_t kMagic = 0x31484359'52524546ull;  // "FERRYCH1" little-endian
// 2: max_messages and the message count; 3: the wake-up stamps; 4: holders and announced
// children (ipc/peer_roles.hpp); 5: custody_until
constexpr std::uint32_t kVersion = 5;
constexpr std::size_t kParticipants = 32;
constexpr std::size_t kSlotHeader = 8;
// Waits are sliced so a waiter re-checks closing and peer death even if a wake is lost (a
// process killed between its commit and its wake never wakes anyone).
constexpr std::chrono::milliseconds kWaitSlice{100};
// Checking peers reads /proc, so a busy waiter does it at most this often.
constexpr std::chrono::milliseconds kPeerCheckInterval{100};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared atomics must be lock-free");

// A participant entry packs pid and roles in one word so it is claimed, extended and recycled
// with one compare-exchange: no reader ever sees a new pid with a previous owner's roles.
constexpr std::uint64_t pack(pid_t pid, std::uint32_t roles) {
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(pid)) |
         (static_cast<std::uint64_t>(roles) << 32);
}
constexpr pid_t pid_of(std::uint64_t entry) {
  return static_cast<pid_t>(static_cast<std::uint32_t>(entry));
}
constexpr std::uint32_t roles_of(std::uint64_t entry) {
  return static_cast<std::uint32_t>(entry >> 32);
}

std::string ms_text(std::chrono::milliseconds ms) {
  return std::to_string(ms.count()) + " ms";
}

// The layout at the start of the segment. Defined outside Channel so namespace-scope helpers can
// name it; Channel::Header is this type.
struct RingHeader {
  std::atomic<std::uint64_t> magic;  // written last, by a release store: see create()
  std::uint32_t version;
  std::uint32_t capacity;
  std::uint32_t record_size;   // already rounded up to 8
  std::uint32_t slot_size;     // kSlotHeader + record_size
  std::uint32_t max_messages;  // 0: unbounded
  pthread_mutex_t mutex;
  // head and tail are positions since creation; each changes only by the single commit store at
  // the end of a critical section.
  alignas(64) std::atomic<std::uint64_t> head;
  std::atomic<std::uint64_t> tail;
  // Messages between head and tail. Written under the lock just before the commit store, so a
  // process dying between the two leaves it off by one: the next locker recounts it from the
  // slots (recount_messages), which only committed state determines.
  std::atomic<std::uint32_t> messages;
  alignas(64) std::atomic<std::uint32_t> not_empty_seq;
  std::atomic<std::uint32_t> not_full_seq;
  // Processes asleep (or about to sleep) on each futex word: a wake is a syscall, so it is made
  // only when someone may be waiting. A waiter killed while counted costs spare wakes, never a
  // lost one.
  std::atomic<std::uint32_t> empty_waiters;
  std::atomic<std::uint32_t> full_waiters;
  // When a waker last called the kernel to wake sleepers on each word (steady clock, ns), so a
  // woken waiter learns how soon its answer came, not how long its own wake-up took (SpinPolicy).
  std::atomic<std::int64_t> not_empty_woken_ns;
  std::atomic<std::int64_t> not_full_woken_ns;
  std::atomic<std::uint32_t> closed;
  // Roles of dead participants whose entries were recycled: their death must still count.
  std::atomic<std::uint32_t> dead_roles;
  // Children handed the channel that have not attached yet (announce(), hold(true)).
  std::atomic<std::uint32_t> announced;
  // The head at which some deposit in the custody stops being needed (kNothingInCustody: none
  // is kept), so a pop looks at the custody only when one of them is due to go. Written under
  // the ring lock.
  std::atomic<std::uint64_t> custody_until;
  alignas(64) std::atomic<std::uint64_t> participants[kParticipants];
};

// The waker bumps the word then reads the waiter count; the waiter counts itself then lets the
// kernel compare the word. Both sequentially consistent, so either the waker sees the waiter or
// the waiter sees the new word and does not sleep. `count` waiters at most are woken: producers
// waiting for room get as many as the records a pop freed (more could not all fit; waking every
// one made many producers, the fan-in layout, fight over each slot: with 8, 1.5x the messages/s
// and a third of the p99 this way). A woken producer that finds too little room sleeps again at
// the back of the queue, so the next pop wakes another; a woken one that dies costs the others
// at most one wait slice.
// The stamp is written only on the way into the kernel: a waiter found polling measures its own
// wait, so the path without sleepers reads no clock.
void wake(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters,
          std::atomic<std::int64_t>* woken_ns,
          std::uint32_t count = std::numeric_limits<std::uint32_t>::max()) noexcept {
  word->fetch_add(1, std::memory_order_seq_cst);
  if (waiters->load(std::memory_order_seq_cst) != 0) {
    woken_ns->store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    futex_wake(word, count);
  }
}

void sleep_on(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters,
              std::uint32_t seen, std::chrono::nanoseconds slice) noexcept {
  waiters->fetch_add(1, std::memory_order_seq_cst);
  futex_wait(word, seen, slice);
  waiters->fetch_sub(1, std::memory_order_seq_cst);
}

// Waits for `word` to move from `seen`: polls it for as long as `spin` allows, then sleeps in
// the kernel for at most `slice`. A waiter found while polling is not counted asleep, so its waker
// makes no futex call either. How soon the answer came teaches `spin` the next budget.
void wait_for_change(std::atomic<std::uint32_t>* word, std::atomic<std::uint32_t>* waiters,
                     const std::atomic<std::int64_t>* woken_ns, std::uint32_t seen,
                     std::chrono::nanoseconds slice, SpinPolicy& spin) noexcept {
  const Clock::time_point start = Clock::now();
  if (spin_until_changed(*word, seen, std::min(spin.budget(), slice))) {
    spin.record(Clock::now() - start);
    return;
  }
  sleep_on(word, waiters, seen, slice);
  const Clock::time_point woken_at{Clock::duration(woken_ns->load(std::memory_order_acquire))};
  spin.record(answered_after(start, woken_at, Clock::now()));
}

constexpr std::size_t kHeaderBytes = (sizeof(RingHeader) + 63) / 64 * 64;

// The messages between head and tail, read from the first slot of each (its record count).
// Called with the lock held, after a previous owner died holding it.
void recount_messages(RingHeader* h) noexcept {
  const auto* slots = reinterpret_cast<const std::byte*>(h) + kHeaderBytes;
  const std::uint64_t tail = h->tail.load(std::memory_order_relaxed);
  std::uint64_t at = h->head.load(std::memory_order_relaxed);
  std::uint32_t n = 0;
  while (at < tail) {
    std::uint32_t count = 0;
    std::memcpy(&count, slots + (at % h->capacity) * h->slot_size, sizeof count);
    if (count == 0) break;  // corrupt: pop reports it
    at += count;
    ++n;
  }
  h->messages.store(n, std::memory_order_relaxed);
}

// Deadline arithmetic shared by push and pop; kForever (any negative timeout) never expires.
class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds timeout)
      : forever_(timeout.count() < 0),
        at_(Clock::now() + std::max(timeout, std::chrono::milliseconds(0))) {}
  bool passed() const { return !forever_ && Clock::now() >= at_; }
  std::chrono::nanoseconds slice() const {
    if (forever_) return kWaitSlice;
    return std::clamp<std::chrono::nanoseconds>(at_ - Clock::now(), std::chrono::nanoseconds(0),
                                                kWaitSlice);
  }

 private:
  bool forever_;
  Clock::time_point at_;
};

// Takes `mutex` unless `slice` passes first (ETIMEDOUT). ThreadSanitizer must see the lock taken
// to see what it guards, and GCC 12's does not intercept pthread_mutex_clocklock (glibc 2.30),
// so under TSan the same robust mutex is taken by pthread_mutex_timedlock, which every TSan
// sees, against the wall clock: a clock step only stretches one slice, the deadline stays the
// steady clock's. TSan's timedlock records only a plain success, so a lock that comes with
// EOWNERDEAD (held all the same) is told to it.
int lock_for(pthread_mutex_t* mutex, std::chrono::nanoseconds slice) {
#ifdef FERRY_UNDER_TSAN
  constexpr clockid_t kClock = CLOCK_REALTIME;
#else
  constexpr clockid_t kClock = CLOCK_MONOTONIC;
#endif
  timespec until{};
  clock_gettime(kClock, &until);
  until.tv_nsec += static_cast<long>(slice.count());
  until.tv_sec += until.tv_nsec / 1'000'000'000;
  until.tv_nsec %= 1'000'000'000;
#ifdef FERRY_UNDER_TSAN
  const int rc = pthread_mutex_timedlock(mutex, &until);
  if (rc == EOWNERDEAD) {
    __tsan_mutex_pre_lock(mutex, __tsan_mutex_try_lock);
    __tsan_mutex_post_lock(mutex, __tsan_mutex_try_lock, 0);
  }
  return rc;
#else
  return pthread_mutex_clocklock(mutex, kClock, &until);
#endif
}

// Holds the ring mutex; a previous owner's death is repaired on the way in, which is sound
// because an owner that dies before its commit store has changed nothing a reader can see.
//
// The lock is taken in timed slices, not with a plain pthread_mutex_lock: an unlock wakes a
// single waiter and clears the waiters bit, so if that waiter is SIGKILLed before it takes the
// lock, and another process takes and releases it meanwhile, the remaining waiters are never
// woken. A sliced wait turns that lost wake-up into a delay of at most one slice.
class RingLock {
 public:
  RingLock(RingHeader* h, const Deadline& deadline, const char* op,
           std::chrono::milliseconds timeout)
      : mutex_(&h->mutex) {
    int rc;
    for (;;) {
      rc = lock_for(mutex_, kWaitSlice);
      if (rc != ETIMEDOUT) break;
      if (deadline.passed()) {
        throw Error(Errc::timeout, std::string(op) + " timed out after " + ms_text(timeout) +
                                       " waiting for the channel lock, which another process "
                                       "holds (a slow claim callback?); pass a longer timeout");
      }
    }
    if (rc == EOWNERDEAD) {
      ferry::log().debug("channel: a process died holding the ring lock; recovered");
      rc = pthread_mutex_consistent(mutex_);
      if (rc != 0) {
        pthread_mutex_unlock(mutex_);
        throw_errno(Errc::system, "pthread_mutex_consistent on the channel lock", rc);
      }
      recount_messages(h);
    } else if (rc == ENOTRECOVERABLE) {
      throw Error(Errc::system,
                  "the channel lock is unrecoverable (a previous owner died and its recovery "
                  "failed); create a new channel");
    } else if (rc != 0) {
      throw_errno(Errc::system, "pthread_mutex_clocklock on the channel lock", rc);
    }
  }
  ~RingLock() {
    if (int rc = pthread_mutex_unlock(mutex_); rc != 0) {
      ferry::log().error("channel: unlocking the ring lock failed: {}", std::strerror(rc));
    }
  }
  RingLock(const RingLock&) = delete;
  RingLock& operator=(const RingLock&) = delete;

 private:
  pthread_mutex_t* mutex_;
};

// Throttles the /proc reads of the peer-death check. The first check comes after the first
// sleep, not before it: a waiter that a message wakes (the common case) never pays for one,
// which at a few syscalls each dominated a round trip; a dead peer is noticed one slice later.
class PeerCheck {
 public:
  bool due() {
    auto now = Clock::now();
    if (!started_) {
      started_ = true;
      next_ = now;
      return false;
    }
    if (now < next_) return false;
    next_ = now + kPeerCheckInterval;
    return true;
  }

 private:
  bool started_ = false;
  Clock::time_point next_{};
};

constexpr std::uint64_t kNothingInCustody = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t kDepositMagic = 0x54534f4359525246ull;  // "FRRYCOST"
// SCM_MAX_FD is 253: a sender with more segments than this leaves several deposits.
constexpr std::size_t kMaxFdsPerDeposit = 250;

// One datagram in the custody socket: this, then `count` segment numbers, with `count` fds.
struct DepositHead {
  std::uint64_t magic;
  std::uint64_t owner_token;
  std::uint64_t last_seq;
  std::int32_t owner_pid;
  std::uint32_t count;
};

struct Deposit {
  DepositHead head{};
  std::vector<std::uint32_t> segments;
  std::vector<UniqueFd> fds;
};

// A Unix datagram socket connected to itself: whoever holds it sends to its own queue and reads
// from it; a datagram from any other socket is refused (EPERM), so only the channel's holders
// can deposit. Its autobound abstract name exists only to connect to; it goes with the socket.
UniqueFd make_custody_socket() {
  UniqueFd s(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  socklen_t len = sizeof(sa_family_t);  // autobind
  if (!s || ::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return UniqueFd();
  len = sizeof addr;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return UniqueFd();
  }
  return s;
}

bool is_custody_socket(int fd) {
  int type = 0;
  socklen_t type_len = sizeof type;
  sockaddr_un self{}, peer{};
  socklen_t self_len = sizeof self, peer_len = sizeof peer;
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_DGRAM &&
         ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
         ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
         self.sun_family == AF_UNIX && self_len == peer_len &&
         std::memcmp(&self, &peer, self_len) == 0;
}

// Never blocks: a full custody is a failed deposit (the owner then stays), not a wait.
bool send_deposit(int sock, const DepositHead& head, const std::uint32_t* segments,
                  const int* fds) {
  iovec iov[2] = {{const_cast<DepositHead*>(&head), sizeof head},
                  {const_cast<std::uint32_t*>(segments), head.count * sizeof(std::uint32_t)}};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFdsPerDeposit * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(head.count * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(head.count * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds, head.count * sizeof(int));
  const std::size_t bytes = sizeof head + head.count * sizeof(std::uint32_t);
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(bytes)) {
    ferry::log().warn("channel custody: cannot keep segments of pid {}: {}", head.owner_pid,
                      n < 0 ? std::strerror(errno) : "short send");
    return false;
  }
  return true;
}

bool send_deposit(int sock, const Deposit& d) {
  std::vector<int> fds;
  for (const UniqueFd& fd : d.fds) fds.push_back(fd.get());
  return send_deposit(sock, d.head, d.segments.data(), fds.data());
}

// Every deposit in the custody, taken out of it: the caller holds the ring lock and sends back
// what is still needed. A malformed datagram, or one whose fds this process had no room for, is
// dropped (its messages then fail as their sender's death would have them fail). `*drained`:
// nothing is left unread.
std::vector<Deposit> take_deposits(int sock, bool* drained) {
  std::vector<Deposit> out;
  *drained = true;
  for (;;) {
    Deposit d;
    d.segments.resize(kMaxFdsPerDeposit);
    iovec iov[2] = {{&d.head, sizeof d.head},
                    {d.segments.data(), d.segments.size() * sizeof(std::uint32_t)}};
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxFdsPerDeposit * sizeof(int))];
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ferry::log().warn("channel custody: reading it failed: {}", std::strerror(errno));
        *drained = false;
      }
      return out;
    }
    take_passed_fds(msg, d.fds);
    const bool whole =
        static_cast<std::size_t>(n) >= sizeof d.head && d.head.magic == kDepositMagic &&
        d.head.count <= kMaxFdsPerDeposit &&
        static_cast<std::size_t>(n) == sizeof d.head + d.head.count * sizeof(std::uint32_t) &&
        d.fds.size() == d.head.count && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0;
    if (!whole) {
      ferry::log().warn("channel custody: dropped a deposit{} (out of file descriptors?)",
                        static_cast<std::size_t>(n) >= sizeof d.head
                            ? " of pid " + std::to_string(d.head.owner_pid)
                            : std::string());
      continue;
    }
    d.segments.resize(d.head.count);
    out.push_back(std::move(d));
  }
}

}  // namespace

CustodyPlan plan_custody(const std::vector<QueuedLease>& leases, std::uint64_t head) {
  CustodyPlan plan;
  for (const QueuedLease& l : leases) {
    if (!custody_needed(l.seq, head)) continue;
    plan.last_seq = plan.segments.empty() ? l.seq : std::max(plan.last_seq, l.seq);
    plan.segments.push_back(l.segment);
  }
  if (plan.segments.empty()) return plan;
  // The lease ledger: a receiver claims each lease there before it maps the block.
  plan.segments.push_back(0);
  std::sort(plan.segments.begin(), plan.segments.end());
  plan.segments.erase(std::unique(plan.segments.begin(), plan.segments.end()), plan.segments.end());
  return plan;
}

bool custody_needed(std::uint64_t last_seq, std::uint64_t head) noexcept {
  return last_seq >= head;
}

struct Channel::Header : RingHeader {};

std::shared_ptr<Channel> Channel::create(const Options& options) {
  if (options.capacity == 0) {
    throw Error(Errc::invalid_argument, "channel capacity is 0; it must be at least 1 record");
  }
  if (options.record_size == 0) {
    throw Error(Errc::invalid_argument, "channel record_size is 0; it must be at least 1 byte");
  }
  const std::uint64_t record_size = (std::uint64_t{options.record_size} + 7) / 8 * 8;
  const std::uint64_t slot_size = kSlotHeader + record_size;
  if (record_size > std::numeric_limits<std::uint32_t>::max() - kSlotHeader) {
    throw Error(Errc::invalid_argument,
                "channel record_size " + std::to_string(options.record_size) + " is too large");
  }
  const std::uint64_t bytes = kHeaderBytes + slot_size * options.capacity;

  auto segment = Segment::create(static_cast<std::size_t>(bytes));
  auto* h = new (segment->data()) Header{};
  h->version = kVersion;
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

  h->custody_until.store(kNothingInCustody, std::memory_order_relaxed);

  // The magic goes in last so attach() never accepts a half-initialised header.
  h->magic.store(kMagic, std::memory_order_release);
  UniqueFd custody = make_custody_socket();
  if (!custody) {
    // A channel without custody still works: its senders wait at exit instead.
    ferry::log().debug("channel: no custody socket ({})", std::strerror(errno));
  }
  return std::shared_ptr<Channel>(new Channel(std::move(segment), std::move(custody)));
}

std::shared_ptr<Channel> Channel::attach(UniqueFd fd, UniqueFd custody) {
  if (custody && !is_custody_socket(custody.get())) {
    throw Error(Errc::invalid_argument, "fd " + std::to_string(custody.get()) +
                                            " is not a channel's custody socket (a Unix "
                                            "datagram socket connected to itself)");
  }
  auto segment = Segment::attach(std::move(fd), 0, /*keep_fd=*/true);
  const std::size_t size = segment->size();
  if (size < kHeaderBytes) {
    throw Error(Errc::invalid_argument, "channel segment is " + std::to_string(size) +
                                            " bytes, smaller than a channel header (" +
                                            std::to_string(kHeaderBytes) + " bytes)");
  }
  const auto* h = reinterpret_cast<const Header*>(segment->data());
  if (h->magic.load(std::memory_order_acquire) != kMagic) {
    throw Error(Errc::invalid_argument, "the fd is not a ferry channel (bad magic)");
  }
  if (h->version != kVersion) {
    throw Error(Errc::invalid_argument, "channel layout version " + std::to_string(h->version) +
                                            " is not the supported version " +
                                            std::to_string(kVersion));
  }
  if (h->capacity == 0 || h->record_size == 0 || h->record_size % 8 != 0 ||
      h->slot_size != kSlotHeader + h->record_size) {
    throw Error(Errc::invalid_argument, "channel header is corrupt: capacity " +
                                            std::to_string(h->capacity) + ", record_size " +
                                            std::to_string(h->record_size) + ", slot_size " +
                                            std::to_string(h->slot_size));
  }
  const std::uint64_t needed = kHeaderBytes + std::uint64_t{h->slot_size} * h->capacity;
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
      push_spin_(SpinPolicy::ceiling_from_env()),
      pop_spin_(push_spin_.ceiling()) {}

Channel::~Channel() = default;

Channel::Header* Channel::header() const noexcept {
  return reinterpret_cast<Header*>(segment_->data());
}

std::byte* Channel::slot(std::uint64_t position) const noexcept {
  const Header* h = header();
  return segment_->data() + kHeaderBytes + (position % h->capacity) * h->slot_size;
}

// Adds `role` to `pid`'s entry in the participants table, taking a free entry, or one of a dead
// process, when it has none. False when every entry is held by a live process.
bool Channel::enter(pid_t pid, std::uint32_t role) {
  auto& table = header()->participants;
  for (auto& e : table) {
    std::uint64_t v = e.load(std::memory_order_acquire);
    while (pid_of(v) == pid) {
      if (e.compare_exchange_weak(v, pack(pid, roles_of(v) | role))) return true;
    }
  }
  for (auto& e : table) {
    std::uint64_t v = 0;
    if (e.compare_exchange_strong(v, pack(pid, role))) return true;
  }
  for (auto& e : table) {
    std::uint64_t v = e.load(std::memory_order_acquire);
    if (v == 0 || pid_of(v) == pid || process_alive(pid_of(v))) continue;
    // Published before the entry is recycled so a waiter never loses sight of that death.
    header()->dead_roles.fetch_or(roles_of(v));
    if (e.compare_exchange_strong(v, pack(pid, role))) return true;
  }
  return false;
}

void Channel::register_role(std::uint32_t role) {
  const pid_t self = current_pid();
  // A forked child inherits this object but is a different participant.
  if (registered_pid_.load(std::memory_order_relaxed) != self) {
    registered_roles_.store(0, std::memory_order_relaxed);
    registered_pid_.store(self, std::memory_order_relaxed);
  }
  if (registered_roles_.load(std::memory_order_relaxed) & role) return;
  if (!enter(self, role)) {
    if (role == kRoleHolder) {
      // Every child forked while a Python queue exists holds it, most never use it: no warning
      // for them. One that acts later tries again for its role, and warns then.
      ferry::log().debug("channel: no participant entry free for holder {}", self);
    } else {
      ferry::log().warn(
          "channel: all {} participant entries are held by live processes; process {} is not "
          "registered, so peers waiting on it will time out rather than see peer_dead if it "
          "dies",
          kParticipants, self);
    }
  }
  registered_roles_.fetch_or(role, std::memory_order_relaxed);  // do not rescan every time
}

void Channel::hold(bool announced) {
  register_role(kRoleHolder);
  if (!announced) return;
  // Clamped at zero: a hold that no announce() counted must not hide another child's.
  auto& count = header()->announced;
  std::uint32_t n = count.load(std::memory_order_acquire);
  while (n != 0 && !count.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
  }
}

void Channel::announce() noexcept {
  header()->announced.fetch_add(1, std::memory_order_acq_rel);
}

bool Channel::expire_announced(pid_t child) {
  if (child <= 0 || process_alive(child)) return false;
  for (const auto& e : header()->participants) {
    if (pid_of(e.load(std::memory_order_acquire)) == child) return false;  // it arrived
  }
  auto& count = header()->announced;
  std::uint32_t n = count.load(std::memory_order_acquire);
  do {
    if (n == 0) return false;
  } while (!count.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel));
  // It was handed the channel and could have acted on either side: its death counts as a
  // holder's, and waiters name it.
  if (!enter(child, kRoleHolder)) header()->dead_roles.fetch_or(kRoleHolder);
  return true;
}

std::optional<std::string> Channel::counterpart_gone(Waiting waiting) const {
  const pid_t self = current_pid();
  const Header* h = header();
  const std::uint32_t needed = waiting == Waiting::pop ? kMayPush : kMayPop;
  std::uint32_t self_roles = 0;
  if (registered_pid_.load(std::memory_order_relaxed) == self) {
    self_roles = registered_roles_.load(std::memory_order_relaxed);
  }
  std::vector<Participant> others;
  std::vector<pid_t> pids;
  others.reserve(kParticipants);
  for (const auto& e : h->participants) {
    const std::uint64_t v = e.load(std::memory_order_acquire);
    if (v == 0) continue;
    if (pid_of(v) == self) {
      self_roles |= roles_of(v);  // another Channel object of this process, or this one
      continue;
    }
    // Liveness reads /proc, so it is asked only where the rule looks at it (a process that
    // may act on the other side).
    const bool matters = (capabilities(roles_of(v)) & needed) != 0;
    others.push_back({roles_of(v), matters && process_alive(pid_of(v))});
    pids.push_back(pid_of(v));
  }
  const std::uint32_t dead_roles = h->dead_roles.load(std::memory_order_acquire);
  if (!ferry::counterpart_gone(waiting, self_roles, others, dead_roles,
                               h->announced.load(std::memory_order_acquire))) {
    return std::nullopt;
  }
  // Who could have served the waiter, and how each ended.
  std::string who;
  for (std::size_t i = 0; i < others.size(); ++i) {
    if ((capabilities(others[i].roles) & needed) == 0) continue;
    const std::uint32_t r = others[i].roles;
    const char* did = (r & (kRoleProducer | kRoleConsumer)) == 0   ? "held it"
                      : (r & kRoleProducer) && (r & kRoleConsumer) ? "pushed and popped"
                      : (r & kRoleProducer)                        ? "pushed"
                                                                   : "popped";
    if (!who.empty()) who += ", ";
    who += "pid " + std::to_string(pids[i]) + " (" + did + "; " + describe_exit(pids[i]) + ")";
  }
  if (dead_roles != 0 && (capabilities(dead_roles) & needed) != 0) {
    who += std::string(who.empty() ? "" : ", ") + "others whose places in the table were reused";
  }
  return who;
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
  const Deadline deadline(timeout);
  PeerCheck peer_check;
  for (;;) {
    // Read before looking at the ring, so a pop between the look and the wait changes the word
    // and the wait returns at once.
    const std::uint32_t seen = h->not_full_seq.load(std::memory_order_acquire);
    bool pushed = false;
    std::uint64_t seq = 0;
    {
      RingLock lock(h, deadline, "push", timeout);
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
          const std::uint32_t slot_count = i == 0 ? count : 0;
          std::memcpy(s, &slot_count, sizeof slot_count);
          std::memcpy(s + kSlotHeader, src + std::size_t{i} * h->record_size, h->record_size);
        }
        h->messages.store(messages + 1, std::memory_order_relaxed);
        h->tail.store(tail + count, std::memory_order_release);
        pushed = true;
        seq = tail;
      }
    }
    if (pushed) {
      wake(&h->not_empty_seq, &h->empty_waiters, &h->not_empty_woken_ns);
      return seq;
    }
    // Before the deadline: a wait that slept and runs out now still reports a death it sees.
    if (peer_check.due()) {
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
          "push of " + std::to_string(count) + " records timed out after " + ms_text(timeout) +
              ": the channel (capacity " + std::to_string(h->capacity) + " records" +
              (h->max_messages ? ", " + std::to_string(h->max_messages) + " messages" : "") +
              ") stayed full; consumers are not keeping up: pop faster, add "
              "consumers, pass a longer timeout, or create the channel with a larger "
              "capacity");
    }
    const steps::Timed waiting("push: wait for room");
    wait_for_change(&h->not_full_seq, &h->full_waiters, &h->not_full_woken_ns, seen,
                    deadline.slice(), push_spin_);
  }
}

std::uint32_t Channel::pop(std::vector<std::byte>& out, std::chrono::milliseconds timeout,
                           const Claim& claim) {
  Header* h = header();
  register_role(kRoleConsumer);
  const Deadline deadline(timeout);
  PeerCheck peer_check;
  for (;;) {
    const std::uint32_t seen = h->not_empty_seq.load(std::memory_order_acquire);
    std::uint32_t popped = 0;
    {
      RingLock lock(h, deadline, "pop", timeout);
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
          std::memcpy(out.data() + std::size_t{i} * h->record_size, slot(head + i) + kSlotHeader,
                      h->record_size);
        }
        // A throwing claim propagates before the commit: the message stays for the next pop.
        if (claim) claim(out.data(), count, head);
        const std::uint32_t messages = h->messages.load(std::memory_order_relaxed);
        h->messages.store(messages > 0 ? messages - 1 : 0, std::memory_order_relaxed);
        h->head.store(head + count, std::memory_order_release);
        popped = count;
        // After the commit: dying before it must leave the deposits this message needs.
        if (custody_ && head + count >= h->custody_until.load(std::memory_order_relaxed)) {
          sort_custody_locked(head + count);
        }
      } else if (h->closed.load(std::memory_order_acquire)) {
        throw Error(Errc::closed, "pop on a closed and drained channel");
      }
    }
    if (popped != 0) {
      wake(&h->not_full_seq, &h->full_waiters, &h->not_full_woken_ns, popped);
      return popped;
    }
    if (peer_check.due()) {
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
      throw Error(Errc::timeout, "pop timed out after " + ms_text(timeout) +
                                     ": the channel stayed empty; check that a producer is "
                                     "pushing, or pass a longer timeout (kForever to wait)");
    }
    const steps::Timed waiting("pop: wait for a message");
    wait_for_change(&h->not_empty_seq, &h->empty_waiters, &h->not_empty_woken_ns, seen,
                    deadline.slice(), pop_spin_);
  }
}

void Channel::close() noexcept {
  Header* h = header();
  h->closed.store(1, std::memory_order_release);
  h->not_empty_seq.fetch_add(1, std::memory_order_release);
  h->not_full_seq.fetch_add(1, std::memory_order_release);
  futex_wake_all(&h->not_empty_seq);
  futex_wake_all(&h->not_full_seq);
}

bool Channel::closed() const noexcept {
  return header()->closed.load(std::memory_order_acquire) != 0;
}

bool Channel::deposit(pid_t owner_pid, std::uint64_t owner_token,
                      const std::vector<QueuedLease>& leases,
                      const std::function<int(std::uint32_t segment)>& fd_of,
                      std::chrono::milliseconds timeout) {
  if (!custody_) return false;
  Header* h = header();
  try {
    RingLock lock(h, Deadline(timeout), "deposit", timeout);
    const pid_t self = current_pid();
    if (deposited_by_ != self) {
      deposited_by_ = self;
      deposited_until_ = 0;
    }
    std::vector<QueuedLease> fresh;
    for (const QueuedLease& l : leases) {
      if (l.seq >= deposited_until_) fresh.push_back(l);
    }
    const CustodyPlan plan = plan_custody(fresh, h->head.load(std::memory_order_relaxed));
    if (plan.segments.empty()) return true;
    std::vector<int> fds;
    for (std::uint32_t seg : plan.segments) {
      const int fd = fd_of(seg);
      if (fd < 0) return false;
      fds.push_back(fd);
    }
    for (std::size_t at = 0; at < fds.size(); at += kMaxFdsPerDeposit) {
      const auto count = static_cast<std::uint32_t>(std::min(kMaxFdsPerDeposit, fds.size() - at));
      const DepositHead head{kDepositMagic, owner_token, plan.last_seq, owner_pid, count};
      // A deposit sent before a later one failed is dropped in time like any other.
      if (!send_deposit(custody_.get(), head, plan.segments.data() + at, fds.data() + at)) {
        return false;
      }
    }
    h->custody_until.store(
        std::min(h->custody_until.load(std::memory_order_relaxed), plan.last_seq + 1),
        std::memory_order_relaxed);
    deposited_until_ = plan.last_seq + 1;
    ferry::log().debug("channel custody: left {} segment(s) until message {}", fds.size(),
                       plan.last_seq);
    return true;
  } catch (const Error& e) {
    ferry::log().warn("channel custody: {}", e.detail());
    return false;
  }
}

UniqueFd Channel::from_custody(std::uint64_t owner_token, std::uint32_t segment) {
  if (!custody_) return UniqueFd();
  return sort_custody_locked(header()->head.load(std::memory_order_relaxed), owner_token, segment);
}

UniqueFd Channel::sort_custody_locked(std::uint64_t head, std::uint64_t owner_token,
                                      std::uint32_t segment) {
  UniqueFd found;
  bool drained;
  std::vector<Deposit> deposits = take_deposits(custody_.get(), &drained);
  // What could not be read is looked at again by the next pop.
  std::uint64_t until = drained ? kNothingInCustody : head + 1;
  for (Deposit& d : deposits) {
    if (!custody_needed(d.head.last_seq, head)) continue;  // its fds close here
    if (!found && owner_token != 0 && d.head.owner_token == owner_token) {
      for (std::size_t i = 0; i < d.segments.size(); ++i) {
        if (d.segments[i] == segment) {
          found = UniqueFd(::fcntl(d.fds[i].get(), F_DUPFD_CLOEXEC, 0));
          break;
        }
      }
    }
    if (send_deposit(custody_.get(), d)) until = std::min(until, d.head.last_seq + 1);
  }
  header()->custody_until.store(until, std::memory_order_relaxed);
  return found;
}

int Channel::custody_fd() const noexcept {
  return custody_.get();
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
